"""python-tuf's metadata cache, kept whole across a kill -9 or a power cut at any moment.

python-tuf's ``Updater`` (6.x, 7.x) keeps every root it trusted in ``root_history/N.root.json``
and makes ``root.json`` a symlink to the newest. At every start of an ``Updater`` (a device
makes one per refresh) and after every root update, it *removes* ``root.json`` and then makes
the link again: killed between the two, the cache holds no ``root.json``. A device then holds
no TUF root; its trust state says it accepted one, so it refuses every artifact
(``TrustStateLost``) until an operator resets its trust. Seed 62's 1-hour soak run found it
(docs/soak.md): ``dev-1``'s edged, its data directory on a slow disk, killed -9 in that gap.
Upstream knows it (python-tuf pull request 3010, "ngclient: Update root.json link atomically",
open as of December 2026; this module can go once a release has it).
python-tuf also writes its files without ``fsync``: after a power cut a renamed file may be
empty.

:func:`updater_class` is ``Updater`` with both made safe: the link is made under another
name and renamed over ``root.json`` (a rename is atomic: the old link or the new one, never
none), and every file is written with :func:`edgefleet.persisting.write_atomic` (temp file,
fsync, rename, fsync of the directory). :func:`restore_root` mends a cache that the unsafe
way already broke: ``root.json`` missing or dangling while ``root_history/`` holds the roots
python-tuf verified, the newest linked again (what python-tuf itself would have linked).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

from edgefleet.persisting import fsync_dir, write_atomic

ROOT = "root.json"
HISTORY = "root_history"
_HISTORY_FILE = re.compile(r"([1-9][0-9]{0,9})\.root\.json")


def link_root(directory: Path, version: int) -> None:
    """``directory/root.json`` -> ``root_history/VERSION.root.json``, by one rename."""
    link = directory / ROOT
    temp = directory / f".{ROOT}.{os.getpid()}.link"
    temp.unlink(missing_ok=True)
    os.symlink(os.path.join(HISTORY, f"{version}.root.json"), temp)
    os.replace(temp, link)
    fsync_dir(directory)


def restore_root(directory: Path) -> int | None:
    """When ``root.json`` is missing or dangling, link it to the newest root of
    ``root_history/`` that parses as a TUF root of that version; the version linked, or None
    when nothing was done (``root.json`` is there, or no root to restore)."""
    from tuf.api.metadata import Root as TufRoot

    from edgefleet.errors import EdgefleetError
    from edgefleet.trust import tufmeta

    if (directory / ROOT).exists():  # follows the link: a dangling one is missing
        return None
    try:
        names = [p.name for p in (directory / HISTORY).iterdir()]
    except OSError:
        return None
    versions = sorted(
        (int(m.group(1)) for n in names if (m := _HISTORY_FILE.fullmatch(n))), reverse=True
    )
    for version in versions:
        try:
            data = (directory / HISTORY / f"{version}.root.json").read_bytes()
            root, _ = tufmeta.parse(data, TufRoot, what=f"{HISTORY}/{version}.root.json")
        except (OSError, EdgefleetError):
            continue  # torn or foreign: an older one may do
        if int(root.version) == version:
            link_root(directory, version)
            return version
    return None


@functools.cache
def updater_class() -> Any:
    """python-tuf's ``Updater`` with its cache written whole (module doc); made once."""
    from tuf.ngclient import Updater

    class WholeCacheUpdater(Updater):
        def _update_root_symlink(self) -> None:
            link_root(Path(self._dir), self._trusted_set.root.version)

        def _persist_file(self, filename: str, data: bytes) -> None:
            write_atomic(Path(filename), data, mode=0o600)

    # the two methods replaced must still be python-tuf's way of writing the cache: a later
    # python-tuf that renamed them would write it its own way again, unnoticed
    for name in ("_update_root_symlink", "_persist_file"):
        if not callable(getattr(Updater, name, None)):
            raise RuntimeError(f"python-tuf's Updater has no {name}: edgefleet.trust.tufcache")
    return WholeCacheUpdater
