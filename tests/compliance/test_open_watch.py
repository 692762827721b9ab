"""The open watch's bounds, with the real kernel (fanotify, as root) and real processes on a
store in a temporary directory (no edged: the watch's own component in this test's loop):
events read at most MAX_OPEN_EVENTS_PER_S a second, at most MAX_OPEN_FINDINGS findings kept,
this process's own opens and its children's not findings."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from asynctesting import async_test, eventually

from edged.compliance.checking import DriftAction, Remediation
from edged.compliance.drift import MAX_OPEN_EVENTS_PER_S, MAX_OPEN_FINDINGS, DriftWatch

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify needs CAP_SYS_ADMIN")


def _store(tmp_path: Path) -> Path:
    blobs = tmp_path / "sha256"
    blobs.mkdir()
    data = b"a model"
    blob = blobs / hashlib.sha256(data).hexdigest()
    blob.write_bytes(data)
    blob.chmod(0o444)  # as edged keeps them
    return blobs


def _stranger(commands: str) -> list[str]:
    """A shell that runs ``commands`` in a background subshell that waits until the shell is
    gone (exited and reaped) first: by then the subshell is re-parented away from this
    process, so the watch cannot count its opens as this process's descendants'."""
    return ["sh", "-c", f"(while kill -0 $$ 2>/dev/null; do sleep 0.02; done; {commands}) &"]


def _watch(blobs: Path, acted: list[Remediation], started: list[int] | None = None) -> DriftWatch:
    return DriftWatch(
        blobs=blobs,
        config_path=None,
        action=lambda: DriftAction.RESTART_WORKLOAD,
        period=lambda: 3600.0,
        act=acted.append,
        on_change=lambda: None,
        started=lambda: started or [],
    )


@async_test
async def test_findings_are_bounded_and_edgeds_own_opens_are_not_findings(
    tmp_path: Path,
) -> None:
    blobs = _store(tmp_path)
    blob = next(blobs.iterdir())
    acted: list[Remediation] = []
    started: list[int] = []
    watch = _watch(blobs, acted, started)
    watch.start_open_watch()
    try:
        assert watch.open_watch_reason is None
        blob.read_bytes()  # "edged" itself
        # a "worker" of edged (this process) that is gone, reaped, before the watch looks
        worker = await asyncio.create_subprocess_exec(
            "head", "-c1", str(blob), stdout=subprocess.DEVNULL
        )
        started.append(worker.pid)
        assert await worker.wait() == 0
        await eventually(lambda: watch.open_counts["edged"] >= 1, 5)
        assert watch.findings == ()
        # 40 processes that edged did not start: a grandchild through setsid is still ours,
        # so start them from a subshell that is re-parented (double fork) before they open
        n = MAX_OPEN_FINDINGS + 8
        script = f"for i in $(seq {n}); do head -c1 {blob} >/dev/null; done"
        await asyncio.to_thread(subprocess.run, _stranger(script), check=True)
        await eventually(lambda: watch.open_counts["findingsDropped"] > 0, 10)
        await eventually(lambda: len(watch.findings) == MAX_OPEN_FINDINGS, 5)
        assert all(f.kind.value == "ModelFileOpened" for f in watch.findings)
        assert acted and all(r.kill_pids for r in acted)  # remediated as they came
    finally:
        watch.stop_open_watch()


@async_test
async def test_events_are_read_at_a_bounded_rate(tmp_path: Path) -> None:
    blobs = _store(tmp_path)
    watch = _watch(blobs, [])
    watch.start_open_watch()
    opens = MAX_OPEN_EVENTS_PER_S * 3
    for i in range(opens):  # one open of each: the kernel merges repeated opens of one file
        (blobs / f"f{i}").write_bytes(b"x")
    try:
        code = f"import os\nos.chdir({str(blobs)!r})\nfor n in os.listdir(): open(n).close()"
        t0 = asyncio.get_running_loop().time()
        await asyncio.to_thread(subprocess.run, [sys.executable, "-c", code], check=True)
        await eventually(lambda: watch.open_counts["events"] >= opens, 10)
        took = asyncio.get_running_loop().time() - t0
        assert watch.open_counts["paused"] >= 2
        assert took >= 1.9  # three seconds' worth of events: read in three windows of 1 s
    finally:
        watch.stop_open_watch()


@async_test
async def test_a_failure_in_the_watch_is_reported_and_the_next_check_starts_it_again(
    tmp_path: Path,
) -> None:
    blobs = _store(tmp_path)
    blob = next(blobs.iterdir())

    def act(plan: Remediation) -> None:
        raise RuntimeError("remediation broke")

    watch = DriftWatch(
        blobs=blobs,
        config_path=None,
        action=lambda: DriftAction.RESTART_WORKLOAD,
        period=lambda: 3600.0,
        act=act,
        on_change=lambda: None,
        started=lambda: [],
    )
    watch.start_open_watch()
    try:
        # re-parented away from this process: a finding, and act raises
        opener = await asyncio.create_subprocess_exec(*_stranger(f"head -c1 {blob}"))
        await opener.wait()
        await eventually(lambda: (watch.open_watch_reason or "").startswith("failed"), 5)
        assert "remediation broke" in (watch.open_watch_reason or "")
        assert watch.status(quarantined=None)["opensWatched"] is False
        # the store is clean: the check remediates nothing (it keeps the open's finding)
        found = await watch.check()
        assert [
            f.message.endswith("(seen by fanotify); only edged's workers may") for f in found
        ] == [True]
        assert watch.open_watch_reason is None  # in force again
    finally:
        watch.stop_open_watch()


@async_test
async def test_an_opens_finding_ages_on_the_monotonic_clock_across_a_step_of_the_wall_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open's finding is kept for one check period after it was last seen. The device's
    wall clock stepped back 30 minutes (NTP, ``date -s``; the soak's clock jumps) must not
    keep it 30 minutes longer: before the fix its age was wall-clock time."""
    from edged.compliance import drift

    blobs = _store(tmp_path)
    blob = next(blobs.iterdir())
    watch = DriftWatch(
        blobs=blobs,
        config_path=None,
        action=lambda: DriftAction.RESTART_WORKLOAD,
        period=lambda: 0.5,
        act=lambda plan: None,
        on_change=lambda: None,
        started=lambda: [],
    )
    watch.start_open_watch()
    try:
        opener = await asyncio.create_subprocess_exec(*_stranger(f"head -c1 {blob}"))
        await opener.wait()
        await eventually(lambda: len(watch.findings) == 1, 5)
        stepped = SimpleNamespace(time=lambda: time.time() - 1800, monotonic=time.monotonic)
        monkeypatch.setattr(drift, "time", stepped)

        async def dropped() -> bool:
            return await watch.check() == ()

        await eventually(dropped, 10, "the open's finding to age out after its period")
        assert watch.checked_at is not None and watch.checked_at < time.time() - 1700
    finally:
        watch.stop_open_watch()
