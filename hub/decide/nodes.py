"""What the scheduler (:mod:`hub.decide.schedule`) takes and gives, pure: the devices as it
sees them (:class:`Node`, made from device records by :func:`node_of`; their accelerator slots,
:func:`accelerator_slots`), the desired-state bound it keeps (:class:`StateBound`), what it
decides (:class:`Schedule`: placements, :class:`Eviction`, :class:`Explanation`), and the
constants of its scoring and search."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from hub.decide.devices import Device, DevicePhase, Taint
from hub.decide.placement import (
    REGION_LABEL,
    TPM_LABEL,
    SecurityPolicy,
    taints_for,
    tpm_attested,
)

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
