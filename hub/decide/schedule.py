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
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from edgefleet.api import (
    ModelDeployment,
    PlacementStrategy,
    SelectorOperator,
    SelectorRequirement,
    TaintEffect,
)
from edgefleet.api.quantities import format_duration
from hub.decide.devices import Device, DevicePhase, Taint
from hub.decide.placement import (
    REGION_LABEL,
    TAINT_NOT_READY,
    TPM_LABEL,
    ZONE_LABEL,
    SecurityPolicy,
    taints_for,
    tolerates,
    tpm_attested,
)
from hub.decide.staleness import silent_for

ACCELERATOR_CLASSES = ("gpu", "npu", "tpu", "vpu")
ARTIFACT_BONUS = 0.5  # in score units: a whole device's worth of free room is 1.0
SCORE_SPAN = 8.0  # every score is below this (room 0-1, bonuses 0.75)
TIE_BREAK = 1e-13  # per device index: orders equal scores by name, below any real difference
CLASS_BONUS = 0.25  # anyOf: the first class scores this much more than the last
TRUSTED_NOTE = "a Secret follows only bootstrap token labels"
MAX_VICTIMS_SEARCHED = 12  # exact fewest-victims search up to this many placements per device
UNBOUNDED = 2**62  # a device's room for desired-state bytes when no bound is given
MAX_NAMED = 5  # devices named in an explanation

Mask = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Node:
    """A device as the scheduler sees it."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...] = ()
    cpu_millis: int = 0
    memory_bytes: int = 0
    accelerators: Mapping[str, int] = field(default_factory=dict)  # class -> slots
    artifacts: frozenset[str] = frozenset()  # sha256 of the artifacts the device holds
    phase: DevicePhase = DevicePhase.READY
    last_heartbeat: float | None = None
    latencies: Mapping[str, float] = field(default_factory=dict)  # sha256 -> self-benchmark p95
    # the labels no device chose (its bootstrap token's, the hub's): a deployment mounting a
    # Secret must match these alone (hub.decide.labeltrust); None: every label (a test's node)
    trusted_labels: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class StateBound:
    """The desired-state bound as the scheduler keeps it: no placement may make a device's
    desired state larger than ``limit`` bytes (what a device can receive,
    :data:`hub.decide.desired.MAX_DESIRED_STATE_BYTES`). ``base``: per device, the bytes its state
    takes without any ``replicas.total`` placement (perDevice deployments, policies, secrets);
    ``replica``: per deployment, the most bytes one replica adds to a device's state (its
    largest manifest, model metadata, rollback allowance and mounted Secrets). Both are upper
    bounds (:mod:`hub.decide.statebound` computes them), so a placement this allows always fits."""

    limit: int
    base: Mapping[str, int] = field(default_factory=dict)
    replica: Mapping[str, int] = field(default_factory=dict)

    def reason(self) -> str:
        return f"desired state would exceed {self.limit / 2**20:.2f} MiB"


def accelerator_slots(labels: Mapping[str, str]) -> dict[str, int]:
    """The accelerator slots a device reports: ``accelerator.<class>`` counts (an operator
    label of the same key overrides the discovered count, e.g. to share one GPU 4 ways)."""
    out: dict[str, int] = {}
    for cls in ACCELERATOR_CLASSES:
        raw = labels.get(f"accelerator.{cls}")
        if raw is not None and raw.isdigit() and int(raw) > 0:
            out[cls] = int(raw)
    # a vendor or kind (``hailo``, ``nvidia-gpu``) names the device's first accelerator
    first = labels.get("accelerator")
    if first in out:
        for alias_key in ("accelerator.vendor", "accelerator.kind"):
            alias = labels.get(alias_key)
            if alias and alias not in out:
                out[alias] = out[first]
    return out


def node_of(
    device: Device, policy: SecurityPolicy, *, region: str, artifacts: frozenset[str] = frozenset()
) -> Node:
    """The scheduler's view of ``device`` (pure). Labels: the device's, plus its region
    (``topology.edgefleet.io/region``: the hub's region unless the device is labelled); and
    the same of its trusted labels alone (:meth:`hub.decide.devices.Device.trusted_labels`)."""
    labels, trusted = device.all_labels(), device.trusted_labels()
    tpm = "true" if tpm_attested(device) else "false"  # the hub's, never the device's
    for view in (labels, trusted):
        if region and REGION_LABEL not in view:
            view[REGION_LABEL] = region
        view[TPM_LABEL] = tpm
    facts = device.facts.get("facts") if isinstance(device.facts, Mapping) else None
    facts = facts if isinstance(facts, Mapping) else {}
    cpus, memory = facts.get("cpuCount"), facts.get("memoryTotalBytes")
    held = set(artifacts)
    for report in device.workloads.values():
        held.update(r.sha256 for r in report.revisions if r.sha256)
    return Node(
        name=device.name,
        labels=labels,
        taints=taints_for(device, policy),
        cpu_millis=int(cpus * 1000) if isinstance(cpus, int | float) else 0,
        memory_bytes=int(memory) if isinstance(memory, int | float) else 0,
        accelerators=accelerator_slots(labels),
        artifacts=frozenset(held),
        phase=device.phase,
        last_heartbeat=device.last_heartbeat,
        latencies=device.latencies,
        trusted_labels=trusted,
    )


@dataclass(frozen=True, slots=True)
class Eviction:
    """A placement taken away: by a higher-priority deployment, or because its device no
    longer qualifies (``by`` empty)."""

    deployment: str
    device: str
    reason: str
    by: str = ""
    # the replica may keep serving until its replacement is ready (its device still runs it
    # well, it only stopped matching: labels, region, zone, accelerator); the controller moves
    # it within ``spec.rollout.maxUnavailable`` (:mod:`hub.decide.moves`). False: it stops now
    # (a dead, tainted or removed device, a preemption, capacity, a scale-down).
    drain: bool = False


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a deployment has the placements it has: counts per filter of the devices left out
    (each device counted once, under the first filter it fails)."""

    wanted: int
    placed: int
    devices: int
    reasons: tuple[tuple[str, int], ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return self.placed >= self.wanted

    def message(self) -> str:
        """``3/5 replicas placed; 0/1200 devices fit: 800 lack accelerator npu, ...``."""
        head = f"{self.placed}/{self.wanted} replicas placed"
        if self.complete:
            return "; ".join((head, *self.notes))
        left_out = sum(n for _, n in self.reasons)
        parts = [f"{n} {why}" for why, n in self.reasons]
        out = f"{head}; {self.devices - left_out}/{self.devices} devices fit"
        if parts:
            out += ": " + ", ".join(parts)
        for note in self.notes:
            out += f"; {note}"
        return out


@dataclass(frozen=True, slots=True)
class Schedule:
    """What :func:`schedule` decided."""

    placements: Mapping[str, tuple[str, ...]]  # deployment -> devices, by name
    explanations: Mapping[str, Explanation]
    evictions: tuple[Eviction, ...] = ()  # placements taken away, each with its reason


LATENCY_REASON = "over maxLatencyP95"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}ms"


def _short(key: str) -> str:
    return key.removeprefix("node.edgefleet.io/")


class Fleet:
    """The devices as columns, with what is placed on them: the scheduler's working state.

    Built once per pass (:func:`schedule`); kept warm it places one more deployment in a few
    milliseconds (:meth:`place`), which is what the benchmark's incremental figure measures.
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        artifacts: Mapping[str, str] | None = None,
        *,
        observed_since: float | None = None,
        bound: StateBound | None = None,
    ) -> None:
        self.nodes = list(nodes)
        self.artifacts: Mapping[str, str] = artifacts or {}  # deployment -> model sha256
        # when the hub began to observe devices (hub.decide.staleness): silence counts from then
        self.observed_since = observed_since
        self.n = n = len(self.nodes)
        # the desired-state bound: per device the bytes placements may still add to its state
        self.bound = bound
        room = [
            bound.limit - bound.base.get(x.name, 0) if bound is not None else UNBOUNDED
            for x in self.nodes
        ]
        self.bytes_cap: Ints = np.array(room, dtype=np.int64)
        self.bytes_used: Ints = np.zeros(n, dtype=np.int64)
        self.index = {node.name: i for i, node in enumerate(self.nodes)}
        self.cpu_cap: Ints = np.array([x.cpu_millis for x in self.nodes], dtype=np.int64)
        self.mem_cap: Ints = np.array([x.memory_bytes for x in self.nodes], dtype=np.int64)
        self._cpu_inv = 1.0 / np.maximum(self.cpu_cap, 1)
        self._mem_inv = 1.0 / np.maximum(self.mem_cap, 1)
        self.cpu_used: Ints = np.zeros(n, dtype=np.int64)
        self.mem_used: Ints = np.zeros(n, dtype=np.int64)
        self.replicas: Ints = np.zeros(n, dtype=np.int64)
        self._labels: dict[str, dict[str, list[int]]] = {}
        for i, node in enumerate(self.nodes):
            for key, value in node.labels.items():
                self._labels.setdefault(key, {}).setdefault(value, []).append(i)
        self._taints: dict[Taint, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for t in node.taints:
                self._taints.setdefault(Taint(t.key, t.effect, t.value), []).append(i)
        self._mask_cache: dict[tuple[str, str | None], Mask] = {}
        self._untainted_cache: dict[Taint, Mask] = {}
        self._domain_cache: dict[str, tuple[Ints, list[str]]] = {}
        self._latency_cache: dict[str, npt.NDArray[np.float64]] = {}
        self._slots: dict[str, Ints] = {}
        self._acc_used: dict[str, Ints] = {}
        self._artifact_masks: dict[str, Mask] = {}
        self._holders: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for sha in node.artifacts:
                self._holders.setdefault(sha, []).append(i)
        self._by_priority: dict[int, int] = {}  # placements of total deployments per priority
        self._prio_use: dict[int, dict[str, Ints]] = {}  # priority -> cpu, memory, classes
        self._choices: dict[tuple[str, ...], Ints] = {}
        # what is placed: deployment -> device indices, and per device the placements
        self.placed: dict[str, set[int]] = {}
        self.on_device: dict[int, dict[str, int]] = {}  # device -> deployment -> priority
        self.pinned: dict[str, set[int]] = {}
        self.deployments: dict[str, ModelDeployment] = {}
        self.shunned_by: dict[str, list[str]] = {}  # X -> deployments with anti-affinity to X
        self._trusted: Fleet | None = None  # these devices as their trusted labels alone show

    def know(self, dep: ModelDeployment) -> None:
        """Take ``dep`` into account (its anti-affinity applies to the others too)."""
        name = dep.metadata.name
        self.deployments[name] = dep
        for other in dep.spec.placement.deployment_anti_affinity:
            if other != name and name not in self.shunned_by.setdefault(other, []):
                self.shunned_by[other].append(name)

    # -- columns ----------------------------------------------------------------------------
    def label_mask(self, key: str, value: str | None = None) -> Mask:
        """Devices with label ``key`` (= ``value`` when given)."""
        cached = self._mask_cache.get((key, value))
        if cached is not None:
            return cached
        mask = np.zeros(self.n, dtype=np.bool_)
        values = self._labels.get(key, {})
        if value is None:
            for idx in values.values():
                mask[idx] = True
        elif value in values:
            mask[values[value]] = True
        self._mask_cache[(key, value)] = mask
        return mask

    def _untainted(self, taint: Taint) -> Mask:
        """Devices without ``taint``."""
        mask = self._untainted_cache.get(taint)
        if mask is None:
            mask = self._untainted_cache[taint] = np.ones(self.n, dtype=np.bool_)
            mask[self._taints[taint]] = False
        return mask

    def any_value(self, key: str, values: Iterable[str]) -> Mask:
        mask = np.zeros(self.n, dtype=np.bool_)
        for v in values:
            mask |= self.label_mask(key, v)
        return mask

    def domains(self, key: str) -> tuple[Ints, list[str]]:
        """Per device the index of its value of label ``key`` (-1: none), and the values."""
        cached = self._domain_cache.get(key)
        if cached is None:
            codes = np.full(self.n, -1, dtype=np.int64)
            names = sorted(self._labels.get(key, {}))
            for d, value in enumerate(names):
                codes[self._labels[key][value]] = d
            cached = self._domain_cache[key] = (codes, names)
        return cached

    def slots(self, cls: str) -> Ints:
        if cls not in self._slots:
            self._slots[cls] = np.array(
                [x.accelerators.get(cls, 0) for x in self.nodes], dtype=np.int64
            )
            self._acc_used[cls] = np.zeros(self.n, dtype=np.int64)
        return self._slots[cls]

    def artifact_mask(self, sha256: str) -> Mask:
        mask = self._artifact_masks.get(sha256)
        if mask is None:
            mask = self._artifact_masks[sha256] = np.zeros(self.n, dtype=np.bool_)
            mask[self._holders.get(sha256, [])] = True
        return mask

    def accelerator_choice(self, dep: ModelDeployment) -> tuple[Ints, tuple[str, ...]]:
        """Per device the index in ``anyOf`` of the class it would use (-1: none it has)."""
        wanted = dep.spec.resources.accelerators
        choice = self._choices.get(wanted)
        if choice is None:
            choice = np.full(self.n, -1, dtype=np.int64)
            for i in range(len(wanted) - 1, -1, -1):
                choice[self.slots(wanted[i]) > 0] = i
            self._choices[wanted] = choice
        return choice, wanted

    # -- usage ------------------------------------------------------------------------------
    def _use(self, dep: ModelDeployment, i: int, sign: int, count: int = 1) -> None:
        res = dep.spec.resources
        self.cpu_used[i] += sign * count * (res.cpu_millis or 0)
        self.mem_used[i] += sign * count * (res.memory_bytes or 0)
        self.replicas[i] += sign * count
        for cls in res.accelerators:
            if self.slots(cls)[i] > 0:
                self._acc_used[cls][i] += sign * count
                break

    def add(self, dep: ModelDeployment, i: int) -> None:
        name = dep.metadata.name
        self.placed.setdefault(name, set()).add(i)
        prio = self.on_device.setdefault(i, {})[name] = dep.spec.effective_priority
        self._by_priority[prio] = self._by_priority.get(prio, 0) + 1
        self._use(dep, i, +1)
        self.bytes_used[i] += self.state_bytes(dep)
        self._use_at_priority(dep, i, prio, +1)

    def remove(self, dep: ModelDeployment, i: int) -> None:
        name = dep.metadata.name
        if i not in self.placed.get(name, ()):
            return
        self.placed[name].discard(i)
        prio = self.on_device[i].pop(name)
        self._by_priority[prio] -= 1
        self._use(dep, i, -1)
        self.bytes_used[i] -= self.state_bytes(dep)
        self._use_at_priority(dep, i, prio, -1)

    def state_bytes(self, dep: ModelDeployment) -> int:
        """The most bytes one replica of ``dep`` adds to a device's desired state (0: no
        bound given)."""
        return self.bound.replica.get(dep.metadata.name, 0) if self.bound is not None else 0

    def _use_at_priority(self, dep: ModelDeployment, i: int, prio: int, sign: int) -> None:
        """What placements of each priority take per device (what preemption could free)."""
        use = self._prio_use.get(prio)
        if use is None:
            use = self._prio_use[prio] = {
                "cpu": np.zeros(self.n, dtype=np.int64),
                "memory": np.zeros(self.n, dtype=np.int64),
                "bytes": np.zeros(self.n, dtype=np.int64),
            }
        res = dep.spec.resources
        use["cpu"][i] += sign * (res.cpu_millis or 0)
        use["memory"][i] += sign * (res.memory_bytes or 0)
        use["bytes"][i] += sign * self.state_bytes(dep)
        for cls in res.accelerators:
            if self.slots(cls)[i] > 0:
                if cls not in use:
                    use[cls] = np.zeros(self.n, dtype=np.int64)
                use[cls][i] += sign
                break

    def pin(self, dep: ModelDeployment, devices: Iterable[str]) -> None:
        """A perDevice deployment's devices: capacity taken, never moved."""
        name = dep.metadata.name
        idx = {self.index[d] for d in devices if d in self.index}
        self.pinned[name] = idx
        for i in idx:
            self._use(dep, i, +1, dep.spec.replicas.per_device or 0)

    def hold(self, dep: ModelDeployment, devices: Iterable[str]) -> None:
        """Replicas of ``dep`` still serving on devices it is moving off (:mod:`hub.decide.moves`):
        their room is taken until they stop, and they are not placements."""
        for d in devices:
            if d in self.index:
                self._use(dep, self.index[d], +1)
                self.bytes_used[self.index[d]] += self.state_bytes(dep)

    def running(self, name: str) -> Mask:
        mask = np.zeros(self.n, dtype=np.bool_)
        idx = self.placed.get(name, set()) | self.pinned.get(name, set())
        if idx:
            mask[list(idx)] = True
        return mask

    def fits(self, dep: ModelDeployment) -> list[tuple[str, Mask]]:
        """The capacity filters, each ``(reason, mask of devices with room)``."""
        res = dep.spec.resources
        out = []
        if res.cpu_millis:
            out.append(("insufficient cpu", self.cpu_cap - self.cpu_used >= res.cpu_millis))
        if res.memory_bytes:
            out.append(("insufficient memory", self.mem_cap - self.mem_used >= res.memory_bytes))
        if res.accelerators:
            choice, wanted = self.accelerator_choice(dep)
            room = np.zeros(self.n, dtype=np.bool_)
            for k, cls in enumerate(wanted):
                free = self.slots(cls) - self._acc_used[cls] >= 1
                room |= (choice == k) & free
            out.append((f"without a free {'|'.join(wanted)} slot", room | (choice < 0)))
        size = self.state_bytes(dep)
        if size and self.bound is not None:
            out.append((self.bound.reason(), self.bytes_cap - self.bytes_used >= size))
        return out

    def free_after(self, i: int, dep: ModelDeployment) -> tuple[int, int, int, int]:
        """What device ``i`` would lack for one replica of ``dep``: (cpu, memory, slots,
        desired-state bytes)."""
        res = dep.spec.resources
        cpu = (res.cpu_millis or 0) - int(self.cpu_cap[i] - self.cpu_used[i])
        mem = (res.memory_bytes or 0) - int(self.mem_cap[i] - self.mem_used[i])
        acc = 0
        for cls in res.accelerators:
            if self.slots(cls)[i] > 0:
                acc = 1 - int(self.slots(cls)[i] - self._acc_used[cls][i])
                break
        size = self.state_bytes(dep) - int(self.bytes_cap[i] - self.bytes_used[i])
        return max(cpu, 0), max(mem, 0), max(acc, 0), max(size, 0)

    # -- filters ----------------------------------------------------------------------------
    def filters(
        self, dep: ModelDeployment, *, running: bool, now: float, grace_s: float
    ) -> list[tuple[str, Mask]]:
        """The hard filters of ``dep`` in order, each ``(reason, mask of devices passing)``.

        ``running``: the filters a placement that already runs must still pass (NoExecute
        taints, NotReady beyond the grace, labels, region, zone, accelerator); otherwise every
        filter but capacity."""
        out = self.taint_filters(dep, running=running, now=now, grace_s=grace_s)
        out += self.label_filters(dep, running=running)
        return out

    def taint_filters(
        self, dep: ModelDeployment, *, running: bool, now: float, grace_s: float
    ) -> list[tuple[str, Mask]]:
        """The taints ``dep`` does not tolerate (and, ``running``, NotReady beyond the
        grace): a placement that fails one of these cannot keep serving."""
        placement = dep.spec.placement
        out: list[tuple[str, Mask]] = []
        for taint, idx in sorted(self._taints.items(), key=lambda t: t[0].key):
            if tolerates(placement.tolerations, taint):
                continue
            if running and taint.effect is not TaintEffect.NO_EXECUTE:
                if taint.key != TAINT_NOT_READY:
                    continue
                mask = np.ones(self.n, dtype=np.bool_)
                stale = [
                    i
                    for i in idx
                    if silent_for(self.nodes[i].last_heartbeat, now, self.observed_since) > grace_s
                ]
                mask[stale] = False
                out.append((f"not ready for longer than {grace_s:g}s", mask))
                continue
            out.append((f"not tolerating taint {_short(taint.key)}", self._untainted(taint)))
        return out

    def label_filters(self, dep: ModelDeployment, *, running: bool) -> list[tuple[str, Mask]]:
        """Labels, region, zone, accelerator (and, not ``running``, affinity)."""
        placement = dep.spec.placement
        out: list[tuple[str, Mask]] = []
        if placement.regions:
            out.append(
                (
                    f"outside region {','.join(placement.regions)}",
                    self.any_value(REGION_LABEL, placement.regions),
                )
            )
        if placement.zones:
            out.append(
                (
                    f"outside zone {','.join(placement.zones)}",
                    self.any_value(ZONE_LABEL, placement.zones),
                )
            )
        if placement.require_tpm:
            out.append(
                ("not TPM-attested (placement.requireTpm)", self.label_mask(TPM_LABEL, "true"))
            )
        for key, value in sorted(placement.node_selector.items()):
            out.append((f"not matching nodeSelector {key}={value}", self.label_mask(key, value)))
        for req in placement.match_expressions:
            out.append((f"not matching {req.describe()}", self._requirement(req)))
        if dep.spec.resources.accelerators:
            choice, wanted = self.accelerator_choice(dep)
            out.append((f"lack accelerator {'|'.join(wanted)}", choice >= 0))
        trusted = self.trusted_filter(dep)
        if trusted is not None:
            out.append(trusted)
        if placement.topology_spread is not None:
            key = placement.topology_spread.key
            out.append((f"without label {key}", self.label_mask(key)))
        latency = self.latency_filter(dep)
        if latency is not None:
            out.append(latency)
        if running:
            return out
        for other in placement.deployment_affinity:
            out.append((f"not running {other}", self.running(other)))
        for other in placement.deployment_anti_affinity:
            out.append((f"running {other}", ~self.running(other)))
        for other in self.shunned_by.get(dep.metadata.name, ()):
            out.append((f"running {other} (its anti-affinity)", ~self.running(other)))
        return out

    def trusted_filter(self, dep: ModelDeployment) -> tuple[str, Mask] | None:
        """For a deployment mounting a Secret: the devices whose trusted labels alone (no
        label the device chose: :mod:`hub.decide.labeltrust`) pass its regions, zones and
        selectors."""
        if not dep.spec.secrets:
            return None
        if self._trusted is None:
            self._trusted = Fleet(
                [Node(x.name, x.labels if x.trusted_labels is None else x.trusted_labels)
                 for x in self.nodes]
            )  # fmt: skip
        view, placement = self._trusted, dep.spec.placement
        mask = np.ones(self.n, dtype=np.bool_)
        if placement.regions:
            mask &= view.any_value(REGION_LABEL, placement.regions)
        if placement.zones:
            mask &= view.any_value(ZONE_LABEL, placement.zones)
        for key, value in placement.node_selector.items():
            mask &= view.label_mask(key, value)
        for req in placement.match_expressions:
            mask &= view._requirement(req)
        return (f"matching only through labels the device chose ({TRUSTED_NOTE})", mask)

    # -- latency (placement.maxLatencyP95) -----------------------------------------------------
    def latencies(self, sha256: str) -> npt.NDArray[np.float64]:
        """Per device its self-benchmark p95 of artifact ``sha256`` (NaN: not measured)."""
        column = self._latency_cache.get(sha256)
        if column is None:
            column = np.full(self.n, np.nan, dtype=np.float64)
            for i, node in enumerate(self.nodes):
                p95 = node.latencies.get(sha256)
                if p95 is not None:
                    column[i] = p95
            self._latency_cache[sha256] = column
        return column

    def latency_filter(self, dep: ModelDeployment) -> tuple[str, Mask] | None:
        """Devices whose measured p95 of ``dep``'s model is within its bound (unmeasured
        devices pass: they are checked once they report)."""
        bound = dep.spec.placement.max_latency_p95_s
        sha = self.artifacts.get(dep.metadata.name)
        if bound is None or not sha:
            return None
        column = self.latencies(sha)
        over = column > bound  # NaN compares False: not measured passes
        worst = float(np.nanmax(column[over])) if over.any() else 0.0
        return (
            f"{LATENCY_REASON} {format_duration(bound)} (measured p95 up to {_ms(worst)})",
            ~over,
        )

    def latency_reason(self, dep: ModelDeployment, i: int) -> str:
        """Why device ``i`` is over ``dep``'s bound, with its figure."""
        bound = dep.spec.placement.max_latency_p95_s or 0.0
        p95 = float(self.latencies(self.artifacts[dep.metadata.name])[i])
        return f"measured p95 {_ms(p95)} over maxLatencyP95 {format_duration(bound)}"

    def unmeasured(self, dep: ModelDeployment) -> int:
        """How many of ``dep``'s placements are on devices that did not measure its model."""
        sha = self.artifacts.get(dep.metadata.name)
        if dep.spec.placement.max_latency_p95_s is None or not sha:
            return 0
        column = self.latencies(sha)
        return sum(1 for i in self.placed.get(dep.metadata.name, ()) if np.isnan(column[i]))

    def _requirement(self, req: SelectorRequirement) -> Mask:
        if req.operator is SelectorOperator.IN:
            return self.any_value(req.key, req.values)
        if req.operator is SelectorOperator.NOT_IN:
            return ~self.any_value(req.key, req.values)
        if req.operator is SelectorOperator.EXISTS:
            return self.label_mask(req.key)
        return ~self.label_mask(req.key)

    def scores(self, dep: ModelDeployment, idx: Ints) -> npt.NDArray[np.float64]:
        """The scores of devices ``idx``, higher is better: free room after placing (Spread)
        or room used (BinPack), plus :data:`ARTIFACT_BONUS` where the artifact already is."""
        res = dep.spec.resources
        used = (self.cpu_used[idx] + (res.cpu_millis or 0)) * self._cpu_inv[idx]
        used += (self.mem_used[idx] + (res.memory_bytes or 0)) * self._mem_inv[idx]
        used = used / 2 + self.replicas[idx] * 1e-6  # equal room: fewer replicas first
        binpack = dep.spec.placement.strategy is PlacementStrategy.BIN_PACK
        score = used if binpack else 1.0 - used
        wanted = res.accelerators
        if len(wanted) > 1:  # anyOf: earlier classes preferred
            choice, _ = self.accelerator_choice(dep)
            score += CLASS_BONUS * (1.0 - np.maximum(choice[idx], 0) / len(wanted))
        artifact = self.artifacts.get(dep.metadata.name)
        if artifact and artifact in self._holders:
            score += ARTIFACT_BONUS * self.artifact_mask(artifact)[idx]
        return np.asarray(score, dtype=np.float64)

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
