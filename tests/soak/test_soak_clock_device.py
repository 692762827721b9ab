"""A device whose wall clock jumps (soakclock: edged and its workers on the clock shim; the hub
keeps the true time), on a real hub with TUF and a real edged: it keeps serving, stays or gets
connected, refuses what its clock says is expired and takes it once corrected, and what it
reports about time is bounded by the hub, never trusted."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import soakclock
from deploymenttesting import DET
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for
from soakrun import edged_status, infer_once

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.timestamps import epoch_of

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(600)]

HOUR = 3600.0


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    h = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init("--tuf").start()
    yield h
    h.stop()


@pytest.fixture
def device(hub: HubProcess, tmp_path: Path) -> Iterator[tuple[Edged, soakclock.DeviceClock]]:
    clock = soakclock.make(tmp_path, "dev")
    assert not isinstance(clock, str), clock
    data = tmp_path / "dev"
    out = enroll(hub, data, "dev", {"site": "a"})
    assert out.returncode == 0, out.stdout + out.stderr
    e = Edged(
        data, None, tmp_path / "dev.log", config=SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "x")
    )
    e.env = clock.env()
    e.start()
    yield e, clock
    clock.correct()
    if e.proc is not None and e.proc.poll() is None:
        e.terminate()
    clock.close()


def serving(e: Edged, version: str) -> bool:
    try:
        w = e.workload("det")
    except (KeyError, StopIteration):
        return False
    return w.get("model", {}).get("version") == version and w.get("readyReplicas") == 1


def connected(e: Edged) -> bool:
    return bool(((edged_status(e.data) or {}).get("hub") or {}).get("connected"))


def push_and_apply(hub: HubProcess, tmp_path: Path, version: str, seed: int) -> None:
    model = tmp_path / f"det-{version}.onnx"
    build_mlp(model, TINY_MLP, seed=seed)
    hub.edgectl("models", "push", str(model), "--name", "det", "--version", version)
    doc = tmp_path / "det.yaml"
    doc.write_text(DET.format(version=version))
    hub.edgectl("apply", "-f", str(doc))


def hub_view(hub: HubProcess) -> dict:  # type: ignore[type-arg]
    out = hub.edgectl("get", "devices", "dev", "-o", "json")
    doc = json.loads(out.stdout)
    items = doc.get("items", [doc])
    return dict(items[0])


def test_a_device_whose_clock_jumps_keeps_serving_and_its_times_are_bounded_by_the_hub(
    hub: HubProcess, device: tuple[Edged, soakclock.DeviceClock], tmp_path: Path
) -> None:
    e, clock = device
    push_and_apply(hub, tmp_path, "1.0.0", seed=1)
    wait_for(lambda: serving(e, "1.0.0"), 120, "the device to serve det 1.0.0")

    # ahead by 3 hours: past the TUF timestamp's hour; the device must not take metadata its
    # clock says is expired (a freeze), and must keep serving what it runs
    clock.jump(3 * HOUR)
    assert all(infer_once(e.data, "det") == 200 for _ in range(10))
    push_and_apply(hub, tmp_path, "1.1.0", seed=2)
    # a worker killed while the clock is ahead: its end is reported with the device's time
    worker = e.workload("det")
    pids = [r["pid"] for r in worker.get("replicas", []) if r.get("pid")]
    assert pids, worker
    os.kill(pids[0], signal.SIGKILL)

    def served_again() -> bool:  # by the replica started after the kill, not the killed one
        if not serving(e, "1.0.0"):
            return False
        now = [r.get("pid") for r in e.workload("det").get("replicas", []) if r.get("ready")]
        return bool(now) and pids[0] not in now

    wait_for(served_again, 60, "det 1.0.0 to be served again after the kill")

    # the device's report reached the hub: its time of the kill is bounded by the hub's own
    def reported() -> dict | None:  # type: ignore[type-arg]
        w = hub_view(hub).get("status", {}).get("workloads", {}).get("det", {})
        return dict(w["lastTermination"]) if w.get("lastTermination") else None

    wait_for(lambda: reported() is not None, 60, "the hub to hold the device's termination")
    ended = reported()
    assert ended is not None
    finished = epoch_of(ended.get("finishedAt"))
    assert finished is not None and finished <= time.time() + 1, ended
    assert serving(e, "1.0.0") and not serving(e, "1.1.0")
    assert connected(e)
    assert all(infer_once(e.data, "det") == 200 for _ in range(10))

    # corrected (NTP steps it back): the device takes 1.1.0 without a restart
    clock.correct()
    wait_for(lambda: serving(e, "1.1.0"), 120, "the device to serve det 1.1.0 once corrected")

    # behind by 30 minutes: the hub's certificate is not valid yet in the device's view (the
    # hub was made a minute ago); a hub restart drops the stream and the device cannot connect
    # until its clock is corrected, then does, serving throughout
    clock.jump(-0.5 * HOUR)
    assert connected(e)
    hub.kill9()
    hub.start()

    def refused_by_its_clock() -> bool:
        assert infer_once(e.data, "det") == 200  # serving throughout
        hub_link = (edged_status(e.data) or {}).get("hub") or {}
        return not hub_link.get("connected") and "Tls handshake failed" in str(
            hub_link.get("lastError")
        )

    wait_for(refused_by_its_clock, 60, "the device to fail the hub's certificate on its clock")
    clock.correct()
    wait_for(lambda: connected(e), 120, "the device to connect once its clock is corrected")
    assert infer_once(e.data, "det") == 200
