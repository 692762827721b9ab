"""hub: the edgefleet regional control plane (``hub init``, ``hub serve``, ``hub token``).

One module per job, named for it; the design is in docs/architecture.md, "The hub".
"""
