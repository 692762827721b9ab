"""The scheduler's working state: the devices as numpy columns (labels as index sets, taints,
capacity, accelerator slots, artifacts held, desired-state room) and what is placed on them,
kept as each placement is added or removed. :class:`FleetColumns` answers "which devices have
this label, this slot, this artifact" in one vectorised step, and "how much is used"; the
filters (:mod:`hub.decide.filtering`) and the placing (:class:`hub.decide.schedule.Fleet`) are
built on it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from edgefleet.api import ModelDeployment
from hub.decide.devices import Taint
from hub.decide.nodes import UNBOUNDED, Ints, Mask, Node, StateBound

if TYPE_CHECKING:  # the view of the devices' trusted labels is one (hub.decide.filtering)
    from hub.decide.filtering import FleetFilters


class FleetColumns:
    """The devices as columns, with what is placed on them (see the module doc)."""

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
        self._trusted: FleetFilters | None = (
            None  # these devices as their trusted labels alone show
        )

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
