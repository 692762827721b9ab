"""The component that adopts a new TUF root or top-level targets in ``D/tuf/`` (``hub tuf
install``, or files an operator replaced) while the hub runs.

Every :data:`WATCH_PERIOD_S` it looks at ``D/tuf/root.json`` and ``D/tuf/targets.json``; when
either changed, the repository is loaded again and checked as at start
(:class:`hub.state.tufrepo.TufRepository`: the root chain, the online key in it, the targets signed
by the targets keys). A repository that does not hold together is refused (logged, an event
``TufRepositoryRefused``) and the hub keeps serving the one it had; devices check everything
again anyway. Connected devices read the new files at their next desired state.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from edgefleet.errors import HubDirError
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from hub.config import TufLifetimes
from hub.state.heldtuf import HeldTuf
from hub.state.tufrepo import TUF_DIR, TufRepository
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

WATCH_PERIOD_S = 2.0
WATCHED = ("root.json", "targets.json")


class TufWatcher:
    name = "tuf-repository"

    def __init__(
        self,
        data_dir: Path,
        held: HeldTuf,
        writer: DeviceWriter,
        *,
        signing: bool,
        lifetimes: TufLifetimes,
        period_s: float = WATCH_PERIOD_S,
    ) -> None:
        """``held``: what the hub serves, replaced by a new repository; ``signing``: the
        repository signs its timestamp and snapshot here (not at replicas sharing it:
        :mod:`hub.state.sharedtuf`); ``lifetimes``: hub.toml's ``[tuf]``."""
        self._data_dir = data_dir
        self._held = held
        self._writer = writer
        self._signing = signing
        self._lifetimes = lifetimes
        self._period = period_s
        self._seen = self._stat()

    def _stat(self) -> tuple[tuple[int, int, int] | None, ...]:
        d = self._data_dir / TUF_DIR
        out: list[tuple[int, int, int] | None] = []
        for name in WATCHED:
            try:
                st = (d / name).stat()
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except FileNotFoundError:
                out.append(None)
        return tuple(out)

    def check(self) -> bool:
        """Look at the files once; whether a new repository was adopted."""
        seen = self._stat()
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            repo = TufRepository.load(self._data_dir, signing=self._signing, **self._lifetimes)
        except HubDirError as exc:
            log.error("tuf repository refused", error=str(exc))
            self._writer.event(
                "TufRepository", "fleet", "Warning", "TufRepositoryRefused", str(exc)
            )
            return False
        if repo is None:
            return False
        version = repo.root.version
        log.info("tuf repository adopted", root_version=version)
        self._writer.event(
            "TufRepository",
            "fleet",
            "Normal",
            "TufRepositoryAdopted",
            f"TUF root version {version} and targets version {repo.targets.version} adopted",
        )
        self._held.adopt(repo)  # the change feed projects every device again
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.check()  # stats; a load (a few signature checks) only when a file changed
            if await wait_for_stop(stop, self._period):
                return
