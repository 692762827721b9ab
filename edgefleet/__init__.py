"""edgefleet's gRPC APIs: the stubs generated from proto/ (see scripts/gen-proto)."""
