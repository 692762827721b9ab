"""The hub's API wing: gRPC and HTTP servicers. A handler parses, authorizes and calls
a service or writes through the state wing; it never drives a controller."""
