"""Eviction by priority under memory pressure (pure: the memory reading and ``now`` in).

When ``MemAvailable`` is below the floor (``[eviction] memoryAvailableFloor`` in edged.toml),
one replica of the lowest-priority workload that runs any is stopped, then the next after
``settle_s`` (its memory must come back first), and so on while the pressure lasts. A
replica is evicted only to protect a workload of *higher* priority: the workloads of the
highest priority running are never evicted (the kernel's OOM killer, steered by
``oom_score_adj``, is what remains for them). Ties: the workload with the most replicas
running, then by name.

Evicted replicas come back one at a time, highest priority first, when ``MemAvailable`` is at
least the floor plus the hysteresis plus what one replica of that workload was seen to use,
and ``settle_s`` after the previous action: so a restore does not push the device back under
the floor, and the count does not flap.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from edged.config import EvictionConfig


@dataclass(frozen=True, slots=True)
class Candidate:
    """A workload as eviction sees it."""

    name: str
    priority: int
    wanted: int  # replicas it wants without eviction (spec or autoscaler)
    replica_bytes: int | None = None  # the most one of its replicas was seen to use


@dataclass(frozen=True, slots=True)
class EvictionState:
    evicted: dict[str, int] = field(default_factory=dict)  # workload -> replicas stopped
    last_action_at: float | None = None
    stuck: bool = False  # under pressure with nothing that may be evicted (said once)


@dataclass(frozen=True, slots=True)
class EvictionEvent:
    kind: str  # "evicted", "restored", "nothing to evict"
    workload: str
    message: str


@dataclass(frozen=True, slots=True)
class EvictionPolicy:
    floor_bytes: int
    hysteresis_bytes: int
    settle_s: float

    @classmethod
    def from_config(cls, config: EvictionConfig) -> EvictionPolicy | None:
        """The policy edged.toml's ``[eviction]`` sets; None when eviction is off (no
        floor)."""
        if config.memory_available_floor <= 0:
            return None
        return cls(
            floor_bytes=config.memory_available_floor,
            hysteresis_bytes=config.memory_available_floor * config.hysteresis_percent // 100,
            settle_s=config.interval_s,
        )


def plan_eviction(
    policy: EvictionPolicy,
    state: EvictionState,
    candidates: list[Candidate],
    available: int | None,
    now: float,
) -> tuple[EvictionState, list[EvictionEvent]]:
    """The next eviction state and what changed."""
    by_name = {c.name: c for c in candidates}
    # workloads gone or wanting fewer replicas: their evictions lapse
    evicted = {
        name: min(n, by_name[name].wanted)
        for name, n in state.evicted.items()
        if name in by_name and min(n, by_name[name].wanted) > 0
    }
    state = replace(state, evicted=evicted)
    if available is None:
        return state, []
    settled = state.last_action_at is None or now - state.last_action_at >= policy.settle_s
    running = [c for c in candidates if c.wanted - evicted.get(c.name, 0) > 0]
    floor = policy.floor_bytes
    if available < floor:
        if not settled or not running:
            return state, []
        top = max(c.priority for c in running)
        victims = [c for c in running if c.priority < top]
        if not victims:
            if state.stuck:
                return state, []
            names = ", ".join(sorted(c.name for c in running))
            return replace(state, stuck=True), [
                EvictionEvent(
                    "nothing to evict",
                    "",
                    f"MemAvailable {_mib(available)} is below the floor {_mib(floor)}, but "
                    f"every running workload ({names}) has the highest priority here ({top})",
                )
            ]
        victim = min(
            victims, key=lambda c: (c.priority, -(c.wanted - evicted.get(c.name, 0)), c.name)
        )
        protected = sorted(c.name for c in running if c.priority > victim.priority)
        evicted[victim.name] = evicted.get(victim.name, 0) + 1
        left = victim.wanted - evicted[victim.name]
        return EvictionState(evicted, now, stuck=False), [
            EvictionEvent(
                "evicted",
                victim.name,
                f"MemAvailable {_mib(available)} is below the floor {_mib(floor)}: one replica "
                f"of priority {victim.priority} stopped ({left} of {victim.wanted} left) to "
                f"keep {', '.join(protected)} serving",
            )
        ]
    state = replace(state, stuck=False)
    if not evicted or not settled:
        return state, []
    back = max((by_name[name] for name in evicted), key=lambda c: (c.priority, c.name))
    need = floor + policy.hysteresis_bytes + (back.replica_bytes or 0)
    if available < need:
        return state, []
    evicted[back.name] -= 1
    if evicted[back.name] == 0:
        del evicted[back.name]
    return EvictionState(evicted, now), [
        EvictionEvent(
            "restored",
            back.name,
            f"MemAvailable {_mib(available)} is at least {_mib(need)} (the floor "
            f"{_mib(floor)}, hysteresis {_mib(policy.hysteresis_bytes)} and one replica's "
            f"{_mib(back.replica_bytes or 0)}): one replica started again "
            f"({evicted.get(back.name, 0)} still stopped)",
        )
    ]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f}Mi"
