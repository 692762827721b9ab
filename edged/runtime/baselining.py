"""The worker security in force: edged.toml's settings under the SecurityBaselines edged last
accepted (docs/security.md).

The accepted baselines are persisted (``state/baselines.py``) and loaded before any worker
starts, so a restart runs its workers under the same baselines before the manifests directory
is read or the hub is heard from. :meth:`SecurityInForce.accept` takes the baselines of each
accepted merge of the sources; when the security they make differs, it is persisted, logged,
and ``on_change`` hears of it (workers whose sandbox changed restart, the ingress follows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from edged.runtime.securing import DeviceSecurity
from edged.state.baselines import load_baselines, save_baselines
from edgefleet.api import SecurityBaseline
from edgefleet.logs import get_logger

log = get_logger(__name__)


class SecurityInForce:
    def __init__(
        self,
        configured: DeviceSecurity,
        path: Path,
        *,
        on_change: Callable[[DeviceSecurity], None],
    ) -> None:
        """``configured``: edged.toml's settings; ``path``: where the accepted baselines are
        kept (:class:`edgefleet.errors.StateError` when that is not a baselines file);
        ``on_change(security)``: the security in force changed."""
        self._path = path
        self._on_change = on_change
        self.current = configured.with_baselines(load_baselines(path))

    def __call__(self) -> DeviceSecurity:
        """The security in force now."""
        return self.current

    def accept(self, baselines: Sequence[SecurityBaseline]) -> None:
        """The baselines of an accepted merge of the sources."""
        security = self.current.with_baselines(baselines)
        if security == self.current:
            return
        self.current = security
        save_baselines(self._path, baselines)
        log.info(
            "security baselines accepted",
            baselines=",".join(security.baselines),
            require_sandbox=security.require_sandbox,
        )
        self._on_change(security)
