"""The hub link's pure parts: what the device reports, its protobuf mapping, the reconnect
backoff. Real workloads (parsed manifests) and real generated stubs; no channel, no hub (the
link itself runs against a real hub in tests/e2e/test_hub_fleet.py)."""
