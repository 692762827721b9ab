"""edged: the edgefleet device daemon."""

from edgefleet.versioning import installed_version

__version__ = installed_version()
