"""A hub restart does not count its own downtime against devices (issue 29, item 4).

A real ``hub serve`` process with shortened timers (heartbeatGrace 4 s, rescheduleAfter 5 s);
three enrolled devices speak Sync from the test (tests/e2e/syncdevice.py: real gRPC clients
with their enrolled certificates), so when each reconnects is exact. A ``total: 2``
deployment is placed on two of them. The hub is stopped for longer than rescheduleAfter, then
started again: the devices that reconnect within the grace after the start keep their replica
and are never NotReady; the one that stays away becomes NotReady and is rescheduled only a
full grace period after the start, not at once (before: the hub moved it about a second
after starting, as it measured the silence from the last heartbeat before its outage)."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path

from fleet import HubProcess, set_device_timers
from harness import wait_for
from syncdevice import enrolled

from edgefleet.demo import TINY_MLP, build_mlp

GRACE = 4.0  # a loaded CI machine: the devices that come back reconnect well within it
RESCHEDULE_AFTER = 5.0
SLACK = 45.0  # a deadline for a loaded machine, not a timed assertion

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: det}
spec:
  model: {name: det, version: "1.0.0"}
  replicas: {total: 2}
  placement: {nodeSelector: {site: a}}
"""


def events(hub: HubProcess) -> list[dict]:
    """The hub's events, each with its ``time`` in epoch seconds (edgectl shows RFC 3339)."""
    doc = json.loads(hub.edgectl("get", "events", "-o", "json").stdout)
    items = doc["items"] if isinstance(doc, dict) else doc
    for e in items:
        e["time"] = datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
    return items


def test_a_hub_down_longer_than_reschedule_after_moves_nothing_when_it_comes_back(
    tmp_path: Path,
) -> None:
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init()
    set_device_timers(
        hub,
        heartbeatInterval="1s",
        heartbeatGrace=f"{GRACE:g}s",
        rescheduleAfter=f"{RESCHEDULE_AFTER:g}s",
    )
    hub.start()
    devices = {}
    try:
        for name in ("dev-0", "dev-1", "dev-2"):
            devices[name] = enrolled(hub, tmp_path, name, {"site": "a"}).connect()
        wait_for(lambda: all(d.connected.is_set() for d in devices.values()), 30, "connected")
        model = tmp_path / "det.onnx"
        build_mlp(model, TINY_MLP, seed=1)
        out = hub.edgectl("models", "push", str(model), "--name", "det", "--version", "1.0.0")
        assert "pushed" in out.stdout, out.stdout + out.stderr
        doc = tmp_path / "det.yaml"
        doc.write_text(DEPLOYMENT)
        hub.edgectl("apply", "-f", str(doc))

        def placed() -> list[str]:
            for e in events(hub):
                m = re.match(r"2 replica\(s\) placed on (\S+), (\S+) ", e["message"])
                if e["reason"] == "Scheduled" and m:
                    return [m.group(1), m.group(2)]
            return []

        back, away = wait_for(placed, 30, "det placed on two devices")
        (spare,) = set(devices) - {back, away}

        hub.stop()
        devices[away].disconnect()  # it stays away; the others reconnect once the hub listens
        time.sleep(RESCHEDULE_AFTER + 3)  # the outage: longer than rescheduleAfter
        started = time.time()
        hub.start()

        def rescheduled() -> dict | None:
            return next(
                (e for e in events(hub) if e["reason"] == "Rescheduled" and e["time"] >= started),
                None,
            )

        moved = wait_for(rescheduled, RESCHEDULE_AFTER + SLACK, f"{away}'s replica moved")
        after = [e for e in events(hub) if e["time"] >= started]
        summary = "\n".join(
            f"{e['time'] - started:6.2f} s {e['reason']} {e['object']['name']}: {e['message']}"
            for e in after
        )
        print(summary)
        # only the device that stayed away lost its replica, a full rescheduleAfter after the
        # hub's start (before the fix: about a second after it)
        assert f"replica taken off {away}" in moved["message"], summary
        assert moved["time"] - started >= RESCHEDULE_AFTER, summary
        assert not [e for e in after if e["reason"] == "Rescheduled" and back in e["message"]]
        not_ready = {e["object"]["name"]: e["time"] for e in after if e["reason"] == "NotReady"}
        assert set(not_ready) == {away}, summary
        assert not_ready[away] - started >= GRACE, summary
        # and the replica is placed on the spare device, beside the one that came back
        final = json.loads(hub.edgectl("get", "deployments", "det", "-o", "json").stdout)
        scheduled = {c["type"]: c for c in final["status"]["conditions"]}["Scheduled"]
        assert scheduled["message"] == "2/2 replicas placed", scheduled
        wait_for(lambda: "det" in devices[spare].deployments(), 30, f"{spare} sent det")
        assert "det" in devices[back].deployments()
    finally:
        for d in devices.values():
            d.disconnect()
        hub.stop()
