"""Package ``edgefleet.v1``: generated from proto/edgefleet/v1 by scripts/gen-proto. Do not edit."""
