"""What a soak run does and when, decided from its seed alone (pure: no clock, no I/O): the
faults and the operator's actions. The same seed gives the same plan, so a failed run is run
again with ``--seed N``.

Faults (``Fault``): at ``at`` seconds into the run, ``action`` on ``target`` for ``duration``
seconds: ``kill`` is kill -9 then a start again after ``duration`` (a worker is started again by
its edged: no duration), ``stop`` is SIGSTOP then SIGCONT. At most one fault per target at a
time, and at most one etcd member out at a time (quorum stays: a region without etcd quorum
takes no writes, which a run may want too: ``etcd_quorum_faults``). ``cut`` of a link (a
partition), ``fill`` of a disk (its filesystem filled to the last byte, then emptied) and
``slow`` I/O on a device's data directory or a hub's (the root's, an etcd member's: each
operation waits ``delay``, 50 ms to 2 s, then normal again; ``size_slow_io``, slowfs) last up
to three times longer; each kind of those comes
from its own stream of the seed. ``jump`` of a
device's wall clock (kind ``clock``) steps it by ``offset`` seconds for ``duration``, then
corrects it (``_clock_jumps``, soakclock). ``power`` of a lab VM (kind ``vm``) kills its QEMU
-9 and boots it again after ``duration`` (soakvms): its own stream, a cut every
``VM_POWER_GAP`` seconds on average.

Actions (``Action``): the operator's calls, at ``at`` seconds: ``apply`` of a deployment (a new
version, a canary to the broken version 9.0.0, a scale change; one in three of a working
version first pushes that version again with a rollback allowance) or of a region's PriorityClass,
``delete``, ``read`` (a get, at the root or at either region replica), and ``enroll`` (a
bootstrap token created at a region replica, a new device enrolled with it there).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field

KILL, STOP, CUT, FILL, JUMP = "kill", "stop", "cut", "fill", "jump"
POWER = "power"  # a power cut of a lab VM (QEMU killed -9), booted again after the duration
VM_POWER_GAP = 180.0  # mean seconds between power cuts of the VMs: a boot under TCG takes minutes
VM_UPDATE_GAP = (60.0, 240.0)  # seconds between the operator's version changes of soak-v
VM_DEPLOYMENT = "soak-v"  # on the lab VMs alone (soakvms)
SLOW = "slow"  # slow I/O on a device's data directory (tests/soak/slowfs.py), ``Fault.delay``
SLOW_DELAY = (0.05, 2.0)  # seconds per operation, drawn log-uniform
ENROLL = "enroll"  # an action: a token created at a replica, a new device enrolled with it

DEPLOYMENTS = ("soak-a", "soak-b", "soak-sim")  # root-owned, applied at the root
CLASSES = ("soak-p0", "soak-p1")  # the region's own PriorityClasses, applied at a replica
VERSIONS = ("1.0.0", "1.1.0")
BROKEN = "9.0.0"  # pushed unloadable: a canary to it fails on the device and rolls back


@dataclass(frozen=True)
class Fault:
    at: float
    target: str
    kind: str  # hub, etcd, edged, worker
    action: str  # kill, stop, cut
    duration: float
    offset: float = 0.0  # a jump of a device's wall clock: seconds it is stepped by (soakclock)
    delay: float = 0.0  # slow I/O: seconds each operation waits (slowfs)


@dataclass(frozen=True)
class Action:
    at: float
    op: str  # apply, delete, read
    key: str  # ModelDeployment/NAME at the root, PriorityClass/NAME at the region
    at_hub: str  # root, eu-r0, eu-r1: where the call goes first
    version: str = ""  # apply of a deployment: its model version
    replicas: int = 1  # apply of a deployment: replicas per device
    canary: bool = False
    read_after: str = ""  # a replica to read the object at as soon as the call returned
    # apply of a deployment: the operator first pushes the version again at the root with a
    # rollback allowance (edgectl models push --allow-rollback), as a publisher who means a
    # downgrade does (docs/trust.md): devices that accepted a newer version take it
    allow_rollback: bool = False
    total: int | None = None  # apply of a deployment: replicas.total instead of perDevice


@dataclass
class Plan:
    seed: int
    duration: float
    faults: list[Fault] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    enrollments: list[Action] = field(default_factory=list)  # made by a third operator
    vm_updates: list[Action] = field(default_factory=list)  # soak-v's versions, a fourth

    @property
    def chaos_ends(self) -> float:
        """When the last fault is over (then the convergence clock starts)."""
        return max([f.at + f.duration for f in self.faults], default=0.0)


def make_plan(
    seed: int,
    duration: float,
    targets: dict[str, str],
    *,
    warmup: float = 10.0,
    fault_gap: float = 8.0,
    action_gap: float = 2.0,
    max_fault: float = 8.0,
    etcd_quorum_faults: bool = False,
) -> Plan:
    """``targets``: name -> kind. Faults from ``warmup`` until ``duration``, each over by then;
    actions all along (reads continue while the fleet converges, after the plan)."""
    plan = Plan(seed, duration)
    # processes and links each from their own stream: adding a link leaves a seed's process
    # faults as they were (seed 35's, which found the follower defect, docs/soak.md)
    processes = {
        n: k for n, k in targets.items() if k not in ("link", "disk", "net", "clock", "io", "vm")
    }
    vms = {n: k for n, k in targets.items() if k == "vm"}
    links = {n: k for n, k in targets.items() if k == "link"}
    disks = {n: k for n, k in targets.items() if k == "disk"}
    nets = {n: k for n, k in targets.items() if k == "net"}
    # a device's slow disk and a hub's (the root's store, an etcd member's) from streams of
    # their own: adding the hubs' left each seed's device faults as they were
    ios = {n: k for n, k in targets.items() if k == "io" and n.startswith("dev-")}
    hub_ios = {n: k for n, k in targets.items() if k == "io" and not n.startswith("dev-")}
    streams = (
        ("faults", processes, fault_gap),
        ("links", links, 2 * fault_gap),
        ("disks", disks, 3 * fault_gap),
        ("nets", nets, 2 * fault_gap),
        ("ios", ios, 3 * fault_gap),
        ("hub-ios", hub_ios, 3 * fault_gap),
        # the lab VMs' power cuts: their own stream, so adding VMs leaves the rest as it was
        ("vms", vms, max(VM_POWER_GAP, fault_gap)),
    )
    for stream, group, gap in streams:
        if group:
            rng = random.Random(f"{stream}-{seed}")
            plan.faults += _faults(rng, group, duration, warmup, gap, max_fault, etcd_quorum_faults)
    plan.faults += _clock_jumps(seed, targets, duration, warmup, fault_gap, max_fault)
    plan.faults = size_slow_io(plan.faults, seed)
    plan.faults.sort(key=lambda f: (f.at, f.target))
    rng = random.Random(f"actions-{seed}")
    t = warmup / 2
    while t < duration:
        action = _action(rng, round(t, 2))
        # a region's write read back at once at the other replica (read your writes on a
        # follower); drawn apart from the stream, which stays as it was for every seed
        draw = random.Random(f"read-after-{seed}-{len(plan.actions)}").random()
        if action.op == "apply" and action.at_hub != "root" and draw < 0.7:
            other = "eu-r1" if action.at_hub == "eu-r0" else "eu-r0"
            action = dataclasses.replace(action, read_after=other)
        # one apply of a model version in three comes with a rollback allowance: its own
        # stream too
        allow = random.Random(f"allow-{seed}-{len(plan.actions)}").random()
        if action.op == "apply" and action.version in VERSIONS and allow < 1 / 3:
            action = dataclasses.replace(action, allow_rollback=True)
        plan.actions.append(action)
        t += rng.uniform(0.5 * action_gap, 1.5 * action_gap)
    # token enrollments (a token created, a new device enrolled with it, at either replica):
    # their own stream, so a seed's other actions stay as they were
    rng = random.Random(f"enroll-{seed}")
    t, n = warmup, 0
    while True:
        t += rng.uniform(2.5 * action_gap, 7.5 * action_gap)
        if t >= duration:
            break
        hub = rng.choice(("eu-r0", "eu-r1"))
        plan.enrollments.append(Action(round(t, 2), ENROLL, f"Device/soak-e{n:03d}", hub))
        n += 1
    if vms:
        plan.vm_updates = _vm_updates(seed, duration, warmup)
    return plan


def _vm_updates(seed: int, duration: float, warmup: float) -> list[Action]:
    """The operator's version changes of soak-v (on the lab VMs alone), from a stream of the
    seed of its own: each switches to the other working version, a few minutes apart, so that
    the VMs' power cuts fall on downloads and switches as well as on devices at rest."""
    rng = random.Random(f"vm-updates-{seed}")
    out = []
    t, version = warmup, VERSIONS[0]
    while True:
        t += rng.uniform(*VM_UPDATE_GAP)
        if t >= duration:
            return out
        version = VERSIONS[1] if version == VERSIONS[0] else VERSIONS[0]
        # each pushed again first (allow_rollback): signed anew, its metadata is the newest
        # of the model, and going back to 1.0.0 is allowed; without it every other switch is
        # a downgrade the VM refuses by design (a push that fails leaves exactly that)
        key = f"ModelDeployment/{VM_DEPLOYMENT}"
        out.append(Action(round(t, 2), "apply", key, "root", version, allow_rollback=True))


def _faults(
    rng: random.Random,
    targets: dict[str, str],
    duration: float,
    warmup: float,
    gap: float,
    max_fault: float,
    etcd_quorum_faults: bool,
) -> list[Fault]:
    faults = []
    busy: dict[str, float] = {}  # target -> when its fault ends
    names = sorted(targets)
    t = warmup
    while True:
        t += rng.expovariate(1.0 / gap)
        if t >= duration - 1:
            break
        target = rng.choice(names)
        kind = targets[target]
        action = {"worker": KILL, "link": CUT, "net": CUT, "disk": FILL, "clock": JUMP,
                  "io": SLOW, "vm": POWER}.get(kind)  # fmt: skip
        action = action or rng.choice((KILL, STOP))
        # a partition, a full or slow disk, a clock jump last longer than a process's fault
        longest = 3 * max_fault if kind in ("link", "net", "disk", "clock", "io") else max_fault
        length = 0.0 if kind == "worker" else round(rng.uniform(1.0, longest), 2)
        at = round(t, 2)
        length = min(length, max(0.0, math.floor((duration - at) * 100) / 100))
        if busy.get(target, -1.0) > t:
            continue
        etcd_out = any(targets[n] == "etcd" and end > t for n, end in busy.items())
        if kind == "etcd" and etcd_out and not etcd_quorum_faults:
            continue
        busy[target] = t + length
        faults.append(Fault(at, target, kind, action, length))
    return faults


def size_slow_io(faults: list[Fault], seed: int) -> list[Fault]:
    """Each slow-I/O fault's delay per operation, log-uniform over :data:`SLOW_DELAY`, from a
    stream of the seed of its own (the faults' times and lengths stay their stream's)."""
    rng = random.Random(f"io-delay-{seed}")
    low, high = SLOW_DELAY
    out = []
    for f in faults:
        if f.action != SLOW:
            out.append(f)
            continue
        delay = math.exp(rng.uniform(math.log(low), math.log(high)))
        out.append(dataclasses.replace(f, delay=round(delay, 3)))
    return out


def _clock_jumps(
    seed: int,
    targets: dict[str, str],
    duration: float,
    warmup: float,
    gap: float,
    max_fault: float,
) -> list[Fault]:
    """Steps of a device's wall clock (kind ``clock``), held for the fault's duration, then
    corrected (as NTP steps it back): their own streams of the seed, when (mean gap three
    times the processes') and by how much, so a seed's other faults stay as they were.
    Forward or back by 1 to 30 minutes; one forward jump in five of 2 to 6 hours (past the
    hour a TUF timestamp lasts, where a hub serves TUF: new artifacts are refused while the
    clock is ahead, and taken once it is corrected). A backward jump of more than the age of
    the hubs' certificates plus the 5 minutes they are backdated (hub.pki.CLOCK_SKEW) leaves
    the device unable to make a new connection while it lasts, as a real one would be."""
    clocks = {n: k for n, k in targets.items() if k == "clock"}
    if not clocks:
        return []
    when = random.Random(f"clocks-{seed}")
    faults = _faults(when, clocks, duration, warmup, 3 * gap, max_fault, False)
    by = random.Random(f"clock-offsets-{seed}")
    out = []
    for f in faults:
        if by.random() < 0.5:
            offset = -by.uniform(60, 1800)
        elif by.random() < 0.2:
            offset = by.uniform(2 * 3600, 6 * 3600)
        else:
            offset = by.uniform(60, 1800)
        out.append(dataclasses.replace(f, offset=round(offset, 1)))
    return out


def _action(rng: random.Random, t: float) -> Action:
    roll = rng.random()
    if roll < 0.25:  # the region's own objects, on the replicas (etcd)
        key = f"PriorityClass/{rng.choice(CLASSES)}"
        hub = rng.choice(("eu-r0", "eu-r1"))
        op = rng.choices(("apply", "delete", "read"), (4, 1, 5))[0]
        return Action(t, op, key, hub)
    key = f"ModelDeployment/{rng.choice(DEPLOYMENTS)}"
    op = rng.choices(("apply", "delete", "read"), (5, 1, 4))[0]
    if op != "apply":
        return Action(t, op, key, "root")
    broken = key != "ModelDeployment/soak-sim" and rng.random() < 0.15
    version = BROKEN if broken else rng.choice(VERSIONS)
    replicas = rng.choice((1, 1, 1, 2)) if key == "ModelDeployment/soak-b" else 1
    return Action(t, "apply", key, "root", version, replicas, canary=rng.random() < 0.3)
