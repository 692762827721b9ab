"""``edged check``: can this edged run on this device, with this config and this state? The
smoke test of a new release before the switch (docs/agent-updates.md, "On the device"), run
from the new slot against the running edged's config and data directory.

Read-only: it takes no lock (the running edged holds it), writes nothing, starts nothing. It
loads the config, reads every state file this release must read (edged.state.formats), the
launcher's state, and imports the daemon and the worker (everything the release runs, onnxruntime
included). The answer is one JSON line and the exit status: 0, or 1 with a CamelCase reason.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class CheckResult:
    ok: bool
    reason: str = ""
    message: str = ""
    version: str = ""

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "reason": self.reason, "message": self.message,
                "version": self.version}  # fmt: skip


def check(config_path: Path | None, data_dir: Path | None) -> CheckResult:
    from edged import __version__

    holder: dict[str, object] = {}

    def config() -> None:
        from edged.config import ServiceDirs, load_config

        holder["config"] = load_config(
            config_path, data_dir=data_dir, service=ServiceDirs.from_environ(os.environ)
        )

    def state() -> None:
        from edged.config import EdgedConfig
        from edged.state.baselines import load_baselines
        from edged.state.desired import DesiredState
        from edged.state.hubstate import load_hub_state

        cfg = holder["config"]
        assert isinstance(cfg, EdgedConfig)
        data = Path(cfg.paths.data_dir)
        DesiredState(data / "state" / "desired.json").load()
        load_baselines(data / "state" / "baselines.json")
        load_hub_state(data / "state" / "hub.json")

    def runtime() -> None:
        for module in ("edged.daemon", "edged.runtime.worker", "onnxruntime"):
            importlib.import_module(module)

    steps: list[tuple[str, Callable[[], object]]] = [
        ("ConfigInvalid", config),
        ("StateUnreadable", state),
        ("RuntimeImportFailed", runtime),
    ]
    for reason, step in steps:
        try:
            step()
        except Exception as exc:  # any failure is the answer, with its reason
            return CheckResult(False, reason, f"{type(exc).__name__}: {exc}"[:1000], __version__)
    return CheckResult(True, version=__version__)
