"""The hub's state wing: the store, the in-memory cache over it, the device writer,
the projector, device sessions, and the repositories kept beside them."""
