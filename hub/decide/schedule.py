"""The scheduler: where the replicas of ``replicas.total`` deployments run (pure, no I/O, no clock).

:func:`schedule` takes the deployments, the devices as the scheduler sees them (:class:`Node`,
made from device records by :func:`node_of`), the current placements and ``now``, and returns
the placements, what was moved or evicted and why, and an explanation per deployment. Tested as
tables and hypothesis properties in ``tests/hub/test_hub_scheduling.py``; measured by
``bench/scheduling.py``.

One replica of a deployment per device (a device is the unit of failure at the edge): a
``total: 5`` deployment runs on five devices. ``perDevice`` deployments are placed by
:func:`hub.decide.placement.project` as before; they come in as ``pinned`` (they take capacity and
count
for affinity, and are never moved or evicted here).

How a pass goes:

1. **Keep** every current placement whose device still passes the hard filters that hold while
   a replica runs: NoExecute taints (unhealthy, untrusted, revoked), labels, region and zone,
   the accelerator. A device NotReady for longer than ``not_ready_grace_s`` loses its
   placements; NoSchedule taints (cordoned, NotReady within the grace) keep them, as a
   Kubernetes pod survives a cordon. Affinity is not checked again (as Kubernetes'
   ``IgnoredDuringExecution``). A device over capacity (or over the desired-state bound)
   loses its least important placements;
   a deployment over its ``total`` its lowest scored ones. A device NotReady is silent from
   its last heartbeat or the hub's start, whichever is later (:mod:`hub.decide.staleness`).
2. **Place** the missing replicas, deployments by priority (highest first) then name: devices
   that pass every filter (taints and tolerations, ``nodeSelector`` and ``matchExpressions``,
   regions, zones — for a deployment mounting a Secret, on the device's token labels too:
   :meth:`Fleet.trusted_filter` —, the accelerator's ``anyOf`` classes, deployment affinity
   and anti-affinity, capacity: cpu, memory and accelerator slots less what is placed, and the
   desired-state bound: the bytes each placement adds to the device's desired state,
   :class:`StateBound`), scored ``Spread`` (least allocated, the default) or ``BinPack`` (most
   allocated), devices already holding the artifact preferred; ``topologySpread`` places each
   replica in the domain with the fewest (``maxSkew``: never more than that above the emptiest
   domain).
3. **Preempt** when a replica fits nowhere: on the device where it needs the fewest evictions
   of strictly lower-priority placements (then the least important ones), those are evicted,
   each an :class:`Eviction` with its reason; their deployments, lower in the order, are placed
   again elsewhere in the same pass when they can be.

The same input scheduled twice moves nothing: kept placements come first and nothing is
re-balanced.

Devices are columns of numpy arrays and label values index sets, so a pass costs a few
vectorised operations per deployment, not a Python loop over devices per deployment.

Where each part is: what the scheduler takes and gives in :mod:`hub.decide.nodes`; the devices
as columns and what is placed on them in :mod:`hub.decide.columns`; filters and scores in
:mod:`hub.decide.filtering`; placing, preemption and the explanations here (:class:`Fleet`),
with :func:`schedule`, the pass.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from edgefleet.api import ModelDeployment
from hub.decide.filtering import FleetFilters
from hub.decide.nodes import (
    LATENCY_REASON,
    MAX_NAMED,
    MAX_VICTIMS_SEARCHED,
    SCORE_SPAN,
    TIE_BREAK,
    Eviction,
    Explanation,
    Ints,
    Mask,
    Node,
    Schedule,
    StateBound,
    accelerator_slots,
    node_of,
)
from hub.decide.placement import REGION_LABEL, ZONE_LABEL

# what callers import from here, kept in hub.decide.nodes and hub.decide.placement
__all__ = [
    "REGION_LABEL",
    "ZONE_LABEL",
    "Eviction",
    "Explanation",
    "Fleet",
    "Node",
    "Schedule",
    "StateBound",
    "accelerator_slots",
    "node_of",
    "schedule",
]


class Fleet(FleetFilters):
    """The devices as columns, with what is placed on them: the scheduler's working state.

    Built once per pass (:func:`schedule`); kept warm it places one more deployment in a few
    milliseconds (:meth:`place`), which is what the benchmark's incremental figure measures.
    """

    # -- placing ----------------------------------------------------------------------------
    def candidates(
        self, dep: ModelDeployment, now: float, grace_s: float
    ) -> tuple[Mask, list[tuple[str, Mask]]]:
        """Devices where one more replica may go, and the filters (for explanations)."""
        filters = self.filters(dep, running=False, now=now, grace_s=grace_s)
        filters += self.fits(dep)
        filters.append(("already running a replica", ~self.running(dep.metadata.name)))
        mask = np.ones(self.n, dtype=np.bool_)
        for _, m in filters:
            mask &= m
        return mask, filters

    def place(self, dep: ModelDeployment, *, now: float, grace_s: float) -> list[int]:
        """Place the replicas ``dep`` lacks where they score best (no preemption)."""
        name = dep.metadata.name
        if name not in self.deployments:
            self.know(dep)
        want = (dep.spec.replicas.total or 0) - len(self.placed.get(name, ()))
        if want <= 0:
            return []
        static = np.ones(self.n, dtype=np.bool_)
        for _, m in self.filters(dep, running=False, now=now, grace_s=grace_s):
            static &= m
        mask = static & ~self.running(name)
        for _, m in self.fits(dep):
            mask &= m
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            return []
        score = self.scores(dep, idx)
        if dep.spec.placement.topology_spread is None:
            if idx.size > want:
                top = np.argpartition(-score, want - 1)[:want]
                idx, score = idx[top], score[top]
            order = np.lexsort((idx, -score))
            chosen = [int(i) for i in idx[order][:want]]
        else:
            chosen = self._spread(dep, idx, score, want, static)
        for i in chosen:
            self.add(dep, i)
        return chosen

    def _spread(
        self,
        dep: ModelDeployment,
        idx: Ints,
        score: npt.NDArray[np.float64],
        want: int,
        static: Mask,
    ) -> list[int]:
        """Each replica into the domain with the fewest so far (its best device there);
        ``static``: devices passing every filter but capacity (their domains count for
        ``maxSkew``, even when full)."""
        spread = dep.spec.placement.topology_spread
        assert spread is not None
        codes, names = self.domains(spread.key)
        dom = codes[idx]  # every candidate has the label: "without label" is a filter
        count = [0] * len(names)
        for i in self.placed.get(dep.metadata.name, ()):
            if codes[i] >= 0:
                count[codes[i]] += 1
        present: list[int] = []
        if spread.max_skew is not None:
            seen = np.zeros(len(names), dtype=np.bool_)
            seen[codes[static]] = True
            present = np.flatnonzero(seen).tolist()
        # candidates by domain, then score (best first), then name: one sort of one key, as
        # scores are below SCORE_SPAN and differ by more than TIE_BREAK * devices when they differ
        key = dom * SCORE_SPAN
        key -= score
        key += idx * TIE_BREAK
        order = np.argsort(key)
        ranked = idx[order]
        bounds = np.searchsorted(dom[order], np.arange(len(names) + 1)).tolist()
        taken = [0] * len(names)
        heap = [(count[d], d) for d in range(len(names)) if bounds[d + 1] > bounds[d]]
        heapq.heapify(heap)
        chosen: list[int] = []
        while heap and len(chosen) < want:
            c, d = heapq.heappop(heap)  # the domain with the fewest replicas, its first device
            if spread.max_skew is not None:
                floor = min((count[p] for p in present), default=0)
                if c + 1 - floor > spread.max_skew:
                    break  # every other domain has at least as many
            chosen.append(int(ranked[bounds[d] + taken[d]]))
            taken[d] += 1
            count[d] += 1
            if bounds[d] + taken[d] < bounds[d + 1]:
                heapq.heappush(heap, (count[d], d))
        return chosen

    def preempt(
        self, dep: ModelDeployment, *, now: float, grace_s: float
    ) -> list[tuple[int, list[str]]]:
        """Place missing replicas by evicting the fewest, least important lower-priority
        placements; returns each device used with the deployments evicted there."""
        name = dep.metadata.name
        priority = dep.spec.effective_priority
        done: list[tuple[int, list[str]]] = []
        if not any(p < priority for p in self._priorities()):
            return done
        while (dep.spec.replicas.total or 0) > len(self.placed.get(name, ())):
            static = np.ones(self.n, dtype=np.bool_)
            for _, m in self.filters(dep, running=False, now=now, grace_s=grace_s):
                static &= m
            static &= ~self.running(name) & self._skew_allows(dep, static)
            static &= self._could_fit_evicting(dep, priority)
            best: tuple[tuple[int, int, int, int], int, list[str]] | None = None
            for i in map(int, np.flatnonzero(static)):
                lower = {d: p for d, p in self.on_device.get(i, {}).items() if p < priority}
                if not lower:
                    continue
                victims = self._fewest_victims(dep, i, lower)
                if not victims:  # None: evicting all is not enough; []: fits without
                    continue
                prios = [lower[v] for v in victims]
                key = (len(victims), max(prios), sum(prios), i)
                if best is None or key < best[0]:
                    best = (key, i, victims)
            if best is None:
                break
            _, i, victims = best
            for v in victims:
                self.remove(self.deployments[v], i)
            self.add(dep, i)
            done.append((i, victims))
        return done

    def _priorities(self) -> set[int]:
        """The priorities of the placements there are."""
        return {p for p, count in self._by_priority.items() if count > 0}

    def _could_fit_evicting(self, dep: ModelDeployment, priority: int) -> Mask:
        """Devices where evicting every lower-priority placement would make room (a bound
        that spares the exact search on devices that cannot help)."""
        cpu = self.cpu_cap - self.cpu_used
        mem = self.mem_cap - self.mem_used
        size = self.bytes_cap - self.bytes_used
        acc = {c: self._slots[c] - self._acc_used[c] for c in self._slots}
        for prio, use in self._prio_use.items():
            if prio >= priority:
                continue
            cpu += use["cpu"]
            mem += use["memory"]
            size += use["bytes"]
            for cls, count in use.items():
                if cls in acc:
                    acc[cls] += count
        res = dep.spec.resources
        ok = (cpu >= (res.cpu_millis or 0)) & (mem >= (res.memory_bytes or 0))
        ok &= size >= self.state_bytes(dep)
        if res.accelerators:
            choice, wanted = self.accelerator_choice(dep)
            room = np.zeros(self.n, dtype=np.bool_)
            for k, cls in enumerate(wanted):
                room |= (choice == k) & (acc[cls] >= 1)
            ok &= room
        return np.asarray(ok, dtype=np.bool_)

    def _skew_allows(self, dep: ModelDeployment, static: Mask) -> Mask:
        """Devices in domains where one more replica keeps ``maxSkew``."""
        spread = dep.spec.placement.topology_spread
        if spread is None or spread.max_skew is None:
            return np.ones(self.n, dtype=np.bool_)
        codes, names = self.domains(spread.key)
        counts = np.zeros(len(names) + 1, dtype=np.int64)
        for i in self.placed.get(dep.metadata.name, ()):
            counts[codes[i]] += 1
        eligible = np.unique(codes[static & (codes >= 0)])
        if eligible.size == 0:
            return np.zeros(self.n, dtype=np.bool_)
        floor = counts[eligible].min()
        allowed = counts + 1 - floor <= spread.max_skew
        return np.asarray(allowed[codes] & (codes >= 0), dtype=np.bool_)

    def _fewest_victims(
        self, dep: ModelDeployment, i: int, lower: Mapping[str, int]
    ) -> list[str] | None:
        need = self.free_after(i, dep)
        if need == (0, 0, 0, 0):
            return []
        names = sorted(lower, key=lambda d: (lower[d], d))
        gains = {v: self._gain(self.deployments[v], dep, i) for v in names}
        if len(names) > MAX_VICTIMS_SEARCHED:  # greedy, least important first
            picked: list[str] = []
            total = [0, 0, 0, 0]
            for v in names:
                picked.append(v)
                total = [a + b for a, b in zip(total, gains[v], strict=True)]
                if all(g >= n for g, n in zip(total, need, strict=True)):
                    return picked
            return None
        for k in range(1, len(names) + 1):
            best: tuple[tuple[int, int], list[str]] | None = None
            for combo in itertools.combinations(names, k):
                freed = [sum(gains[v][j] for v in combo) for j in range(len(need))]
                if all(g >= n for g, n in zip(freed, need, strict=True)):
                    key = (max(lower[v] for v in combo), sum(lower[v] for v in combo))
                    if best is None or key < best[0]:
                        best = (key, list(combo))
            if best is not None:
                return best[1]
        return None

    def _gain(
        self, victim: ModelDeployment, dep: ModelDeployment, i: int
    ) -> tuple[int, int, int, int]:
        vres = victim.spec.resources
        acc = 0
        for cls in dep.spec.resources.accelerators:
            if self.slots(cls)[i] > 0:
                acc = int(self._victim_class(victim, i) == cls)
                break
        return vres.cpu_millis or 0, vres.memory_bytes or 0, acc, self.state_bytes(victim)

    def _victim_class(self, victim: ModelDeployment, i: int) -> str | None:
        for cls in victim.spec.resources.accelerators:
            if self.slots(cls)[i] > 0:
                return cls
        return None

    def over_capacity(self, i: int) -> str | None:
        """Why device ``i`` holds more than it may (None: it does not)."""
        if self.cpu_used[i] > self.cpu_cap[i] or self.mem_used[i] > self.mem_cap[i]:
            return "device over capacity"
        if any(self._acc_used[c][i] > self._slots[c][i] for c in self._slots):
            return "device over capacity"
        if self.bytes_used[i] > self.bytes_cap[i] and self.bound is not None:
            return f"device's desired state over {self.bound.limit / 2**20:.2f} MiB"
        return None

    def explain(self, dep: ModelDeployment, now: float, grace_s: float) -> Explanation:
        name = dep.metadata.name
        wanted = dep.spec.replicas.total or 0
        placed = len(self.placed.get(name, ()))
        notes = []
        spread = dep.spec.placement.topology_spread
        if spread is not None and spread.min_per_domain > 1 and placed:
            codes, names = self.domains(spread.key)
            per = dict.fromkeys(range(len(names)), 0)
            for i in self.placed.get(name, ()):
                if codes[i] >= 0:
                    per[int(codes[i])] += 1
            short = [names[d] for d, c in per.items() if c < spread.min_per_domain]
            if short:
                notes.append(
                    f"topologySpread minPerDomain {spread.min_per_domain} not met in "
                    + ",".join(short[:5])
                    + (f" and {len(short) - 5} more" if len(short) > 5 else "")
                )
        unmeasured = self.unmeasured(dep)
        if unmeasured:
            notes.append(
                f"{unmeasured} on devices that have not measured the model's p95 yet "
                "(checked against maxLatencyP95 once they report it)"
            )
        if placed >= wanted:
            return Explanation(wanted, placed, self.n, notes=tuple(notes))
        _, filters = self.candidates(dep, now, grace_s)
        remaining = np.ones(self.n, dtype=np.bool_)
        counts: dict[str, int] = {}
        for why, mask in filters:
            left = remaining & ~mask
            out = int(np.count_nonzero(left))
            if out:
                # the desired-state bound names the devices it keeps the replica off
                named = self.bound is not None and why == self.bound.reason()
                label = _named(self, why, left, out) if named else why
                counts[label] = counts.get(label, 0) + out
                remaining &= mask
        if spread is not None and spread.max_skew is not None and np.count_nonzero(remaining):
            notes.insert(
                0,
                f"{np.count_nonzero(remaining)} left out by topologySpread maxSkew "
                f"{spread.max_skew} over {spread.key}",
            )
        reasons = tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        return Explanation(wanted, placed, self.n, reasons, tuple(notes))


def _named(fleet: Fleet, why: str, left: Mask, count: int) -> str:
    """``why`` with the first of the ``left`` devices named."""
    names = [fleet.nodes[int(i)].name for i in np.flatnonzero(left)[:MAX_NAMED]]
    more = f" and {count - MAX_NAMED} more" if count > MAX_NAMED else ""
    return f"{why} ({', '.join(names)}{more})"


def _total(dep: ModelDeployment) -> bool:
    return dep.spec.replicas.per_device is None


def schedule(
    deployments: Iterable[ModelDeployment],
    nodes: Sequence[Node],
    current: Mapping[str, Collection[str]],
    now: float,
    *,
    pinned: Mapping[str, Collection[str]] | None = None,
    artifacts: Mapping[str, str] | None = None,
    not_ready_grace_s: float = 60.0,
    draining: Mapping[str, Collection[str]] | None = None,
    never_preempt: Collection[str] = (),
    observed_since: float | None = None,
    bound: StateBound | None = None,
) -> Schedule:
    """Place every ``replicas.total`` deployment (pure; see the module doc).

    ``current``: deployment -> devices placed before; ``pinned``: perDevice deployment ->
    devices it runs on; ``artifacts``: deployment -> sha256 of its model (devices holding it
    are preferred); ``draining``: deployment -> devices it is moving off, whose replicas
    still serve (their room is taken; they are not placements); ``never_preempt``:
    deployments whose PriorityClass says ``preemptionPolicy: Never`` (placed in priority order,
    evicting nothing); ``observed_since``: when the hub began to observe devices (its start or
    election): a NotReady device's silence counts from its last heartbeat or from then,
    whichever is later (:mod:`hub.decide.staleness`); ``bound``: the desired-state bound, which no
    placement exceeds (a replica that fits nowhere else is left unplaced, and a device over
    it loses its least important placements)."""
    fleet, evictions = _run(
        deployments,
        nodes,
        current,
        now,
        pinned or {},
        artifacts or {},
        not_ready_grace_s,
        draining or {},
        frozenset(never_preempt),
        observed_since,
        bound,
    )
    placements = {
        name: tuple(sorted(fleet.nodes[i].name for i in fleet.placed.get(name, ())))
        for name, dep in fleet.deployments.items()
        if _total(dep)
    }
    explanations = {
        name: fleet.explain(dep, now, not_ready_grace_s)
        for name, dep in fleet.deployments.items()
        if _total(dep)
    }
    return Schedule(placements, explanations, tuple(evictions))


def _run(
    deployments: Iterable[ModelDeployment],
    nodes: Sequence[Node],
    current: Mapping[str, Collection[str]],
    now: float,
    pinned: Mapping[str, Collection[str]],
    artifacts: Mapping[str, str],
    grace_s: float,
    draining: Mapping[str, Collection[str]],
    never_preempt: frozenset[str] = frozenset(),
    observed_since: float | None = None,
    bound: StateBound | None = None,
) -> tuple[Fleet, list[Eviction]]:
    fleet = Fleet(nodes, artifacts, observed_since=observed_since, bound=bound)
    deps = sorted(deployments, key=lambda d: (-d.spec.effective_priority, d.metadata.name))
    for dep in deps:
        fleet.know(dep)
    evictions: list[Eviction] = []
    for dep in deps:
        if not _total(dep):
            fleet.pin(dep, pinned.get(dep.metadata.name, ()))
        elif dep.metadata.name in draining:
            fleet.hold(dep, draining[dep.metadata.name])
    # 1. keep what still qualifies
    for dep in deps:
        name = dep.metadata.name
        if not _total(dep):
            continue
        was = [fleet.index[d] for d in sorted(current.get(name, ())) if d in fleet.index]
        gone = sorted(d for d in current.get(name, ()) if d not in fleet.index)
        evictions += [Eviction(name, d, "device removed") for d in gone]
        if not was:
            continue
        hard = fleet.taint_filters(dep, running=True, now=now, grace_s=grace_s)
        soft = fleet.label_filters(dep, running=True)
        for i in was:
            failed = next((why for why, m in hard if not m[i]), None)
            drain = failed is None
            if drain:
                failed = next((why for why, m in soft if not m[i]), None)
            if failed is not None and failed.startswith(LATENCY_REASON):
                failed = fleet.latency_reason(dep, i)
            if failed is None:
                fleet.add(dep, i)
            else:
                evictions.append(
                    Eviction(name, fleet.nodes[i].name, f"no longer fits: {failed}", drain=drain)
                )
        extra = len(fleet.placed.get(name, ())) - (dep.spec.replicas.total or 0)
        if extra > 0:
            at = np.array(sorted(fleet.placed[name]), dtype=np.int64)
            score = dict(zip(at.tolist(), fleet.scores(dep, at).tolist(), strict=True))
            worst = sorted(fleet.placed[name], key=lambda i: (score[i], -i))[:extra]
            for i in worst:
                fleet.remove(dep, i)
                evictions.append(Eviction(name, fleet.nodes[i].name, "scaled down"))
    for i in sorted(fleet.on_device):
        while (over := fleet.over_capacity(i)) is not None and fleet.on_device.get(i):
            victim = min(fleet.on_device[i], key=lambda d: (fleet.on_device[i][d], d))
            fleet.remove(fleet.deployments[victim], i)
            evictions.append(Eviction(victim, fleet.nodes[i].name, over))

    # 2. place what is missing, most important first; 3. preempt when nothing fits
    def place_all() -> bool:
        preempted = False
        for dep in deps:
            if not _total(dep):
                continue
            fleet.place(dep, now=now, grace_s=grace_s)
            if dep.metadata.name in never_preempt:
                continue
            for i, victims in fleet.preempt(dep, now=now, grace_s=grace_s):
                preempted = True
                for v in victims:
                    evictions.append(
                        Eviction(
                            v,
                            fleet.nodes[i].name,
                            f"preempted by {dep.metadata.name} "
                            f"(priority {dep.spec.effective_priority})",
                            by=dep.metadata.name,
                        )
                    )
        return preempted

    def snapshot() -> frozenset[tuple[str, int]]:
        return frozenset((name, i) for name, at in fleet.placed.items() for i in at)

    # 4. a preemption frees room (and lifts anti-affinity) that a deployment passed over
    # earlier in this pass could use, and moves its victims: go again until nothing changes,
    # so that the result is a fixed point and the next pass moves nothing. Preemption only
    # ever evicts strictly lower priorities, so this ends; the bound is a safety net.
    changed = place_all()
    rounds = 0
    while changed and rounds <= len(deps):
        rounds += 1
        before = snapshot()
        place_all()
        changed = snapshot() != before
    # a placement made and preempted within this pass never ran: no eviction to report
    evictions = [e for e in evictions if e.device in current.get(e.deployment, ())]
    return fleet, evictions
