"""Broken edged releases for the agent update tests (tests/e2e, tests/vmlab): this checkout with
one file changed so that its ``edged check`` (the device's smoke test) passes, the device
switches to it, and its launcher must take it back by itself; built by the real
``packaging/agent/build-release`` (``--source`` the patched copy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD_RELEASE = REPO / "packaging" / "agent" / "build-release"


def source_copy(tmp: Path, name: str) -> Path:
    """A copy of this checkout's packages build-release reads, to break one file of."""
    src = tmp / f"src-{name}"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("edged", "edgefleet"):
        shutil.copytree(REPO / package, src / package, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", src / "pyproject.toml")
    return src


def patched(src: Path, relative: str, old: str, new: str) -> Path:
    """``src/relative`` with ``old`` (which must be there, once) replaced by ``new``."""
    path = src / relative
    text = path.read_text()
    assert text.count(old) == 1, f"{relative}: {old!r} not found once"
    path.write_text(text.replace(old, new))
    return src


_RUN = "def _run(args: argparse.Namespace) -> int:\n"
_LINK = "    async def run(self, stop: asyncio.Event) -> None:\n"
_ATTACH = 'serves here, else why not (the caller kills it)."""\n'
_WORKER = '"edged.runtime.worker",'
_FUTURE = "from __future__ import annotations\n"
_COMMIT = "        return WaitHealthy(missing) if missing else Commit()\n"

BROKEN: dict[str, list[tuple[str, str, str]]] = {
    # crashes at start: its ``edged run`` exits 3 at once, every try (CrashLoop)
    "crash": [("edged/cli.py", _RUN, _RUN + "    raise SystemExit(3)  # broken: crashes\n")],
    # crashes at start on r1 only (it works on the canary, r0): CrashLoop after the canary
    "crash-r1": [
        (
            "edged/cli.py",
            _RUN,
            _RUN + "    if str(args.data_dir).endswith('/r1'):\n"
            "        raise SystemExit(3)  # broken on r1\n",
        ),
    ],
    # fails its own smoke test: its daemon does not import (RuntimeImportFailed)
    "nocheck": [
        ("edged/daemon.py", _FUTURE, _FUTURE + "import edgefleet.no_such_module  # broken\n"),
    ],
    # connects and serves but never commits (it waits for a health it never sees)
    "nocommit": [
        ("edged/agent/planning.py", _COMMIT, '        return WaitHealthy(missing or "broken")\n'),
    ],
    # starts but never connects: its hub link waits for the stop instead of dialling
    # (CommitDeadlineExceeded)
    "silent": [
        (
            "edged/hublink/linking.py",
            _LINK,
            _LINK + "        await stop.wait()  # broken\n        return\n",
        ),
    ],
    # connects but cannot serve: it adopts no worker, and every worker it starts runs a
    # module that is not there (CommitDeadlineExceeded: its workloads never serve again)
    "noserve": [
        ("edged/runtime/processes.py", _ATTACH, _ATTACH + '        return "broken release"\n'),
        ("edged/runtime/processes.py", _WORKER, '"edged.runtime.no_such_worker",'),
    ],
}
"""Each broken release is this checkout with these changes (file, old, new): its ``edged
check`` (the device's smoke test) passes, so the device switches to it, and its launcher must
take it back by itself."""


def build_broken(tmp: Path, out: Path, version: str, broken: str, *extra: str) -> Path:
    """``build-release`` of a copy of this checkout with ``BROKEN[broken]`` applied, as
    ``version``; ``extra``: more build-release arguments (``--arch``, ``--python-abi``)."""
    src = source_copy(tmp, broken)
    for relative, old, new in BROKEN[broken]:
        patched(src, relative, old, new)
    done = subprocess.run(
        [sys.executable, str(BUILD_RELEASE), "--version", version, "--out", str(out),
         "--source", str(src), *extra],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "SOURCE_DATE_EPOCH": "0"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out
