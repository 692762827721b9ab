"""The hub's decisions: pure functions over plain snapshots (no gRPC, no store, no
clock of their own), tested as tables."""
