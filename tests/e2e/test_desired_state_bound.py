"""The scheduler keeps the desired-state bound, and no device over it blocks the fleet (issue
29, item 2).

A real ``hub serve`` process with shortened timers; five enrolled devices speak Sync from the
test (tests/e2e/syncdevice.py: real gRPC clients with their enrolled certificates): s1-a to
s1-d labelled ``site=s1``, s2-a ``site=s2``. Six deployments of about 840 KB each,
``replicas.total: 1`` on ``site=s1``, are applied one by one and spread over s1-a..s1-d. Then
three of those devices go away for longer than rescheduleAfter. Before: the scheduler moved
all six replicas onto s1-a, whose desired state (4.8 MiB) was never sent (event
DesiredStateTooLarge), and from then on every apply in the fleet was refused, even one
selecting only s2-a. Now: s1-a takes what it can receive (four), the other two stay unplaced
with a condition naming s1-a's desired state, an apply that does not grow s1-a goes through,
and one that would grow it past the bound is refused naming it."""

from __future__ import annotations

import json
from pathlib import Path

from fleet import HubProcess, set_device_timers
from harness import wait_for
from syncdevice import SyncDevice, enrolled

from edgefleet.demo import TINY_MLP, build_mlp

FILLER = 840_000  # bytes of annotation: each deployment is about 840 KB
BIG = [f"big{i}" for i in range(6)]
S1 = ["s1-a", "s1-b", "s1-c", "s1-d"]


def deployment(name: str, replicas: str, site: str, filler: int) -> str:
    notes = f"  annotations: {{filler: {'x' * filler}}}\n" if filler else ""
    return (
        "apiVersion: edgefleet.io/v1\nkind: ModelDeployment\n"
        f"metadata:\n  name: {name}\n{notes}"
        "spec:\n"
        f'  model: {{name: {name}, version: "1.0.0"}}\n'  # a device serves one per model name
        f"  replicas: {{{replicas}}}\n"
        f"  placement: {{nodeSelector: {{site: {site}}}}}\n"
    )


def apply(hub: HubProcess, tmp_path: Path, name: str, text: str):  # type: ignore[no-untyped-def]
    doc = tmp_path / f"{name}.yaml"
    doc.write_text(text)
    return hub.edgectl("apply", "-f", str(doc), check=False)


def event_log(hub: HubProcess) -> list[dict]:
    doc = json.loads(hub.edgectl("get", "events", "-o", "json").stdout)
    return doc["items"] if isinstance(doc, dict) else doc


def test_the_scheduler_keeps_the_bound_and_an_oversize_device_blocks_no_other_apply(
    tmp_path: Path,
) -> None:
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init()
    set_device_timers(hub, heartbeatInterval="1s", heartbeatGrace="3s", rescheduleAfter="4s")
    hub.start()
    devices: dict[str, SyncDevice] = {}
    try:
        for name in S1:
            devices[name] = enrolled(hub, tmp_path, name, {"site": "s1"}).connect()
        devices["s2-a"] = enrolled(hub, tmp_path, "s2-a", {"site": "s2"}).connect()
        model = tmp_path / "det.onnx"
        build_mlp(model, TINY_MLP, seed=1)
        for name in [*BIG, "other", "grow"]:  # each deployment its own model name
            out = hub.edgectl("models", "push", str(model), "--name", name, "--version", "1.0.0")
            assert "pushed" in out.stdout, out.stdout + out.stderr

        for name in BIG:  # each accepted
            out = apply(hub, tmp_path, name, deployment(name, "total: 1", "s1", FILLER))
            assert out.returncode == 0, out.stdout + out.stderr

        def sent() -> dict[str, set[str]]:
            return {n: devices[n].deployments() & set(BIG) for n in S1}

        wait_for(lambda: sum(len(s) for s in sent().values()) == 6, 60, "six replicas sent")
        spread = sent()
        assert all(len(s) <= 2 for s in spread.values()), spread

        # three devices go away for longer than rescheduleAfter: s1-a is the last one
        for name in S1[1:]:
            devices[name].disconnect()
        last = devices["s1-a"]

        def too_large() -> list[dict]:
            return [e for e in event_log(hub) if e["reason"] == "DesiredStateTooLarge"]

        wait_for(
            lambda: too_large() or len(last.deployments() & set(BIG)) == 4,
            60,
            "s1-a sent the replicas it can receive",
        )
        assert not too_large(), too_large()  # before: 4.8 MiB, not sent
        on_last = last.deployments() & set(BIG)
        assert len(on_last) == 4 and spread["s1-a"] <= on_last, (spread, on_last)
        size = last.desired.ByteSize() if last.desired is not None else 0
        assert size <= 4 * 2**20 - 64 * 2**10, size
        for name in sorted(set(BIG) - on_last):

            def scheduled(name: str = name) -> dict:
                doc = json.loads(hub.edgectl("get", "deployments", name, "-o", "json").stdout)
                return {c["type"]: c for c in doc["status"]["conditions"]}["Scheduled"]

            # s1-a may hold four while a replica still waits on a device not yet given up
            wait_for(lambda: scheduled()["status"] == "False", 60, f"{name} left unplaced")
            shown = scheduled()
            assert shown["message"].startswith("0/1 replicas placed"), shown
            assert "1 desired state would exceed 3.94 MiB (s1-a)" in shown["message"], shown

        # an apply that leaves s1-a as it is goes through (before: refused, naming s1-a)
        out = apply(hub, tmp_path, "other", deployment("other", "perDevice: 1", "s2", 0))
        assert out.returncode == 0, out.stdout + out.stderr
        wait_for(lambda: "other" in devices["s2-a"].deployments(), 30, "s2-a sent other")
        # one that would grow s1-a past the bound is refused, naming it
        grow = deployment("grow", "perDevice: 1", "s1", FILLER)
        out = apply(hub, tmp_path, "grow", grow)
        assert out.returncode != 0, out.stdout
        assert "the desired state of 1 device(s) would exceed 3.94 MiB" in out.stderr, out.stderr
        assert "s1-a (" in out.stderr, out.stderr
    finally:
        for d in devices.values():
            d.disconnect()
        hub.stop()


def test_a_label_that_would_overfill_a_device_sheds_deployments_instead_of_cutting_it_off(
    tmp_path: Path,
) -> None:
    """A path no apply check sees: six ~840 KB ``perDevice`` deployments select ``hw=big``,
    which no device has; then s1-a reports ``hw=big`` itself (as discovery reports hardware
    that appeared), reconnecting with it in its Hello. Before: s1-a's state was
    4.8 MiB, never sent (DesiredStateTooLarge), so it stopped receiving anything, even the
    small deployment it ran. Now it is sent what it can receive, the small one kept, and the
    deployments left out say why."""
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init().start()
    device: SyncDevice | None = None
    try:
        device = enrolled(hub, tmp_path, "s1-a", {"site": "s1", "pool": "p"}).connect()
        model = tmp_path / "det.onnx"
        build_mlp(model, TINY_MLP, seed=1)
        for name in [*BIG, "small"]:
            out = hub.edgectl("models", "push", str(model), "--name", name, "--version", "1.0.0")
            assert "pushed" in out.stdout, out.stdout + out.stderr
        small = deployment("small", "perDevice: 1", "s1", 0).replace("site: s1", "pool: p")
        out = apply(hub, tmp_path, "small", small)
        assert out.returncode == 0, out.stdout + out.stderr
        for name in BIG:  # each accepted: no device has hw=big yet
            big = deployment(name, "perDevice: 1", "s9", FILLER).replace("site: s9", "hw: big")
            out = apply(hub, tmp_path, name, big)
            assert out.returncode == 0, out.stdout + out.stderr
        wait_for(lambda: "small" in device.deployments(), 30, "s1-a sent small")

        device.disconnect()
        device.labels = {**device.labels, "hw": "big"}
        device.connect()
        wait_for(
            lambda: len(device.deployments() & set(BIG)) == 4 or too_large(hub),
            60,
            "s1-a sent what it can receive",
        )
        assert not too_large(hub), too_large(hub)  # before: 4.8 MiB, not sent
        size = device.desired.ByteSize() if device.desired is not None else 0
        assert size <= 4 * 2**20 - 64 * 2**10, size
        assert "small" in device.deployments()  # what it ran before is kept
        left = sorted(set(BIG) - device.deployments())
        assert len(left) == 2, left
        shown = json.loads(hub.edgectl("get", "devices", "s1-a", "-o", "json").stdout)
        not_running = shown["status"]["notRunning"]
        for name in left:
            assert "desired state would exceed 3.94 MiB" in not_running[name], not_running
    finally:
        if device is not None:
            device.disconnect()
        hub.stop()


def too_large(hub: HubProcess) -> list[dict]:
    return [e for e in event_log(hub) if e["reason"] == "DesiredStateTooLarge"]
