"""Deployment status from device reports, as tables: counts come from the revisions a device
reports, never from the version it was asked for."""

from __future__ import annotations

import pytest

from edgefleet.api import ModelDeployment, parse_manifest
from hub.decide.devices import Device, DevicePhase, RevisionPhase, RevisionReport, WorkloadReport
from hub.decide.status import (
    broken_revisions,
    count_placeable,
    deployment_status,
    placement_warnings,
)

R = RevisionPhase
NEW, OLD = "sha-new", "sha-old"


def dep(version: str, selector: dict[str, str] | None = None) -> ModelDeployment:
    d = parse_manifest(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": "m"},
            "spec": {
                "model": {"name": "m", "version": version},
                "placement": {"nodeSelector": selector or {}},
            },
        }
    )
    assert isinstance(d, ModelDeployment)
    return d


def rev(
    version: str, phase: RevisionPhase, ready: int = 0, *, wanted: bool = False, reason: str = ""
) -> RevisionReport:
    sha = NEW if version == "2.0.0" else OLD
    return RevisionReport(version, sha, phase, ready, "r" + version, reason, "", wanted)


def device(name: str, *revisions: RevisionReport, phase: str = "Ready", per: int = 1) -> Device:
    report = WorkloadReport("2.0.0", "r", per, 0, revisions=revisions)
    return Device(name, phase=DevicePhase(phase), workloads={"m": report} if revisions else {})


# (description, revisions on one connected device, per-device replicas) ->
# (updated, ready, available, failing reason or None, version -> (devices, ready))
CASES = [
    ("serves the wanted version", [rev("2.0.0", R.READY, 1, wanted=True)], 1, (1, 1, 1, None)),
    (
        "switching: the old revision keeps serving while the new one loads",
        [rev("2.0.0", R.LOADING, wanted=True), rev("1.0.0", R.READY, 1)],
        1,
        (0, 0, 1, None),
    ),
    (
        "downloading the new one, the old one serves",
        [rev("2.0.0", R.DOWNLOADING, wanted=True), rev("1.0.0", R.READY, 1)],
        1,
        (0, 0, 1, None),
    ),
    (
        "the new revision failed to load: the old one serves, but not what is asked for",
        [rev("2.0.0", R.FAILED, wanted=True, reason="ModelLoadFailed"), rev("1.0.0", R.READY, 1)],
        1,
        (0, 0, 0, "2.0.0 Failed: ModelLoadFailed"),
    ),
    (
        "the new revision was refused by the trust gate",
        [rev("2.0.0", R.REFUSED, wanted=True, reason="MetadataRollback"), rev("1.0.0", R.READY, 1)],
        1,
        (0, 0, 0, "2.0.0 Refused: MetadataRollback"),
    ),
    (
        "the new one serves with 1 of 2 replicas",
        [rev("2.0.0", R.READY, 1, wanted=True), rev("1.0.0", R.READY, 2)],
        2,
        (1, 0, 1, None),
    ),
    (
        "the old one drains after the switch",
        [rev("2.0.0", R.READY, 1, wanted=True), rev("1.0.0", R.DRAINING)],
        1,
        (1, 1, 1, None),
    ),
    (
        "loading a first version: nothing serves",
        [rev("2.0.0", R.LOADING, wanted=True)],
        1,
        (0, 0, 0, None),
    ),
]


@pytest.mark.parametrize(("what", "revisions", "per", "want"), CASES, ids=[c[0] for c in CASES])
def test_one_device(
    what: str,
    revisions: list[RevisionReport],
    per: int,
    want: tuple[int, int, int, str | None],
) -> None:
    s = deployment_status(dep("2.0.0"), [device("a", *revisions, per=per)], {"a": ["m"]})
    assert (s.updated, s.ready, s.available, s.failing.get("a")) == want
    serving = {r.model_version for r in revisions if r.serves}
    assert set(s.versions) == serving


def test_a_disconnected_device_is_not_available() -> None:
    d = device("a", rev("2.0.0", R.READY, 1, wanted=True), phase="NotReady")
    s = deployment_status(dep("2.0.0"), [d], {"a": ["m"]})
    assert (s.desired, s.updated, s.ready, s.available) == (1, 1, 1, 0)


def test_another_artifact_with_the_same_version_is_not_updated() -> None:
    d = device("a", rev("2.0.0", R.READY, 1, wanted=True))
    s = deployment_status(dep("2.0.0"), [d], {"a": ["m"]}, model_sha256="other")
    assert s.updated == 0


def test_rollout_in_progress() -> None:
    devices = [
        device("a", rev("2.0.0", R.READY, 1, wanted=True)),
        device("b", rev("2.0.0", R.LOADING, wanted=True), rev("1.0.0", R.READY, 1)),
        device("c", rev("1.0.0", R.READY, 1, wanted=True)),  # not given 2.0.0 yet
        device("d"),  # nothing reported yet
        device("e", rev("2.0.0", R.FAILED, wanted=True, reason="ModelLoadFailed")),
        device("unassigned", rev("1.0.0", R.READY, 1)),
    ]
    assigned = {d.name: ["m"] for d in devices if d.name != "unassigned"}
    s = deployment_status(dep("2.0.0"), devices, assigned)
    assert (s.desired, s.updated, s.ready, s.available) == (5, 1, 1, 3)
    assert {v: (c.devices, c.ready) for v, c in s.versions.items()} == {
        "2.0.0": (1, 1),
        "1.0.0": (2, 2),
    }
    assert s.failing == {"e": "2.0.0 Failed: ModelLoadFailed"}
    available, progressing = s.conditions
    assert not available.status and available.message == "3 of 5 devices available"
    assert not progressing.status and progressing.reason == "RevisionFailed"
    assert "e (2.0.0 Failed: ModelLoadFailed)" in progressing.message


def test_complete() -> None:
    devices = [device(n, rev("2.0.0", R.READY, 1, wanted=True)) for n in "ab"]
    s = deployment_status(dep("2.0.0"), devices, {"a": ["m"], "b": ["m"]})
    assert (s.desired, s.updated, s.ready, s.available) == (2, 2, 2, 2)
    assert [bool(c.status) for c in s.conditions] == [True, False]
    assert s.to_json()["conditions"][1]["reason"] == "RolloutComplete"


def test_no_devices_is_not_all_devices_available() -> None:
    s = deployment_status(dep("2.0.0"), [], {}, model_pushed=False, placeable=0)
    types = {c.type: (bool(c.status), c.reason) for c in s.conditions}
    assert types == {
        "Available": (False, "NoDevices"),
        "Progressing": (False, "NoDevices"),
        "ModelPushed": (False, "ModelNotPushed"),
        "Placed": (False, "NoMatchingDevices"),
    }


def test_a_device_too_old_to_list_revisions() -> None:
    old = Device(
        "x",
        phase=DevicePhase.READY,
        workloads={
            "m": WorkloadReport(
                "2.0.0",
                conditions=({"type": "Ready", "status": "False", "reason": "ModelLoadFailed"},),
            )
        },
    )
    s = deployment_status(dep("2.0.0"), [old], {"x": ["m"]})
    assert s.failing == {"x": "ModelLoadFailed"}
    assert s.updated == 0


def test_placement() -> None:
    devices = [Device("a", labels={"site": "retail"}), Device("b", reported_labels={"site": "lab"})]
    assert count_placeable(dep("2.0.0", {"site": "retail"}), devices, "r") == 1
    assert count_placeable(dep("2.0.0", {"site": "moon"}), devices, "r") == 0
    assert placement_warnings(dep("2.0.0", {"site": "retail"}), devices, "r", True) == []
    warnings = placement_warnings(dep("2.0.0", {"site": "moon"}), devices, "r", False)
    assert len(warnings) == 2
    assert "m version 2.0.0 has not been pushed" in warnings[0]
    assert "nodeSelector site=moon matches no device" in warnings[1]


def test_broken_revisions_are_new_once() -> None:
    failed = rev("2.0.0", R.FAILED, wanted=True, reason="ModelLoadFailed")
    loading = WorkloadReport("2.0.0", revisions=(rev("2.0.0", R.LOADING, wanted=True),))
    broken = WorkloadReport("2.0.0", revisions=(failed,))
    assert broken_revisions({"m": loading}, {"m": broken}) == [("m", failed)]
    assert broken_revisions({"m": broken}, {"m": broken}) == []
    assert broken_revisions({}, {"m": broken}) == [("m", failed)]
