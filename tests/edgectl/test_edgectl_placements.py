"""Placements in sight, against a real hub (issue 33): the ``edgectl`` console script against
AdminService over mutual TLS, a SQLite store, the projector placing the deployment on the
devices its ``matchExpressions`` select; the devices are records written as their Sync stream
would. ``get placements``, ``get devices --for deployment/NAME``, ``describe deployment``'s
``Placements`` and its selector, and what is refused."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from edgectltesting import edgectl
from hubserving import AdminHub, ThreadedHub, make_hub_dir

from hub.decide.devices import Device, DevicePhase, RevisionPhase, RevisionReport, WorkloadReport
from hub.state import storekeys as objects

MANIFEST = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: sel}
spec:
  model: {name: sel, version: "1.0.0"}
  replicas: {perDevice: 1}
  placement:
    matchExpressions:
    - {key: tier, operator: In, values: [gold]}
    - {key: lab, operator: DoesNotExist}
"""
SHA = "1" * 64


async def seed(hub: AdminHub) -> None:
    model = objects.ModelRecord("sel", "1.0.0", SHA, 1234, b"{signed}", 1.0)
    await hub.ctx.store.put(objects.model_key("sel", "1.0.0"), objects.dumps(model.to_json()))
    hub.ctx.cache.models[("sel", "1.0.0")] = model
    ready = RevisionReport("1.0.0", SHA, RevisionPhase.READY, 1, wanted=True)
    for name, labels, workloads in (
        ("cam-a", {"tier": "gold"}, {"sel": WorkloadReport("1.0.0", 1, 1, revisions=(ready,))}),
        ("cam-b", {"tier": "gold"}, {}),
        ("cam-lab", {"tier": "gold", "lab": "yes"}, {}),
        # no longer selected, still reports it: leaving
        ("cam-old", {"tier": "bronze"}, {"sel": WorkloadReport("1.0.0", 1, 1, revisions=(ready,))}),
    ):
        hub.ctx.writer.update(
            Device(name, labels=labels, phase=DevicePhase.READY, last_heartbeat=time.time(),
                   workloads=workloads)
        )  # fmt: skip
    await hub.ctx.writer.flush()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedHub]:
    paths = asyncio.run(make_hub_dir(tmp_path_factory.mktemp("placements") / "hub"))
    with ThreadedHub(paths) as threaded:
        assert threaded.hub is not None
        threaded.run(seed(threaded.hub))
        done = edgectl(paths.admin_config, "apply", "-f", "-", stdin=MANIFEST)
        assert done.returncode == 0, done.stderr
        yield threaded


def ok(hub: ThreadedHub, *args: str) -> str:
    done = edgectl(hub.paths.admin_config, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def refused(hub: ThreadedHub, *args: str) -> tuple[int, str]:
    done = edgectl(hub.paths.admin_config, *args)
    assert done.returncode != 0, (args, done.stdout)
    return done.returncode, done.stderr


def placed(hub: ThreadedHub) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 20
    while True:
        items: list[dict[str, Any]] = orjson.loads(ok(hub, "get", "placements", "-o", "json"))[
            "items"
        ]
        if {i["spec"]["device"] for i in items if i["status"]["placed"]} == {"cam-a", "cam-b"}:
            return items
        assert time.monotonic() < deadline, items
        time.sleep(0.1)


def test_get_placements_shows_each_device_with_its_revision_replicas_and_phase(
    hub: ThreadedHub,
) -> None:
    items = placed(hub)
    by_device = {i["spec"]["device"]: i for i in items}
    assert sorted(by_device) == ["cam-a", "cam-b", "cam-old"]  # not cam-lab: lab exists
    a, b, old = (by_device[d]["status"] for d in ("cam-a", "cam-b", "cam-old"))
    assert (a["revision"], a["version"], a["readyReplicas"], a["replicas"], a["phase"]) == (
        1, "1.0.0", 1, 1, "Ready",
    )  # fmt: skip
    assert (b["phase"], b["reason"], b["readyReplicas"]) == ("Pending", "not reported yet", 0)
    assert (old["placed"], old["phase"], old["readyReplicas"]) == (False, "Leaving", 1)
    assert by_device["cam-a"]["metadata"]["name"] == "sel@cam-a"

    table = ok(hub, "get", "placements").splitlines()
    assert table[0].split() == [
        "DEPLOYMENT", "DEVICE", "REVISION", "VERSION", "READY", "PHASE", "DEVICE-STATUS",
    ]  # fmt: skip
    assert table[1].split() == ["sel", "cam-a", "1", "1.0.0", "1/1", "Ready", "Ready"]
    assert table[3].split() == ["sel", "cam-old", "<none>", "<none>", "1/0", "Leaving", "Ready"]
    wide = ok(hub, "get", "placements", "-o", "wide")
    assert "1.0.0 serves meanwhile" not in wide and "not reported yet" in wide

    names = ok(hub, "get", "placements", "--for", "deployment/sel", "-o", "name").split()
    assert names == ["placement/sel@cam-a", "placement/sel@cam-b", "placement/sel@cam-old"]
    assert ok(hub, "get", "placements", "-l", "device=cam-b", "-o", "name").split() == [
        "placement/sel@cam-b"
    ]
    one = orjson.loads(ok(hub, "get", "placement", "sel@cam-a", "-o", "json"))
    assert one["status"]["phase"] == "Ready"
    devices = ok(hub, "get", "devices", "--for", "deploy/sel", "-o", "name").split()
    assert devices == ["device/cam-a", "device/cam-b", "device/cam-old"]
    gold = ok(hub, "get", "devices", "--for", "deployment/sel", "-l", "tier=gold", "-o", "name")
    assert gold.split() == ["device/cam-a", "device/cam-b"]


def test_describe_lists_the_placements_and_the_selector_of_match_expressions(
    hub: ThreadedHub,
) -> None:
    placed(hub)
    text = ok(hub, "describe", "deployment", "sel")
    assert "Selector:" in text and "tier in (gold),!lab" in text, text
    lines = text.splitlines()
    start = lines.index("Placements:")
    rows = [line.split() for line in lines[start + 1 : start + 5]]
    assert rows[0] == ["DEVICE", "REVISION", "READY", "PHASE", "REASON"]
    assert rows[1] == ["cam-a", "1", "(1.0.0)", "1/1", "Ready"]
    assert rows[2][:5] == ["cam-b", "1", "(1.0.0)", "0/1", "Pending"]
    assert rows[3][:4] == ["cam-old", "<none>", "1/0", "Leaving"]
    wide = ok(hub, "get", "deployments", "sel", "-o", "wide")
    assert "tier in (gold),!lab" in wide, wide


def test_what_is_refused(hub: ThreadedHub) -> None:
    code, err = refused(hub, "get", "placements", "-w")
    assert code == 2 and "does not apply to placements" in err
    code, err = refused(hub, "get", "deployments", "--for", "deployment/sel")
    assert code == 2 and "--for applies to events, devices and placements" in err
    code, err = refused(hub, "get", "devices", "--for", "sel")
    assert code == 2 and "--for must be deployment/NAME" in err
    code, err = refused(hub, "get", "devices", "--for", "device/cam-a")
    assert code == 2 and "unknown resource type" in err
    code, err = refused(hub, "get", "devices", "--for", "deployment/nope")
    assert code == 1 and "not found" in err
    code, err = refused(hub, "delete", "placement", "sel@cam-a")
    assert code == 1 and "is not deleted" in err
    code, err = refused(hub, "get", "placement", "sel@cam-lab")
    assert code == 1 and "not found" in err
    # --for still names an object's events
    assert "Created" in ok(hub, "get", "events", "--for", "deployment/sel")
