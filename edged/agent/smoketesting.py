"""The smoke test of an installed release before the switch: the new slot's edged runs
``edged check`` (edged.agent.checking) against the running edged's config and data directory,
bounded in time and output. A release that fails it is never tried (``SmokeTestFailed``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from edged.agent.installing import InstallRefused

SMOKE_TIMEOUT_S = 120.0
_NOT_PASSED = ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "EDGED_TRIAL")
MAX_OUTPUT_BYTES = 64 << 10


def slot_environ(environ: Mapping[str, str], lib: Path | None, data_dir: Path) -> dict[str, str]:
    """``environ`` with ``lib`` first on PYTHONPATH, in place of any slot's (the running
    edged's own slot is on it when it runs from one); None: the package."""
    slots = str(data_dir / "agent" / "slots") + os.sep
    paths = [
        p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and not p.startswith(slots)
    ]
    env = {k: v for k, v in environ.items() if k not in _NOT_PASSED}
    env["PYTHONPATH"] = os.pathsep.join(([str(lib)] if lib else []) + paths)
    return env


async def smoke_test(
    slot_root: Path,
    version: str,
    *,
    data_dir: Path,
    config_path: Path | None,
    python: str = sys.executable,
    timeout_s: float = SMOKE_TIMEOUT_S,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Run the slot's ``edged check``; :class:`InstallRefused` (SmokeTestFailed) unless it
    answers ok as ``version``."""
    args = [python, "-P", "-m", "edged", "check", "--data-dir", str(data_dir)]
    if config_path is not None:
        args += ["--config", str(config_path)]
    env = slot_environ(os.environ if environ is None else environ, slot_root / "lib", data_dir)
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd="/",
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise InstallRefused(
            "SmokeTestFailed", f"edged check of {version} did not answer within {timeout_s:g}s"
        ) from None
    out, err = out[-MAX_OUTPUT_BYTES:], err[-MAX_OUTPUT_BYTES:]
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        answer = {}
    if not isinstance(answer, dict):
        answer = {}
    if proc.returncode != 0 or answer.get("ok") is not True:
        detail = answer.get("message") or err.decode(errors="replace").strip()[-500:]
        why = answer.get("reason") or f"exit status {proc.returncode}"
        raise InstallRefused("SmokeTestFailed", f"edged check of {version}: {why}: {detail}")
    if answer.get("version") != version:
        raise InstallRefused(
            "SmokeTestFailed",
            f"the slot's edged reports version {answer.get('version')!r}, not {version}",
        )
