"""The autoscaler of one workload (pure: the sample, the bounds and ``now`` in): edged runs it
per device (``edged/reconcile/sizing.py``), the hub for the fleet's ``replicas.total``
(``hub/decide/autoscale.py``), so both have the same semantics and windows.

Kubernetes HPA semantics, with the two triggers of ``spec.scaling``:

* Each sample gives a *recommendation*. Up: when the requests in flight per ready replica
  (time-averaged over the sample period) are above ``queueDepthUp``, enough replicas for the
  requests in flight to be at most ``queueDepthUp`` each (``ceil(inflight / queueDepthUp)``,
  never fewer than now). Down: when the workers' CPU is below ``cpuDownBelow`` percent of what
  they may use and every wanted replica is ready, ``ceil(ready * cpu / cpuDownBelow)`` (the
  replicas the same work needs to stay under the threshold), and never fewer than the queue
  needs. Otherwise the current count.
* Stabilization, exactly as the HPA controller's ``stabilizeRecommendationWithBehaviors``: the
  count goes up only to the *lowest* recommendation of the scale-up window and down only to
  the *highest* of the scale-down window; so a change needs every sample over its window to
  agree, and a load that oscillates around a threshold changes nothing. One addition: before
  the first sample of a workload its recommendation counts as the current count, so a window
  must be covered by samples (an edged that just started does not scale down at once).
* Bounds: ``minReplicas..maxReplicas`` always; a scale-up also stops at what the device holds
  (cores, and memory above the eviction floor: :class:`Bounds`), never below the current count.

Every change is a :class:`Decision` with the figures that caused it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from edgefleet.api.deployments import Scaling


@dataclass(frozen=True, slots=True)
class LoadSample:
    """One workload over the last sample period."""

    ready: int  # ready replicas
    inflight: float  # requests in flight, all replicas together, averaged over the period
    cpu_percent: float | None  # the ready workers' CPU, % of what they may use (None: unknown)


@dataclass(frozen=True, slots=True)
class Bounds:
    """How many replicas of this workload the device can hold (None: no bound known)."""

    cpu: int | None = None
    memory: int | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """A change of the wanted replica count, with what caused it."""

    at: float  # monotonic seconds
    from_replicas: int
    to_replicas: int
    reason: str  # QueueDepthHigh, CpuLow, BelowMinimum, AboveMaximum
    message: str

    def to_json(self) -> dict[str, object]:
        return {
            "from": self.from_replicas,
            "to": self.to_replicas,
            "reason": self.reason,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class ScalerState:
    """What the autoscaler keeps of one workload between samples."""

    current: int  # the replica count it wants now
    since: float  # when it started sampling this workload
    history: tuple[tuple[float, int], ...] = ()  # (time, recommendation), oldest first
    last: Decision | None = None
    last_sample: LoadSample | None = None


def initial_state(scaling: Scaling, spec_replicas: int, now: float) -> ScalerState:
    """The spec's count (``replicas.perDevice``) brought within the scaling bounds."""
    return ScalerState(current=_clamp(spec_replicas, scaling), since=now)


def _clamp(n: int, scaling: Scaling) -> int:
    return max(scaling.min_replicas, min(scaling.max_replicas, n))


def recommend(
    scaling: Scaling, current: int, sample: LoadSample, bounds: Bounds
) -> tuple[int, str, str]:
    """The count this one sample asks for, why, and the figures (no stabilization)."""
    ready, inflight = sample.ready, sample.inflight
    q = scaling.queue_depth_up
    if ready == 0:
        return current, "", "no ready replica to measure"
    per = inflight / ready
    if q is not None and per > q:
        want = max(current, math.ceil(inflight / q))
        cap = max(current, _cap(scaling, bounds))
        message = (
            f"{inflight:.1f} requests in flight over {ready} ready replica(s): "
            f"{per:.1f} per replica, above queueDepthUp {q}"
        )
        if want > cap:
            message += f"; {want} wanted, {_bound_text(scaling, bounds, cap)}"
            want = cap
        return want, "QueueDepthHigh", message
    d = scaling.cpu_down_below
    cpu = sample.cpu_percent
    if d is not None and cpu is not None and cpu < d and ready >= current:
        want = max(scaling.min_replicas, math.ceil(ready * cpu / d))
        if q is not None:
            want = max(want, math.ceil(inflight / q))
        if want < current:
            return (
                want,
                "CpuLow",
                f"workers' CPU {cpu:.1f}% of their share over {ready} ready replica(s), "
                f"below cpuDownBelow {d}%; {per:.1f} requests in flight per replica",
            )
    return current, "", ""


def _cap(scaling: Scaling, bounds: Bounds) -> int:
    cap = scaling.max_replicas
    for bound in (bounds.cpu, bounds.memory):
        if bound is not None:
            cap = min(cap, bound)
    return max(cap, scaling.min_replicas)


def _bound_text(scaling: Scaling, bounds: Bounds, cap: int) -> str:
    if cap >= scaling.max_replicas:
        return f"maxReplicas is {scaling.max_replicas}"
    if bounds.cpu is not None and bounds.cpu <= cap:
        return f"the device's cores hold {bounds.cpu}"
    return f"the device's memory holds {bounds.memory}"


def autoscale(
    scaling: Scaling, state: ScalerState, sample: LoadSample, bounds: Bounds, now: float
) -> tuple[ScalerState, Decision | None]:
    """The next state and, when the wanted count changes, the decision."""
    current = state.current
    rec, reason, message = recommend(scaling, current, sample, bounds)
    up_w, down_w = scaling.scale_up_window_s, scaling.scale_down_window_s
    keep_after = now - max(up_w, down_w)
    history = (*tuple(h for h in state.history if h[0] > keep_after), (now, rec))
    up = min([rec] + [r for t, r in history if t > now - up_w])
    down = max([rec] + [r for t, r in history if t > now - down_w])
    if state.since > now - up_w:  # the window is not covered by samples yet
        up = min(up, current)
    if state.since > now - down_w:
        down = max(down, current)
    new = current
    new = max(new, up)
    new = min(new, down)
    bounded = _clamp(new, scaling)
    if bounded != new:
        reason = "BelowMinimum" if bounded > new else "AboveMaximum"
        message = f"scaling bounds are {scaling.min_replicas}..{scaling.max_replicas}"
    elif new != current:
        window = up_w if new > current else down_w
        message += f" (every sample for {window:g}s)"
    new = bounded
    decision = None
    if new != current:
        decision = Decision(now, current, new, reason, message)
    state = replace(
        state,
        current=new,
        history=history,
        last=decision or state.last,
        last_sample=sample,
    )
    return state, decision
