"""hub: the edgefleet regional control plane (``hub init``, ``hub serve``, ``hub token``).

One module per job, named for it; the wings are in docs/architecture.md ("The hub's wings"), the details in docs/hub.md.
"""
