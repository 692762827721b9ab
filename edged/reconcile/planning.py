"""The pure planner: ``plan(desired, observed, now) -> Plan``.

No I/O, no clock (``now`` is passed in, monotonic seconds), no randomness: the same inputs
always give the same plan, so it is tested as a table. The applier performs the actions; the
runner requeues the key after ``Plan.requeue_after``.

Rules, for one workload:

* Replicas are slots ``0..n-1`` of the current revision. A missing slot is started; an
  exited one is restarted after a crash-loop backoff (1 s doubling to 5 min, by the slot's
  crash streak); one that has not passed its startup probe within ``startup.timeoutSeconds``
  or that fails liveness is killed (and then restarted with backoff). Slots beyond ``n`` stop.
* Zero-downtime switch: replicas of older revisions keep serving until every slot of the
  current revision is ready, then they are drained and stopped. A new revision that never
  becomes ready therefore never takes the old one down (``Progressing`` says why).
* A workload no longer desired has all its replicas stopped.
* The count of replicas is ``observed.wanted_replicas`` when the autoscaler or eviction set
  it (``edgefleet/autoscaler.py``, ``reconcile/evicting.py``), else the spec's; slots
  beyond it are drained and stopped (``ScaledDown``); their conditions join the status.
* The precision variant (``observed.precision``, ``reconcile/precision.py``) is part of the
  revision too: a power window opening or closing is a zero-downtime switch to the other file.
* Execution providers (``observed.providers``, chosen by discovery) are part of the revision:
  a fallback to a later provider, and the way back, is a zero-downtime switch. When no allowed
  provider is usable, every replica stops and ``AcceleratorUnavailable`` says why.
* Status (phase, ready count, conditions) is derived here too, so it always matches the plan,
  and so is each revision's own status (``WorkloadStatus.revisions``): the current revision
  Loading, Ready (some replica ready), Failed (crash-looping with none ready: the worker's
  error is the reason) or Pending (artifact missing); older ones Ready while they still serve,
  Draining once superseded. The hub counts a device as updated from these, never from the
  workload's ready count, which includes the old revision during a switch.
* The workload's last termination (:func:`last_termination`: the newest unasked-for end of
  any of its replicas, ``OOMKilled`` included) and its replicas' restarts, summed, are in the
  status too: one OOM kill followed by stable serving still reaches the hub.
"""

from __future__ import annotations

from edged.reconcile.model import (
    Action,
    ForgetReplica,
    KillReplica,
    ObservedWorkload,
    Phase,
    Plan,
    ProviderChoice,
    RefetchArtifact,
    ReplicaObservation,
    RevisionPhase,
    RevisionStatus,
    StartReplica,
    StopReplica,
    Termination,
    WorkloadStatus,
)
from edged.workloads import DesiredWorkload, ReplicaId, WorkloadName
from edgefleet.api.conditions import Condition, ConditionStatus
from edgefleet.backoff import Backoff

RESTART_BASE_S = 1.0
RESTART_MAX_S = 300.0
# No jitter: the plan is deterministic, and replicas of one device need no spreading out.
RESTART_BACKOFF = Backoff(RESTART_BASE_S, RESTART_MAX_S)
TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE


def restart_delay(crash_streak: int) -> float:
    """Crash-loop backoff before restarting a slot that failed ``crash_streak`` times in a row."""
    if crash_streak <= 0:
        return 0.0
    return RESTART_BACKOFF.delay(crash_streak - 1)


def replica_id(workload: str, revision: str, slot: int) -> ReplicaId:
    return ReplicaId(f"{workload}-{revision}-{slot}")


def plan(
    name: WorkloadName, desired: DesiredWorkload | None, observed: ObservedWorkload, now: float
) -> Plan:
    if desired is None:
        return _plan_removal(name, observed)
    choice = observed.providers
    if choice is not None and not choice.providers:
        return _plan_unrunnable(name, desired, observed, choice)
    actions: list[Action] = []
    waits: list[float] = []
    conditions: list[Condition] = []
    providers = choice.providers if choice is not None else ()
    precision = observed.precision
    variant = precision.sha256 if precision is not None else ""
    revision = desired.revision_with(providers if choice is not None else None, variant)
    if precision is not None and precision.recheck_after is not None:
        waits.append(precision.recheck_after)
    want = observed.wanted_replicas
    if want is None:
        want = desired.deployment.spec.replicas.count_on_device()
    startup_timeout = desired.deployment.spec.probes.startup.timeout_s

    current = {r.slot: r for r in observed.replicas if r.revision == revision}
    old = [r for r in observed.replicas if r.revision != revision]

    if not observed.artifact_present:
        actions.append(RefetchArtifact(name))
        if observed.artifact_quarantined:
            reason = "ArtifactQuarantined"
            message = (
                f"sha256:{desired.sha256} no longer matched its digest on disk and was moved "
                "to the store's quarantine; fetching it again"
            )
        else:
            reason = "ArtifactMissing"
            message = f"sha256:{desired.sha256} is not in the artifact store; fetching it again"
        conditions.append(Condition("ArtifactAvailable", FALSE, reason, message))

    crashlooping: list[ReplicaObservation] = []
    for slot in range(want):
        rep = current.get(slot)
        rid = replica_id(name, revision, slot)
        if rep is None:
            if observed.artifact_present:
                actions.append(StartReplica(name, rid, revision, slot, providers, variant))
            continue
        if rep.phase is Phase.EXITED:
            if rep.crash_streak >= 2:
                crashlooping.append(rep)
            exited_at = now if rep.exited_at is None else rep.exited_at
            due = exited_at + restart_delay(rep.crash_streak)
            if now >= due and observed.artifact_present:
                actions.append(StartReplica(name, rid, revision, slot, providers, variant))
            elif now < due:
                waits.append(due - now)
        elif rep.phase is Phase.STARTING:
            deadline = rep.started_at + startup_timeout
            if now >= deadline:
                actions.append(
                    KillReplica(
                        name,
                        rid,
                        "StartupTimeout",
                        f"model not loaded and warmed up within {startup_timeout:g}s",
                    )
                )
            else:
                waits.append(deadline - now)
        elif rep.phase in (Phase.READY, Phase.UNREADY) and not rep.live:
            actions.append(
                KillReplica(name, rid, "LivenessFailed", "the worker stopped answering probes")
            )

    for slot, rep in sorted(current.items()):
        if slot >= want and rep.phase is not Phase.STOPPING:
            actions.append(_retire(name, rep, "ScaledDown"))

    ready_current = [
        r for s, r in current.items() if s < want and r.phase is Phase.READY and r.live
    ]
    switch_done = len(ready_current) >= want
    for rep in old:
        if rep.phase is Phase.EXITED:
            actions.append(ForgetReplica(name, rep.replica_id))
        elif switch_done and rep.phase is not Phase.STOPPING:
            actions.append(StopReplica(name, rep.replica_id, "Superseded"))

    old_serving = [r for r in old if r.phase is Phase.READY]
    conditions += _conditions(
        want, ready_current, old_serving, crashlooping, list(current.values()), switch_done
    )
    conditions += observed.sizing_conditions
    if precision is not None:
        conditions += precision.conditions
    if choice is not None and choice.fell_back:
        conditions.append(
            Condition(
                "AcceleratorUnavailable",
                TRUE,
                "FellBack",
                f"running on {', '.join(providers)}: {choice.message}",
            )
        )
    ready_total = len(ready_current) + (0 if switch_done else len(old_serving))
    status = WorkloadStatus(
        phase=_phase(want, len(ready_current), old_serving, crashlooping, switch_done),
        ready_replicas=ready_total,
        desired_replicas=want,
        revision=revision,
        conditions=tuple(conditions),
        providers=providers,
        precision=precision.precision if precision is not None else "",
        revisions=_revisions(
            desired, revision, want, ready_current, old, crashlooping, switch_done, observed
        ),
        last_termination=last_termination(observed.replicas),
        restarts=sum(r.restarts for r in observed.replicas),
    )
    return Plan(tuple(actions), status, min(waits) if waits else None)


def last_termination(replicas: tuple[ReplicaObservation, ...]) -> Termination | None:
    """The newest end of a replica's worker that edged did not ask for (pure): its reason, the
    exit code or the signal (a negative ``exit_code`` observed), and when. Replicas that never
    ended so, or whose end has no time (an observation from before one was kept), give none."""
    ended = [r for r in replicas if r.exit_reason and r.finished_at is not None]
    if not ended:
        return None
    last = max(ended, key=lambda r: (r.finished_at or 0.0, r.replica_id))
    code = last.exit_code
    return Termination(
        replica=last.replica_id,
        reason=last.exit_reason,
        message=last.exit_message,
        exit_code=code if code is not None and code > 0 else 0,
        signal=-code if code is not None and code < 0 else 0,
        finished_at=last.finished_at,
    )


def _revisions(
    desired: DesiredWorkload,
    revision: str,
    want: int,
    ready_current: list[ReplicaObservation],
    old: list[ReplicaObservation],
    crashlooping: list[ReplicaObservation],
    switch_done: bool,
    observed: ObservedWorkload,
) -> tuple[RevisionStatus, ...]:
    """Each revision this workload holds: the current one first, then older ones by name."""
    reason = message = ""
    if ready_current or want == 0:
        phase = RevisionPhase.READY
    elif crashlooping:
        worst = max(crashlooping, key=lambda r: r.crash_streak)
        phase = RevisionPhase.FAILED
        reason = worst.exit_reason or "ReplicaCrashed"
        message = worst.exit_message or f"{worst.replica_id} failed {worst.crash_streak} times"
    elif not observed.artifact_present:
        phase, reason = RevisionPhase.PENDING, "ArtifactMissing"
    else:
        phase = RevisionPhase.LOADING
    model = desired.deployment.spec.model
    out = [
        RevisionStatus(
            revision,
            model.version,
            desired.sha256,
            phase,
            len(ready_current),
            reason,
            message,
            wanted=True,
        )
    ]
    by_revision: dict[str, list[ReplicaObservation]] = {}
    for rep in old:
        by_revision.setdefault(rep.revision, []).append(rep)
    for rev, reps in sorted(by_revision.items()):
        alive = [r for r in reps if r.phase is not Phase.EXITED]
        if not alive:
            continue
        ready = sum(1 for r in alive if r.phase is Phase.READY)
        serving = ready > 0 and not switch_done
        out.append(
            RevisionStatus(
                rev,
                reps[0].model_version,
                reps[0].sha256,
                RevisionPhase.READY if serving else RevisionPhase.DRAINING,
                ready if serving else 0,
            )
        )
    return tuple(out)


def _plan_unrunnable(
    name: WorkloadName, desired: DesiredWorkload, observed: ObservedWorkload, choice: ProviderChoice
) -> Plan:
    """No allowed execution provider is usable: stop every replica and say why."""
    actions = tuple(
        _retire(name, r, "AcceleratorUnavailable")
        for r in observed.replicas
        if r.phase is not Phase.STOPPING
    )
    want = desired.deployment.spec.replicas.count_on_device()
    status = WorkloadStatus(
        phase="Pending",
        ready_replicas=0,
        desired_replicas=want,
        revision=desired.revision,
        conditions=(
            Condition("Ready", FALSE, "AcceleratorUnavailable", "no allowed provider is usable"),
            Condition("AcceleratorUnavailable", TRUE, "NoUsableProvider", choice.message),
        ),
    )
    return Plan(actions, status, None)


def _retire(name: WorkloadName, rep: ReplicaObservation, reason: str) -> Action:
    if rep.phase is Phase.EXITED:
        return ForgetReplica(name, rep.replica_id)
    return StopReplica(name, rep.replica_id, reason)


def _plan_removal(name: WorkloadName, observed: ObservedWorkload) -> Plan:
    actions = tuple(
        _retire(name, r, "NoLongerDesired")
        for r in observed.replicas
        if r.phase is not Phase.STOPPING
    )
    status = None
    if observed.replicas:
        status = WorkloadStatus("Terminating", 0, 0, "", ())
    return Plan(actions, status, None)


def _phase(
    want: int,
    ready: int,
    old_serving: list[ReplicaObservation],
    crashlooping: list[ReplicaObservation],
    switch_done: bool,
) -> str:
    if want == 0 or (ready >= want and switch_done):
        return "Running"
    if old_serving:
        return "Progressing"
    if crashlooping and ready == 0:
        return "Failed"
    if ready > 0:
        return "Degraded"
    return "Pending"


def _conditions(
    want: int,
    ready_current: list[ReplicaObservation],
    old_serving: list[ReplicaObservation],
    crashlooping: list[ReplicaObservation],
    current: list[ReplicaObservation],
    switch_done: bool,
) -> list[Condition]:
    out: list[Condition] = []
    serving = len(ready_current) + (0 if switch_done else len(old_serving))
    if want == 0:
        out.append(Condition("Ready", TRUE, "ScaledToZero", "no replicas wanted"))
    elif len(ready_current) >= want:
        out.append(Condition("Ready", TRUE, "AllReplicasReady", f"{want}/{want} replicas ready"))
    elif serving > 0:
        out.append(
            Condition(
                "Ready",
                TRUE,
                "Serving",
                f"{serving} replica(s) serving; "
                f"{len(ready_current)}/{want} of the current revision ready",
            )
        )
    else:
        out.append(Condition("Ready", FALSE, "NoReplicaReady", f"0/{want} replicas ready"))
    if old_serving and not switch_done:
        out.append(
            Condition(
                "Progressing",
                TRUE,
                "NewRevisionStarting",
                f"previous revision keeps serving until {want} new replica(s) are ready",
            )
        )
    if crashlooping:
        worst = max(crashlooping, key=lambda r: r.crash_streak)
        detail = f": {worst.exit_reason}: {worst.exit_message}" if worst.exit_reason else ""
        out.append(
            Condition(
                "CrashLoopBackOff",
                TRUE,
                worst.exit_reason or "ReplicaCrashed",
                f"{worst.replica_id} failed {worst.crash_streak} times in a row{detail}",
            )
        )
    seen: set[tuple[str, str]] = set()
    for rep in current:
        for cond in rep.conditions:
            if (cond.type, cond.reason) not in seen:
                seen.add((cond.type, cond.reason))
                out.append(cond)
    return out
