"""Revisions only for what restarts workers, against a real hub (issue 33): the ``edgectl``
console script against AdminService over mutual TLS, a SQLite store, the rollout controller
and projector running; the devices are records written as their Sync stream would.

A scale (``replicas``) is no revision, an identical re-apply is none, ``rollout undo`` to the
stable revision after a rollback is none, and the revision rolled back keeps "rolled back"
and its reason in ``rollout history`` after a later revision, and after the hub restarts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from edgectltesting import edgectl
from hubserving import AdminHub, ThreadedHub, make_hub_dir

from hub.decide.devices import Device, DevicePhase, RevisionPhase, RevisionReport, WorkloadReport
from hub.decide.rollout import RolloutState
from hub.state import storekeys as objects

NAME = "rev"
DEVICE = "cam-r"


def manifest(version: str, replicas: str = "perDevice: 1") -> str:
    return f"""\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {NAME}}}
spec:
  model: {{name: {NAME}, version: "{version}"}}
  replicas: {{{replicas}}}
  placement: {{nodeSelector: {{site: revisions}}}}
  rollout: {{maxSurge: 0, maxUnavailable: 1}}
"""


def sha(version: str) -> str:
    return version.replace(".", "")[:1] * 64


async def push(hub: AdminHub, version: str) -> None:
    model = objects.ModelRecord(NAME, version, sha(version), 1234, b"{signed}", 1.0)
    await hub.ctx.store.put(objects.model_key(NAME, version), objects.dumps(model.to_json()))
    hub.ctx.cache.models[(NAME, version)] = model
    hub.ctx.cache.feed.changed("Model", NAME)


async def report(hub: AdminHub, version: str, phase: RevisionPhase, reason: str = "") -> None:
    rev = RevisionReport(
        version, sha(version), phase, 1 if phase is RevisionPhase.READY else 0, reason=reason,
        message="worker exited 1" if reason else "", wanted=True,
    )  # fmt: skip
    hub.ctx.writer.update(
        Device(
            name=DEVICE,
            labels={"site": "revisions"},
            phase=DevicePhase.READY,
            last_heartbeat=time.time(),
            workloads={NAME: WorkloadReport(version, desired_replicas=1, revisions=(rev,))},
        )
    )
    await hub.ctx.writer.flush()


async def rollout_of(hub: AdminHub) -> RolloutState | None:
    return hub.ctx.cache.rollouts.get(NAME)


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return asyncio.run(make_hub_dir(tmp_path_factory.mktemp("revisions") / "hub"))


@pytest.fixture(scope="module")
def hub(paths: Any) -> Iterator[ThreadedHub]:
    with ThreadedHub(paths) as threaded:
        assert threaded.hub is not None
        for version in ("1.0.0", "2.0.0", "3.0.0"):
            threaded.run(push(threaded.hub, version))
        threaded.run(report(threaded.hub, "1.0.0", RevisionPhase.READY))
        yield threaded


def wait_for(hub: ThreadedHub, check: Callable[[RolloutState], bool], what: str) -> RolloutState:
    assert hub.hub is not None
    deadline = time.monotonic() + 20
    state = None
    while time.monotonic() < deadline:
        state = hub.run(rollout_of(hub.hub))
        if state is not None and check(state):
            return state
        time.sleep(0.05)
    raise AssertionError(f"{what}: the rollout is {state}")


def apply(config: Path, text: str) -> str:
    done = edgectl(config, "apply", "-f", "-", stdin=text)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def history(config: Path) -> list[list[str]]:
    done = edgectl(config, "rollout", "history", NAME)
    assert done.returncode == 0, done.stdout + done.stderr
    return [line.split() for line in done.stdout.splitlines()]


def revisions_in(rows: list[list[str]]) -> list[str]:
    return [r[0] for r in rows[1:] if r and r[0].isdigit()]


def test_scales_and_identical_applies_are_no_revisions_and_outcomes_are_kept(
    hub: ThreadedHub, paths: Any
) -> None:
    config = paths.admin_config
    apply(config, manifest("1.0.0"))
    wait_for(hub, lambda s: s.phase.value == "Complete", "the first revision")
    # a scale: perDevice, then total, then back; and the same spec again: one revision
    apply(config, manifest("1.0.0", "perDevice: 2"))
    apply(config, manifest("1.0.0", "total: 3"))
    apply(config, manifest("1.0.0", "total: 3"))
    apply(config, manifest("1.0.0"))
    rows = history(config)
    assert revisions_in(rows) == ["1"], rows
    state = wait_for(hub, lambda s: True, "still")
    assert (state.revision, state.phase.value, state.reason) == (1, "Complete", "FirstRevision")

    # 2.0.0 fails on the device: rolled back
    apply(config, manifest("2.0.0"))
    wait_for(hub, lambda s: s.revision == 2 and DEVICE in s.updated, "2.0.0 sent")
    assert hub.hub is not None
    hub.run(report(hub.hub, "2.0.0", RevisionPhase.FAILED, reason="ModelLoadFailed"))
    wait_for(hub, lambda s: s.phase.value == "RolledBack", "rolled back")
    hub.run(report(hub.hub, "1.0.0", RevisionPhase.READY))

    # undo to the stable one: no "copy of 1", revision 2 keeps "rolled back" and why
    undo = edgectl(config, "rollout", "undo", NAME)
    assert undo.returncode == 0, undo.stdout + undo.stderr
    assert "no new revision" in undo.stdout, undo.stdout
    # Complete once the device says it serves it (it did already: it was rolled back to it)
    state = wait_for(
        hub, lambda s: s.revision == 1 and s.phase.value == "Complete", "back on revision 1"
    )
    assert (state.stable, state.reason) == (1, "RolloutComplete")
    done = edgectl(config, "rollout", "history", NAME)
    assert "copy of" not in done.stdout, done.stdout
    rows = history(config)
    assert revisions_in(rows) == ["1", "2"], rows
    assert "rolled back (RevisionFailed)" in done.stdout, done.stdout
    assert "revision 2: revision 2 (2.0.0) failed on 1 device(s)" in done.stdout, done.stdout
    assert "ModelLoadFailed" in done.stdout, done.stdout
    shown = orjson.loads(edgectl(config, "get", "deployments", NAME, "-o", "json").stdout)
    assert shown["spec"]["model"]["version"] == "1.0.0"
    assert shown["spec"]["replicas"] == {"perDevice": 1}  # undo keeps the replicas

    # a new revision: 3, not a copy; 2 still says rolled back, 1 complete
    apply(config, manifest("3.0.0", "perDevice: 2"))
    wait_for(hub, lambda s: s.revision == 3, "revision 3")
    done = edgectl(config, "rollout", "history", NAME)
    rows = history(config)
    assert revisions_in(rows) == ["1", "2", "3"], rows
    assert next(r for r in rows if r[:1] == ["2"])[4:6] == ["rolled", "back"], rows
    assert next(r for r in rows if r[:1] == ["1"])[4] == "complete", rows
    assert "copy of" not in done.stdout

    # the outcomes survive a hub restart (one test: pytest-xdist may run tests of a module on
    # different workers, each with its own module fixtures)
    outcomes_survive_a_hub_restart(hub, paths)


def outcomes_survive_a_hub_restart(hub: ThreadedHub, paths: Any) -> None:
    """A new hub on the same store shows the same history."""
    before = history(paths.admin_config)
    assert len(revisions_in(before)) == 3, before
    hub.__exit__(None, None, None)
    with ThreadedHub(paths):
        after = edgectl(paths.admin_config, "rollout", "history", NAME)
        assert after.returncode == 0, after.stderr
        assert "rolled back (RevisionFailed)" in after.stdout, after.stdout
        assert [line.split() for line in after.stdout.splitlines()][:4] == before[:4]
