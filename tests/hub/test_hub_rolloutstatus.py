"""A deployment's status with its rollout, as tables: after a rollback the conditions, the
MODEL column and ``describe`` say so (issue 29, item 5); every time is RFC 3339."""

from __future__ import annotations

from typing import Any

import pytest

from edgectl.printing import describe_deployment
from edgefleet.api import ModelDeployment, parse_manifest
from edgefleet.deploymentstatus import serving_model
from edgefleet.timestamps import epoch_of
from hub.decide.devices import Device, DevicePhase, RevisionPhase, RevisionReport, WorkloadReport
from hub.decide.rollout import RolloutPhase, RolloutState
from hub.decide.rolloutstatus import rollout_condition, rollout_json, with_rollout
from hub.decide.status import deployment_status

T = 1_767_225_600.0  # 2026-01-01T00:00:00Z
ROLLED_BACK = RolloutState(
    "det",
    3,
    2,
    frozenset({"dev-0"}),
    RolloutPhase.ROLLED_BACK,
    "RevisionFailed",
    "revision 3 (2.0.0) failed on 1 device(s) (dev-0: 2.0.0 Failed: ModelLoadFailed); every "
    "device is back on revision 2",
    started_at=T,
    changed_at=T + 30,
    steps=1,
    failed={"dev-0": "2.0.0 Failed: ModelLoadFailed"},
)


def dep(version: str) -> ModelDeployment:
    d = parse_manifest(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": "det"},
            "spec": {"model": {"name": "det", "version": version}},
        }
    )
    assert isinstance(d, ModelDeployment)
    return d


def serving(name: str, version: str) -> Device:
    rev = RevisionReport(version, "sha-" + version, RevisionPhase.READY, 1, wanted=True)
    report = WorkloadReport(version, desired_replicas=1, ready_replicas=1, revisions=(rev,))
    return Device(name=name, phase=DevicePhase.READY, workloads={"det": report})


def rolled_back_status() -> dict[str, Any]:
    """The issue's journey: 2.0.0 rolled back, both devices serve the stable 1.1.0."""
    devices = [serving("dev-0", "1.1.0"), serving("dev-1", "1.1.0")]
    assigned = {"dev-0": ["det"], "dev-1": ["det"]}
    sent = {d: ("1.1.0", "sha-1.1.0") for d in assigned}
    status = deployment_status(
        dep("2.0.0"), devices, assigned, model_sha256="sha-2.0.0", assigned_models=sent
    ).to_json()
    return with_rollout(status, ROLLED_BACK, "2.0.0", "1.1.0")


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_after_a_rollback_progressing_says_rolled_back_and_why() -> None:
    status = rolled_back_status()
    progressing = condition(status, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "RolledBack")
    message = progressing["message"]
    assert "revision 3 (2.0.0)" in message and "RevisionFailed" in message
    assert "dev-0: 2.0.0 Failed: ModelLoadFailed" in message
    assert "rolled back to revision 2 (1.1.0)" in message
    assert condition(status, "Available")["status"] == "True"  # the stable one serves
    rollout = status["rollout"]
    assert (rollout["version"], rollout["stableVersion"]) == ("2.0.0", "1.1.0")
    assert rollout["failedDevices"] == {"dev-0": "2.0.0 Failed: ModelLoadFailed"}
    assert status["failing"] == {}  # nothing fails what devices are sent now


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (ROLLED_BACK, ("False", "RolledBack")),
        (
            RolloutState("det", 3, 2, phase=RolloutPhase.PAUSED, message="paused by an operator"),
            ("Unknown", "RolloutPaused"),
        ),
        (RolloutState("det", 3, 2, phase=RolloutPhase.PROGRESSING), None),  # the counts say
        (RolloutState("det", 3, 3, phase=RolloutPhase.COMPLETE), None),
    ],
)
def test_the_rollouts_phase_decides_progressing(
    state: RolloutState, expected: tuple[str, str] | None
) -> None:
    got = rollout_condition(state, "2.0.0", "1.1.0")
    assert (None if got is None else (got.status.value, got.reason)) == expected


def test_devices_a_rollout_was_given_up_for_are_named_when_its_message_does_not() -> None:
    state = RolloutState(
        "det",
        3,
        2,
        phase=RolloutPhase.ROLLED_BACK,
        reason="AnalysisFailed",
        message="revision 3 (2.0.0) failed the canary analysis at step 1 of 2 (50%): error rate",
        failed={f"dev-{i}": "AnalysisFailed: error rate" for i in range(5)},
    )
    got = rollout_condition(state, "2.0.0", "1.1.0", failing_now=1)
    assert got is not None
    assert "(on dev-0, dev-1, dev-2 and 2 more)" in got.message
    assert "1 device(s) fail revision 2 now" in got.message


def test_every_time_in_the_rollouts_status_is_rfc3339() -> None:
    shown = rollout_json(ROLLED_BACK, "2.0.0", "1.1.0")
    assert shown["startedAt"] == "2026-01-01T00:00:00Z"
    assert shown["changedAt"] == "2026-01-01T00:00:30Z"
    assert epoch_of(shown["changedAt"]) == T + 30
    never = rollout_json(RolloutState("det", 1, 1), "1.0.0", "1.0.0")
    assert never["startedAt"] is None and never["changedAt"] is None


@pytest.mark.parametrize(
    ("versions", "rollout", "expected"),
    [
        ({"1.1.0": 2}, {"phase": "RolledBack", "version": "2.0.0", "stableVersion": "1.1.0"},
         "det:1.1.0 (2.0.0 rolled back)"),
        ({}, {"phase": "RolledBack", "version": "2.0.0", "stableVersion": "1.1.0"},
         "det:1.1.0 (2.0.0 rolled back)"),  # nothing serves: what is sent
        ({"1.1.0": 3, "2.0.0": 1}, {"phase": "Progressing", "version": "2.0.0"},
         "det:1.1.0,2.0.0"),  # the most served first
        ({"2.0.0": 2}, {"phase": "Complete", "version": "2.0.0"}, "det:2.0.0"),
        ({}, None, "det:2.0.0"),  # nothing serves yet, or an older hub: what it asks for
    ],
)  # fmt: skip
def test_the_model_column_shows_what_serves(
    versions: dict[str, int], rollout: dict[str, Any] | None, expected: str
) -> None:
    status: dict[str, Any] = {
        "versions": {v: {"devices": n, "ready": n} for v, n in versions.items()}
    }
    if rollout is not None:
        status["rollout"] = rollout
    doc = {"spec": {"model": {"name": "det", "version": "2.0.0"}}, "status": status}
    assert serving_model(doc) == expected


def test_describe_after_a_rollback_names_the_rollout_and_its_failing_devices() -> None:
    doc = {
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {"model": {"name": "det", "version": "2.0.0"}, "replicas": {"perDevice": 1}},
        "status": rolled_back_status(),
    }
    page = describe_deployment(doc, [], now=T + 60)
    assert "RollingOut" not in page
    assert "Progressing   False    RolledBack" in page
    assert "revision 3 (2.0.0) RolledBack (RevisionFailed), stable revision 2 (1.1.0)" in page
    assert "dev-0: 2.0.0 Failed: ModelLoadFailed (revision 3, rolled back)" in page
    assert "Failing devices:  <none>" not in page
