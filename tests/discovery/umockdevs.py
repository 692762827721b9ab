"""Helpers for the discovery tests: running code under umockdev with the devices in ``devices/``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
DEVICES = HERE / "devices"
SYSTEM_PYTHON = "/usr/bin/python3"


def check_umockdev() -> str:
    missing = [t for t in ("umockdev-run", "umockdev-wrapper") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not found"
    probe = "import gi; gi.require_version('UMockdev', '1.0'); from gi.repository import UMockdev"
    r = subprocess.run([SYSTEM_PYTHON, "-c", probe], check=False, capture_output=True, text=True)
    if r.returncode != 0:
        return f"{SYSTEM_PYTHON} cannot import UMockdev via gi: {r.stderr.strip()[-300:]}"
    return ""


def discover(*files: str, touch: tuple[str, ...] = ()) -> Any:
    """The accelerators ``probe.py`` finds under umockdev with these device files."""
    cmd = ["umockdev-run"]
    for f in files:
        cmd += ["--device", str(DEVICES / f)]
    cmd += ["--", sys.executable, str(HERE / "probe.py")]
    for n in touch:
        cmd += ["--touch", n]
    env = dict(os.environ, PYTHONPATH=str(HERE.parent.parent))
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])
