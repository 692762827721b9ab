"""The version of edgefleet, the one number its programs (edged, hub, edgectl) report.

Where it comes from, first found:

1. the ``pyproject.toml`` of the source tree the packages run from (a checkout, or an editable
   install of one: its ``project.version``, so that a checkout run with ``PYTHONPATH`` reports
   its own version, not that of another tree installed in the venv, and a version bump is seen
   before the venv is reinstalled);
2. the installed distribution's metadata, read with importlib.metadata: the Debian package's
   venv, or an agent release's ``lib/edgefleet-VERSION.dist-info`` (docs/agent-updates.md),
   whichever comes first on ``sys.path``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

DISTRIBUTION = "edgefleet"
UNKNOWN_VERSION = "0+unknown"
"""What a tree that is neither a checkout nor installed (no distribution metadata) reports."""

_TREE = Path(__file__).resolve().parent.parent  # the sys.path entry edgefleet/ was found in


def source_tree_version(tree: Path = _TREE) -> str | None:
    """``project.version`` of ``tree/pyproject.toml`` when ``tree`` is an edgefleet source tree
    (its ``project.name`` is edgefleet); None otherwise."""
    try:
        project = tomllib.loads((tree / "pyproject.toml").read_text()).get("project", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    if not isinstance(project, dict) or project.get("name") != DISTRIBUTION:
        return None
    version = project.get("version")
    return version if isinstance(version, str) else None


def installed_version() -> str:
    """The version of edgefleet running now (the module doc); :data:`UNKNOWN_VERSION` when
    there is none."""
    tree = source_tree_version()
    if tree is not None:
        return tree
    from importlib import metadata  # here: importing it costs ~2 MiB (docs/edged.md)

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION


def version_text(program: str) -> str:
    """``PROGRAM VERSION``, what ``--version`` prints: ``edgectl 0.2.0``."""
    return f"{program} {installed_version()}"
