"""The version of edgefleet, the one number its programs (edged, hub, edgectl) report: the
installed distribution's (``pyproject.toml``), read with importlib.metadata."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "edgefleet"
UNKNOWN_VERSION = "0+unknown"
"""What a checkout that was never installed (no distribution metadata) reports."""


def installed_version() -> str:
    """The version of the installed ``edgefleet`` distribution; :data:`UNKNOWN_VERSION` when
    there is none (the packages run straight from a source tree)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION


def version_text(program: str) -> str:
    """``PROGRAM VERSION``, what ``--version`` prints: ``edgectl 0.1.0``."""
    return f"{program} {installed_version()}"
