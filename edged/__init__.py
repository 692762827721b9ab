"""edged: the edgefleet device daemon."""

__version__ = "0.1.0"
