"""edgectl: the operator's command line."""
