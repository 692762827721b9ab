"""hub: the edgefleet regional control plane (``hub init``, ``hub serve``, ``hub token``).

In wings: ``api`` (servicers), ``controllers``, ``state``, ``decide`` (pure); the folder says
the role, the file the subject. The wings are in docs/architecture.md ("The hub's wings"), the
details in docs/hub.md.
"""
