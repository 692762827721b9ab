"""The SecurityBaselines edged last accepted, in ``<data-dir>/state/baselines.json``.

Loaded before any worker starts, so a restart (kill -9, reboot) runs its workers under the
same baselines before the manifests directory is read or the hub is heard from.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from edged.state import formats
from edgefleet.api import SecurityBaseline
from edgefleet.api.baselines import parse_security_baseline
from edgefleet.errors import StateError, ValidationError
from edgefleet.persisting import read_json, write_json_atomic

NAME = "state/baselines.json"  # its formats: edged.state.formats
FORMAT = formats.FORMATS[NAME].writes


def load_baselines(path: Path) -> tuple[SecurityBaseline, ...]:
    """The persisted baselines (none when the file is not there); :class:`StateError` when
    it is not a baselines file: edged does not guess at weaker security."""
    doc = read_json(path)
    if doc is None:
        return ()
    try:
        if not formats.readable(NAME, doc["format"]):
            raise ValueError(
                f"format {doc['format']!r}, reads {sorted(formats.FORMATS[NAME].reads)}"
            )
        return tuple(parse_security_baseline(b) for b in doc["baselines"])
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise StateError(f"{path} is not a baselines file: {exc}") from None


def save_baselines(path: Path, baselines: Sequence[SecurityBaseline]) -> None:
    """Written atomically (temporary file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        path,
        {"format": formats.write_format(NAME), "baselines": [b.to_dict() for b in baselines]},
    )
