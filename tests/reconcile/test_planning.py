"""The pure planner as tables: desired + observed + now in, actions and status out.

Desired workloads come from real ModelDeployment documents (``parse_manifest``); observations
are built by hand. No clock, no processes, no event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from edged.reconcile.model import (
    Action,
    ForgetReplica,
    KillReplica,
    ObservedWorkload,
    Phase,
    RefetchArtifact,
    ReplicaObservation,
    StartReplica,
    StopReplica,
)
from edged.reconcile.planning import RESTART_MAX_S, plan, replica_id, restart_delay
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import API_VERSION, ModelDeployment, parse_manifest
from edgefleet.api.conditions import Condition, ConditionStatus

NAME = WorkloadName("mnist")
SHA = "a" * 64
OLD_SHA = "b" * 64
STARTUP_TIMEOUT = 10.0
T = 1000.0  # "now" of most cases, monotonic seconds


def deployment(replicas: int = 2, **spec: Any) -> ModelDeployment:
    return parse_manifest(
        {
            "apiVersion": API_VERSION,
            "kind": "ModelDeployment",
            "metadata": {"name": NAME},
            "spec": {
                "model": {"name": "mnist", "version": "1.0"},
                "replicas": {"perDevice": replicas},
                "probes": {"startup": {"timeoutSeconds": STARTUP_TIMEOUT}},
                **spec,
            },
        }
    )


def desired(replicas: int = 2, sha: str = SHA) -> DesiredWorkload:
    return DesiredWorkload(deployment(replicas), sha, "mnist.yaml")


REV = desired().revision
OLD = desired(sha=OLD_SHA).revision


def rep(slot: int, phase: Phase, revision: str = REV, **kw: Any) -> ReplicaObservation:
    kw.setdefault("started_at", T - 100)
    if phase is Phase.READY:
        kw.setdefault("ready_since", T - 90)
    return ReplicaObservation(
        replica_id=replica_id(NAME, revision, slot),
        revision=revision,
        slot=slot,
        phase=phase,
        pid=None if phase is Phase.EXITED else 1000 + slot,
        **kw,
    )


def exited(slot: int, streak: int, at: float, revision: str = REV, **kw: Any) -> ReplicaObservation:
    return rep(slot, Phase.EXITED, revision, exited_at=at, crash_streak=streak, **kw)


def start(slot: int, revision: str = REV) -> StartReplica:
    return StartReplica(NAME, replica_id(NAME, revision, slot), revision, slot)


def stop(slot: int, reason: str, revision: str = REV) -> StopReplica:
    return StopReplica(NAME, replica_id(NAME, revision, slot), reason)


def forget(slot: int, revision: str = REV) -> ForgetReplica:
    return ForgetReplica(NAME, replica_id(NAME, revision, slot))


def kill(slot: int, reason: str) -> KillReplica:
    message = {
        "StartupTimeout": f"model not loaded and warmed up within {STARTUP_TIMEOUT:g}s",
        "LivenessFailed": "the worker stopped answering probes",
    }[reason]
    return KillReplica(NAME, replica_id(NAME, REV, slot), reason, message)


@dataclass(frozen=True)
class Case:
    replicas: tuple[ReplicaObservation, ...] = ()
    want: int | None = 2  # None: the workload is no longer desired
    now: float = T
    artifact_present: bool = True
    artifact_quarantined: bool = False
    actions: tuple[Action, ...] = ()
    phase: str | None = "Running"  # None: no status at all
    ready: int = 0
    requeue_after: float | None = None
    conditions: dict[str, str] = field(default_factory=dict)  # type -> reason, a subset


CASES = {
    # -- starting and running ------------------------------------------------------------------
    "nothing running starts every slot": Case(
        actions=(start(0), start(1)),
        phase="Pending",
        conditions={"Ready": "NoReplicaReady"},
    ),
    "missing slot is started next to a ready one": Case(
        replicas=(rep(0, Phase.READY),),
        actions=(start(1),),
        phase="Degraded",
        ready=1,
    ),
    "all replicas ready: empty plan": Case(
        replicas=(rep(0, Phase.READY), rep(1, Phase.READY)),
        ready=2,
        conditions={"Ready": "AllReplicasReady"},
    ),
    "unready but live replica is left alone": Case(
        replicas=(rep(0, Phase.READY), rep(1, Phase.UNREADY)),
        phase="Degraded",
        ready=1,
        conditions={"Ready": "Serving"},
    ),
    # -- crash-loop backoff --------------------------------------------------------------------
    "exited once: waits out the 1s backoff": Case(
        replicas=(rep(0, Phase.READY), exited(1, streak=1, at=T - 0.25)),
        actions=(),
        phase="Degraded",
        ready=1,
        requeue_after=0.75,
    ),
    "exited once: restarted after the backoff": Case(
        replicas=(rep(0, Phase.READY), exited(1, streak=1, at=T - 1)),
        actions=(start(1),),
        phase="Degraded",
        ready=1,
    ),
    "crash streak 3: waits 4s, CrashLoopBackOff with the exit reason": Case(
        replicas=(
            exited(0, streak=3, at=T - 1, exit_reason="OOMKilled", exit_message="killed"),
            exited(1, streak=3, at=T - 1, exit_reason="OOMKilled", exit_message="killed"),
        ),
        phase="Failed",
        requeue_after=3.0,
        conditions={"Ready": "NoReplicaReady", "CrashLoopBackOff": "OOMKilled"},
    ),
    "crash streak 3: restarted after 4s, still CrashLoopBackOff": Case(
        replicas=(rep(0, Phase.READY), exited(1, streak=3, at=T - 4, exit_reason="Error")),
        actions=(start(1),),
        phase="Degraded",
        ready=1,
        conditions={"CrashLoopBackOff": "Error"},
    ),
    "crash streak 1 is not a crash loop": Case(
        replicas=(rep(0, Phase.READY), exited(1, streak=1, at=T - 5, exit_reason="Error")),
        actions=(start(1),),
        phase="Degraded",
        ready=1,
        conditions={"Ready": "Serving"},
    ),
    # -- probes --------------------------------------------------------------------------------
    "starting within the startup timeout: requeued at the deadline": Case(
        replicas=(rep(0, Phase.READY), rep(1, Phase.STARTING, started_at=T - 4)),
        phase="Degraded",
        ready=1,
        requeue_after=STARTUP_TIMEOUT - 4,
    ),
    "startup timeout kills the replica": Case(
        replicas=(rep(0, Phase.READY), rep(1, Phase.STARTING, started_at=T - STARTUP_TIMEOUT)),
        actions=(kill(1, "StartupTimeout"),),
        phase="Degraded",
        ready=1,
    ),
    "ready but not live: killed": Case(
        replicas=(rep(0, Phase.READY), rep(1, Phase.READY, live=False)),
        actions=(kill(1, "LivenessFailed"),),
        phase="Degraded",
        ready=1,
    ),
    "unready and not live: killed": Case(
        replicas=(rep(0, Phase.UNREADY, live=False), rep(1, Phase.READY)),
        actions=(kill(0, "LivenessFailed"),),
        phase="Degraded",
        ready=1,
    ),
    # -- scaling -------------------------------------------------------------------------------
    "scale down stops the extra slots, forgets exited ones": Case(
        want=1,
        replicas=(
            rep(0, Phase.READY),
            rep(1, Phase.READY),
            rep(2, Phase.STARTING),
            exited(3, streak=1, at=T - 1),
        ),
        actions=(stop(1, "ScaledDown"), stop(2, "ScaledDown"), forget(3)),
        ready=1,
    ),
    "scale down: a slot already stopping is left to finish": Case(
        want=1,
        replicas=(rep(0, Phase.READY), rep(1, Phase.STOPPING)),
        ready=1,
    ),
    "replicas 0 with nothing running: empty plan": Case(
        want=0,
        conditions={"Ready": "ScaledToZero"},
    ),
    "replicas 0 stops what runs": Case(
        want=0,
        replicas=(rep(0, Phase.READY), rep(1, Phase.STARTING)),
        actions=(stop(0, "ScaledDown"), stop(1, "ScaledDown")),
        conditions={"Ready": "ScaledToZero"},
    ),
    # -- revision change (zero-downtime switch) ------------------------------------------------
    "new revision: new slots start, old keeps serving": Case(
        replicas=(rep(0, Phase.READY, OLD), rep(1, Phase.READY, OLD)),
        actions=(start(0), start(1)),
        phase="Progressing",
        ready=2,
        conditions={"Ready": "Serving", "Progressing": "NewRevisionStarting"},
    ),
    "new revision partly ready: old is not stopped": Case(
        replicas=(
            rep(0, Phase.READY, OLD),
            rep(1, Phase.READY, OLD),
            rep(0, Phase.READY),
            rep(1, Phase.STARTING, started_at=T - 1),
        ),
        phase="Progressing",
        ready=3,
        requeue_after=STARTUP_TIMEOUT - 1,
        conditions={"Progressing": "NewRevisionStarting"},
    ),
    "new revision crash-looping: old keeps serving": Case(
        replicas=(
            rep(0, Phase.READY, OLD),
            exited(0, streak=4, at=T - 1, exit_reason="ModelLoadFailed"),
            exited(1, streak=4, at=T - 1, exit_reason="ModelLoadFailed"),
        ),
        phase="Progressing",
        ready=1,
        requeue_after=7.0,
        conditions={"CrashLoopBackOff": "ModelLoadFailed", "Progressing": "NewRevisionStarting"},
    ),
    "new revision all ready: old stopped": Case(
        replicas=(
            rep(0, Phase.READY, OLD),
            rep(1, Phase.STARTING, OLD),
            rep(0, Phase.READY),
            rep(1, Phase.READY),
        ),
        actions=(stop(0, "Superseded", OLD), stop(1, "Superseded", OLD)),
        ready=2,
        conditions={"Ready": "AllReplicasReady"},
    ),
    "old revision exited: forgotten; stopping: left alone": Case(
        replicas=(
            exited(0, streak=1, at=T - 1, revision=OLD),
            rep(1, Phase.STOPPING, OLD),
            rep(0, Phase.READY),
            rep(1, Phase.READY),
        ),
        actions=(forget(0, OLD),),
        ready=2,
    ),
    # -- removal -------------------------------------------------------------------------------
    "not desired: everything stopped or forgotten, Terminating": Case(
        want=None,
        replicas=(
            rep(0, Phase.READY),
            rep(1, Phase.STOPPING),
            exited(2, streak=1, at=T - 1),
            rep(0, Phase.STARTING, OLD),
        ),
        actions=(stop(0, "NoLongerDesired"), forget(2), stop(0, "NoLongerDesired", OLD)),
        phase="Terminating",
    ),
    "not desired and nothing left: empty plan, no status": Case(want=None, phase=None),
    # -- artifact ------------------------------------------------------------------------------
    "artifact missing: refetched, nothing started": Case(
        artifact_present=False,
        actions=(RefetchArtifact(NAME),),
        phase="Pending",
        conditions={"ArtifactAvailable": "ArtifactMissing", "Ready": "NoReplicaReady"},
    ),
    "artifact rotted and quarantined: refetched, and the condition says so": Case(
        artifact_present=False,
        artifact_quarantined=True,
        replicas=(exited(0, streak=1, at=T - 10),),
        actions=(RefetchArtifact(NAME),),
        phase="Pending",
        conditions={"ArtifactAvailable": "ArtifactQuarantined"},
    ),
    "artifact missing: an exited slot is not restarted": Case(
        artifact_present=False,
        replicas=(rep(0, Phase.READY), exited(1, streak=1, at=T - 10)),
        actions=(RefetchArtifact(NAME),),
        phase="Degraded",
        ready=1,
        conditions={"ArtifactAvailable": "ArtifactMissing"},
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_plan(case: Case) -> None:
    want = None if case.want is None else desired(case.want)
    observed = ObservedWorkload(case.replicas, case.artifact_present, case.artifact_quarantined)

    result = plan(NAME, want, observed, case.now)

    assert result.actions == case.actions
    assert result.requeue_after == case.requeue_after
    if case.phase is None:
        assert result.status is None
        return
    assert result.status is not None
    assert result.status.phase == case.phase
    assert result.status.ready_replicas == case.ready
    assert result.status.desired_replicas == (case.want or 0)
    found = {c.type: c.reason for c in result.status.conditions}
    assert found | case.conditions == found, f"conditions: {found}"
    assert plan(NAME, want, observed, case.now) == result  # deterministic


def test_crash_loop_condition_names_the_replica_and_the_exit() -> None:
    observed = ObservedWorkload(
        (
            exited(0, streak=2, at=T),
            exited(1, streak=5, at=T, exit_reason="OOMKilled", exit_message="memory.max reached"),
        ),
    )
    status = plan(NAME, desired(), observed, T).status
    assert status is not None
    (cond,) = [c for c in status.conditions if c.type == "CrashLoopBackOff"]
    assert cond.status is ConditionStatus.TRUE
    assert cond.reason == "OOMKilled"
    assert cond.message == (
        f"{replica_id(NAME, REV, 1)} failed 5 times in a row: OOMKilled: memory.max reached"
    )


def test_worker_conditions_are_reported_once() -> None:
    fallback = Condition("ProviderFallback", ConditionStatus.TRUE, "CUDAUnavailable", "on CPU")
    observed = ObservedWorkload(
        (rep(0, Phase.READY, conditions=(fallback,)), rep(1, Phase.READY, conditions=(fallback,)))
    )
    status = plan(NAME, desired(), observed, T).status
    assert status is not None
    assert [c for c in status.conditions if c.type == "ProviderFallback"] == [fallback]


def test_exit_at_time_zero_is_still_restarted_after_backoff() -> None:
    observed = ObservedWorkload((exited(0, streak=1, at=0.0), exited(1, streak=1, at=0.0)))
    assert plan(NAME, desired(), observed, 0.5).requeue_after == 0.5
    assert plan(NAME, desired(), observed, 1.0).actions == (start(0), start(1))


@pytest.mark.parametrize(
    ("streak", "delay"),
    [(0, 0.0), (1, 1.0), (2, 2.0), (3, 4.0), (9, 256.0), (10, RESTART_MAX_S), (5000, 300.0)],
)
def test_restart_delay(streak: int, delay: float) -> None:
    assert restart_delay(streak) == delay


REVISION_CASES = {
    "replica count": ({"replicas": {"perDevice": 5}}, False),
    "probes": ({"probes": {"startup": {"timeoutSeconds": 99}}}, False),
    "resources": ({"resources": {"cpu": "500m"}}, True),
    "runtime": ({"runtime": {"maxBatchSize": 4}}, True),
    "model version": ({"model": {"name": "mnist", "version": "2.0"}}, True),
}


@pytest.mark.parametrize(("spec", "changes"), REVISION_CASES.values(), ids=REVISION_CASES.keys())
def test_revision_changes_only_with_what_needs_new_workers(
    spec: dict[str, Any], changes: bool
) -> None:
    doc = deployment().to_dict()
    doc["spec"].update(spec)
    changed = DesiredWorkload(parse_manifest(doc), SHA)
    assert (changed.revision != REV) is changes
    assert DesiredWorkload(deployment(), OLD_SHA).revision != REV


def test_a_rollout_restart_annotation_changes_the_revision_and_other_annotations_do_not() -> None:
    def with_annotations(annotations: dict[str, str]) -> str:
        doc = deployment().to_dict()
        doc["metadata"]["annotations"] = annotations
        return DesiredWorkload(parse_manifest(doc), SHA).revision

    assert with_annotations({"note": "x"}) == REV
    restarted = with_annotations({"edgefleet.io/restartedAt": "2026-12-06T23:00:00.000Z"})
    assert restarted != REV
    assert restarted != with_annotations({"edgefleet.io/restartedAt": "2026-12-06T23:00:01.000Z"})


def _old(slot: int, phase: Phase) -> ReplicaObservation:
    return rep(slot, phase, OLD, model_version="0.9", sha256=OLD_SHA)


# observed replicas (2 wanted) -> each revision's (version, phase, ready, reason, wanted)
REVISION_CASES = [
    ("nothing started yet", [], [("1.0", "Loading", 0, "", True)]),
    (
        "one of two ready: the revision serves",
        [rep(0, Phase.READY), rep(1, Phase.STARTING)],
        [("1.0", "Ready", 1, "", True)],
    ),
    (
        "switch in progress: the old revision still serves",
        [
            rep(0, Phase.STARTING),
            rep(1, Phase.STARTING),
            _old(0, Phase.READY),
            _old(1, Phase.READY),
        ],
        [("1.0", "Loading", 0, "", True), ("0.9", "Ready", 2, "", False)],
    ),
    (
        "switch done: the old revision drains",
        [rep(0, Phase.READY), rep(1, Phase.READY), _old(0, Phase.STOPPING), _old(1, Phase.READY)],
        [("1.0", "Ready", 2, "", True), ("0.9", "Draining", 0, "", False)],
    ),
    (
        "the new revision crash-loops: Failed with the worker's error; the old one serves",
        [
            exited(0, 3, T - 0.5, exit_reason="ModelLoadFailed", exit_message="no such op"),
            exited(1, 2, T - 0.5, exit_reason="ModelLoadFailed", exit_message="no such op"),
            _old(0, Phase.READY),
            _old(1, Phase.READY),
        ],
        [("1.0", "Failed", 0, "ModelLoadFailed", True), ("0.9", "Ready", 2, "", False)],
    ),
    (
        "a single crash is not yet Failed",
        [exited(0, 1, T - 0.5, exit_reason="ModelLoadFailed"), rep(1, Phase.STARTING)],
        [("1.0", "Loading", 0, "", True)],
    ),
    (
        "exited old replicas are not held",
        [rep(0, Phase.READY), rep(1, Phase.READY), exited(0, 1, T - 5, OLD)],
        [("1.0", "Ready", 2, "", True)],
    ),
]


@pytest.mark.parametrize(
    ("observed", "expected"),
    [c[1:] for c in REVISION_CASES],
    ids=[c[0] for c in REVISION_CASES],
)
def test_revisions_in_status(
    observed: list[ReplicaObservation], expected: list[tuple[str, str, int, str, bool]]
) -> None:
    p = plan(NAME, desired(), ObservedWorkload(tuple(observed)), T)
    assert p.status is not None
    got = [
        (r.model_version, r.phase.value, r.ready_replicas, r.reason, r.wanted)
        for r in p.status.revisions
    ]
    assert got == expected
    assert p.status.revisions[0].sha256 == SHA
    assert p.status.revisions[0].revision == REV


def test_a_missing_artifact_leaves_the_revision_pending() -> None:
    p = plan(NAME, desired(), ObservedWorkload(artifact_present=False), T)
    assert p.status is not None
    (only,) = p.status.revisions
    assert (only.phase.value, only.reason) == ("Pending", "ArtifactMissing")
