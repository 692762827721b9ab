"""The fleet trust roots the hub carries to devices: the current root and the ones before it.

The hub cannot make a root (it holds no root key in production) and devices never take its
word for one: every root they accept chains from the root in their image, or the one they
pinned at enrollment, signed by a threshold of the old and of the new root keys. The hub only
distributes, and checks what it distributes so that an operator's mistake is caught here
rather than on every device.

Files in the hub's data directory::

    D/trust-root.json              the current root, exactly as signed
    D/trust-roots/<version>.json   every earlier root the hub held (written at each rotation)

**Rotation**: replace ``D/trust-root.json`` with the next root (``edgectl trust root rotate``,
then ``sign`` with the old root keys), atomically (write beside it, then rename). The running
hub notices it within :data:`WATCH_PERIOD_S` (:class:`RootWatcher`), checks that it follows the
current root (:func:`edgefleet.trust.verifying.follow_roots`), keeps the previous root in
``D/trust-roots/``, and re-projects every device: the roots travel in each device's desired
state (``DesiredState.trust_roots``), so connected devices get them at once and the others
when they come back. A root that does not follow is refused (logged, an event), and the hub
keeps carrying the roots it had; at the next start such a file stops the hub.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgefleet.errors import HubDirError, TrustError
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic
from edgefleet.supervising import wait_for_stop
from edgefleet.trust.documents import Root, parse_root
from edgefleet.trust.envelopes import ROOT_TYPE, Envelope, decode_payload, parse_envelope_bytes
from edgefleet.trust.verifying import (
    follow_roots,
    root_digest,
    verify_initial_root,
    verify_root_update,
)
from hub.state.cache import Cache
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

ROOT_FILE = "trust-root.json"
HISTORY_DIR = "trust-roots"
MAX_ROOTS = 1000  # what a device accepts in one message
MAX_ROOT_BYTES = 256 * 1024
WATCH_PERIOD_S = 2.0


@dataclass(frozen=True, slots=True)
class HubRoots:
    """The roots, oldest first, as signed; empty when the hub has none."""

    chain: tuple[bytes, ...]

    @property
    def current(self) -> bytes:
        return self.chain[-1] if self.chain else b""

    def enrollment_bytes(self) -> bytes:
        """What EnrollResponse.trust_root carries: the root, or the chain as a JSON list."""
        if len(self.chain) <= 1:
            return self.current
        import orjson

        return orjson.dumps([orjson.loads(c) for c in self.chain])


def _parse(data: bytes, what: str) -> tuple[Envelope, Root]:
    env = parse_envelope_bytes(data, what=what)
    return env, parse_root(decode_payload(env, expected_type=ROOT_TYPE, what=what), what=what)


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        data = f.read(MAX_ROOT_BYTES + 1)
    if len(data) > MAX_ROOT_BYTES:
        raise TrustError("MalformedEnvelope", f"{path}: larger than {MAX_ROOT_BYTES} bytes")
    return data


def load_roots(data_dir: Path) -> HubRoots:
    """The hub's roots at start; HubDirError when they do not form a chain (each version the
    one before + 1, signed by the old and the new root thresholds) ending at the current
    root. Without history the chain is the current root alone."""
    current = data_dir / ROOT_FILE
    if not current.exists():
        return HubRoots(())
    try:
        data = _read(current)
        _, root = _parse(data, str(current))
        older: list[tuple[int, bytes]] = []
        history = data_dir / HISTORY_DIR
        if history.is_dir():
            for p in history.glob("*.json"):
                raw = _read(p)
                _, r = _parse(raw, str(p))
                if r.version < root.version:
                    older.append((r.version, raw))
        older.sort()
        older = older[-(MAX_ROOTS - 1) :]
        chain = [raw for _, raw in older] + [data]
        _check_chain(chain)
    except (TrustError, OSError) as exc:
        raise HubDirError(f"the hub's trust roots ({data_dir}): {exc}") from None
    return HubRoots(tuple(chain))


def _check_chain(chain: list[bytes]) -> None:
    """Each root follows the one before it (signatures checked; expiry is the devices' job)."""
    previous: Root | None = None
    for i, data in enumerate(chain):
        env, root = _parse(data, f"root {i}")
        if previous is not None:
            verify_root_update(previous, env, what=f"root version {root.version}")
        previous = root


def adopt_root(data_dir: Path, roots: HubRoots, data: bytes, *, now: float) -> HubRoots | None:
    """``data`` (the new content of ``D/trust-root.json``) as the next root(s): None when it
    is the current root again; TrustError when it does not follow the current root. Keeps
    the previous current root in ``D/trust-roots/<version>.json``."""
    if not roots.chain:
        env, _ = _parse(data, ROOT_FILE)
        verify_initial_root(env, now, what=ROOT_FILE)
        return HubRoots((data,))
    cur_env, cur_root = _parse(roots.current, "the current root")
    env, _ = _parse(data, ROOT_FILE)
    if root_digest(env) == root_digest(cur_env):
        return None
    known = {}
    for raw in roots.chain:
        e, r = _parse(raw, "a root")
        known[r.version] = root_digest(e)
    update = follow_roots(cur_root, known, [env], now, what=ROOT_FILE)
    if not update.changed:
        return None
    history = data_dir / HISTORY_DIR
    history.mkdir(exist_ok=True, mode=0o755)
    write_atomic(history / f"{cur_root.version}.json", roots.current, mode=0o644)
    chain = (*roots.chain, data)[-MAX_ROOTS:]
    return HubRoots(chain)


def root_pin(root: bytes) -> str:
    """``sha256:<payload digest>`` of the hub's current root (``HubRoots.current``), or ""
    without one."""
    if not root:
        return ""
    try:
        env, _ = _parse(root, ROOT_FILE)
    except TrustError:
        return ""
    return f"sha256:{root_digest(env)}"


def install_roots(cache: Cache, roots: HubRoots) -> None:
    """Make ``roots`` what the hub verifies pushes with, enrolls with and sends."""
    cache.set_trust_roots(roots.chain)


class RootWatcher:
    """The component that adopts a rotated ``D/trust-root.json`` (module doc)."""

    name = "trust-roots"

    def __init__(
        self,
        data_dir: Path,
        cache: Cache,
        writer: DeviceWriter,
        roots: HubRoots,
        *,
        clock: Callable[[], float] = time.time,
        period_s: float = WATCH_PERIOD_S,
    ):
        self._data_dir = data_dir
        self._cache = cache
        self._writer = writer
        self._clock = clock
        self.roots = roots
        self._period = period_s
        self._seen: tuple[int, int, int] | None = self._stat()

    @property
    def path(self) -> Path:
        return self._data_dir / ROOT_FILE

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def check(self) -> bool:
        """Look at the file once; whether the roots changed."""
        seen = self._stat()
        if seen == self._seen or seen is None:
            return False
        self._seen = seen
        try:
            data = _read(self.path)
            new = adopt_root(self._data_dir, self.roots, data, now=self._clock())
        except (TrustError, OSError) as exc:
            reason = exc.reason if isinstance(exc, TrustError) else "RootUnreadable"
            log.error("trust root refused", file=str(self.path), reason=reason, error=str(exc))
            self._writer.event("TrustRoot", "fleet", "Warning", "TrustRootRefused", str(exc))
            return False
        if new is None:
            return False
        self.roots = new
        install_roots(self._cache, new)
        _, root = _parse(new.current, ROOT_FILE)
        log.info("trust root rotated", version=root.version, roots=len(new.chain))
        self._writer.event(
            "TrustRoot",
            "fleet",
            "Normal",
            "TrustRootRotated",
            f"trust root version {root.version} adopted; sent to every device",
        )
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.check()  # a stat; a small read when it changed
            if await wait_for_stop(stop, self._period):
                return
