"""Discovery tests.

Real: pyudev and libudev reading a **umockdev** testbed (mocked sysfs, /dev and uevents, from
the record files in ``devices/``), psutil, the parsers. Pure functions (classification,
provider mapping and selection, health policy) are tested as tables with hand-made records.
umockdev is required (Debian packages ``umockdev`` and ``gir1.2-umockdev-1.0``, installed by
``scripts/install-system-deps``): without it these tests fail, they do not skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
DEVICES = HERE / "devices"
SYSTEM_PYTHON = "/usr/bin/python3"


def _check_umockdev() -> str:
    missing = [t for t in ("umockdev-run", "umockdev-wrapper") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not found"
    probe = "import gi; gi.require_version('UMockdev', '1.0'); from gi.repository import UMockdev"
    r = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"{SYSTEM_PYTHON} cannot import UMockdev via gi: {r.stderr.strip()[-300:]}"
    return ""


@pytest.fixture(scope="session")
def umockdev() -> None:
    problem = _check_umockdev()
    if problem:
        pytest.fail(
            f"umockdev is required for the discovery tests ({problem}); install it with "
            "scripts/install-system-deps (Debian: umockdev gir1.2-umockdev-1.0 python3-gi)",
            pytrace=False,
        )


def discover(*files: str, touch: tuple[str, ...] = ()) -> Any:
    """The accelerators ``probe.py`` finds under umockdev with these device files."""
    cmd = ["umockdev-run"]
    for f in files:
        cmd += ["--device", str(DEVICES / f)]
    cmd += ["--", sys.executable, str(HERE / "probe.py")]
    for n in touch:
        cmd += ["--touch", n]
    env = dict(os.environ, PYTHONPATH=str(HERE.parent.parent))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])
