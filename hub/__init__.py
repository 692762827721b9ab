"""hub: the edgefleet regional control plane (not built yet: see docs/architecture.md)."""
