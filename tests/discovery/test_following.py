"""Hotplug into the discovery component: real uevents from a umockdev testbed, debounced."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import IO

import pytest
from umockdevs import DEVICES, HERE, SYSTEM_PYTHON

pytestmark = pytest.mark.usefixtures("umockdev")


class Bed:
    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(HERE.parents[1]))
        cmd = [
            "umockdev-wrapper",
            SYSTEM_PYTHON,
            str(HERE / "testbed.py"),
            "--",
            sys.executable,
            str(HERE / "follow.py"),
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.out.readline().startswith("pid ")
        assert self.next_line() == "ready"

    @property
    def out(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def next_line(self) -> str:
        assert self.proc.stderr is not None  # the component's stdout is the driver's stderr
        return self.proc.stderr.readline().strip()

    def send(self, *commands: str) -> None:
        assert self.proc.stdin is not None
        for c in commands:
            self.proc.stdin.write(c + "\n")
        self.proc.stdin.flush()
        for _ in commands:
            assert self.out.readline().strip() == "ok"

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(30)


@pytest.fixture
def bed() -> Iterator[Bed]:
    b = Bed()
    yield b
    assert b.close() == 0


def test_a_burst_of_events_is_one_change_and_removal_is_seen(bed: Bed) -> None:
    t0 = time.monotonic()
    bed.send(f"add {DEVICES / 'hailo.umockdev'}", f"add {DEVICES / 'coral-usb.umockdev'}")
    assert bed.next_line() == "changed google-tpu,google-tpu,hailo-npu"
    assert time.monotonic() - t0 < 5
    bed.send(f"remove {DEVICES / 'coral-usb.umockdev'}")
    assert bed.next_line() == "changed hailo-npu"
    bed.send(f"remove {DEVICES / 'hailo.umockdev'}")
    # the PCI device stays, its node went: listed, not usable
    assert bed.next_line() == "changed -"
