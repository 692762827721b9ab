"""Where edged's cgroups are: systemd's delegation rules, planned (pure) and then applied.

A ``Delegate=yes`` service owns the cgroup systemd made for it, but cgroup v2's
no-internal-processes rule forbids enabling controllers in the ``cgroup.subtree_control`` of a
cgroup that still holds processes (EBUSY), and systemd's rules want every process in a leaf.
So at start, before any worker exists, edged lays out its delegated cgroup like this::

    <delegated>/                     edged.service: +cpu +memory in its subtree_control
    <delegated>/supervisor/          edged itself (and whatever else was in <delegated>)
    <delegated>/workloads/           +cpu +memory in its subtree_control
    <delegated>/workloads/<replica>  one leaf per worker: cpu.max, memory.max, egress programs

:func:`plan_layout` decides from ``/proc/self/mountinfo`` and ``/proc/self/cgroup`` (text in,
layout out); :func:`check_controllers` says whether the cpu and memory controllers are there;
:func:`plan_steps` orders the writes; :func:`apply_steps` performs them and names the write that
failed. :func:`delegate` runs all of it for the daemon and never raises: a layout edged cannot
make leaves workers on rlimits, and the layout's ``problem`` says why (status shows it as
``limitsProblem``). On a cgroup v1 or hybrid hierarchy (the development machines) the cpu and
memory controllers belong to v1, so that is what ``problem`` says.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal

from edgefleet.logs import get_logger

log = get_logger(__name__)

SUPERVISOR = "supervisor"  # the leaf edged moves itself into
WORKLOADS = "workloads"  # the subtree below which each worker gets a leaf
CONTROLLERS = ("cpu", "memory")
# controllers a cgroup v1 mount may carry (its super options also say rw, xattr, name=...)
V1_CONTROLLERS = frozenset(
    {"cpu", "cpuacct", "cpuset", "memory", "io", "blkio", "pids", "devices", "freezer"}
    | {"net_cls", "net_prio", "perf_event", "hugetlb", "rdma", "misc"}
)
ENABLE = " ".join(f"+{c}" for c in CONTROLLERS)  # what a subtree_control write says


class Hierarchy(StrEnum):
    UNIFIED = "unified"  # cgroup v2 only: every controller may be in it
    HYBRID = "hybrid"  # cgroup v1 controllers beside a cgroup v2 mount (systemd's "hybrid")
    LEGACY = "legacy"  # cgroup v1 only
    NONE = "none"  # no cgroup file system mounted at all


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """Where edged's cgroups are, or why it has none it may use (``problem``)."""

    hierarchy: Hierarchy
    delegated: Path | None = None  # the cgroup edged manages (edged.service under systemd)
    problem: str = ""  # why workers are not limited by cgroup v2 ("" when they are)

    @property
    def usable(self) -> bool:
        return self.delegated is not None and not self.problem

    @property
    def supervisor(self) -> Path | None:
        return self.delegated / SUPERVISOR if self.delegated is not None else None

    @property
    def workloads(self) -> Path | None:
        """The subtree below which workers get leaves; None unless the layout is usable."""
        return self.delegated / WORKLOADS if self.usable and self.delegated else None

    @property
    def limits_mode(self) -> str:
        return "cgroup" if self.usable else "rlimit"

    def unusable(self, problem: str) -> CgroupLayout:
        return CgroupLayout(self.hierarchy, self.delegated, problem)


@dataclass(frozen=True, slots=True)
class Step:
    """One write into cgroupfs: make a directory, or write ``value`` into a file."""

    kind: Literal["mkdir", "write"]
    path: Path
    value: str = ""

    def describe(self) -> str:
        if self.kind == "mkdir":
            return f"cannot make the cgroup {self.path}"
        return f"cannot write {self.value!r} to {self.path}"


class CgroupError(OSError):
    """A cgroup edged needs could not be made or written (the message names the write)."""


def detect_hierarchy(mountinfo: str) -> tuple[Hierarchy, Path | None]:
    """Pure: which cgroup hierarchy this is and where cgroup v2 is mounted, from
    /proc/self/mountinfo's text. A v1 mount of only ``name=systemd`` holds no controller, so it
    does not make a hierarchy hybrid."""
    v2: Path | None = None
    v1_controllers = False
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if not sep or len(fields) < 5 or not after:
            continue
        if after[0] == "cgroup2" and v2 is None:
            v2 = Path(fields[4])
        elif after[0] == "cgroup":
            options = after[2].split(",") if len(after) > 2 else []
            if V1_CONTROLLERS.intersection(options):
                v1_controllers = True
    if v2 is not None:
        return (Hierarchy.HYBRID if v1_controllers else Hierarchy.UNIFIED), v2
    return (Hierarchy.LEGACY if v1_controllers else Hierarchy.NONE), None


def plan_layout(setting: str, *, mountinfo: str, proc_cgroup: str) -> CgroupLayout:
    """Pure: the cgroup edged would manage for ``setting`` (``[workers] cgroupRoot``: ``off``,
    ``auto`` or a path). ``auto`` is edged's own cgroup v2, or its parent when edged already
    sits in its ``supervisor`` leaf (started again in place)."""
    hierarchy, mount = detect_hierarchy(mountinfo)
    if setting == "off":
        return CgroupLayout(hierarchy, problem="[workers] cgroupRoot is off")
    if hierarchy is Hierarchy.LEGACY or mount is None:
        return CgroupLayout(
            hierarchy,
            problem=f"no cgroup v2 hierarchy is mounted ({hierarchy} cgroups): cpu.max and "
            "memory.max need the unified hierarchy (systemd.unified_cgroup_hierarchy=1)",
        )
    if setting != "auto":
        return CgroupLayout(hierarchy, Path(setting))
    own = next((ln[3:] for ln in proc_cgroup.splitlines() if ln.startswith("0::")), None)
    if own is None:
        return CgroupLayout(hierarchy, problem="edged is in no cgroup v2 (/proc/self/cgroup)")
    delegated = mount / own.lstrip("/")
    if delegated.name == SUPERVISOR:
        delegated = delegated.parent
    return CgroupLayout(hierarchy, delegated)


def check_controllers(
    layout: CgroupLayout, controllers: Sequence[str] | None, *, writable: bool
) -> CgroupLayout:
    """Pure: ``layout``, or the same with the reason its cgroup cannot limit workers.
    ``controllers``: the words of its ``cgroup.controllers`` (None: unreadable)."""
    if not layout.usable:
        return layout
    where = layout.delegated
    if controllers is None:
        return layout.unusable(f"{where} is not a cgroup v2 directory edged can read")
    missing = [c for c in CONTROLLERS if c not in controllers]
    if missing:
        if layout.hierarchy is Hierarchy.HYBRID:
            return layout.unusable(
                f"cgroup v1/hybrid hierarchy: the {' and '.join(missing)} controllers are bound "
                f"to cgroup v1, not to the unified hierarchy of {where}; boot with "
                "systemd.unified_cgroup_hierarchy=1 for limits the kernel enforces"
            )
        return layout.unusable(
            f"{where} lacks the {' and '.join(missing)} controllers (is the service Delegate=yes?)"
        )
    if not writable:
        return layout.unusable(f"{where} is not writable by edged (the unit needs Delegate=yes)")
    return layout


def plan_steps(layout: CgroupLayout, procs: Sequence[int]) -> tuple[Step, ...]:
    """Pure: the writes that lay out a usable ``layout``, in the order the kernel accepts them.
    ``procs``: the processes now in the delegated cgroup (edged, maybe others); they move to
    the supervisor leaf first, or enabling controllers below it fails with EBUSY."""
    root, sup, work = layout.delegated, layout.supervisor, layout.workloads
    if root is None or sup is None or work is None:
        return ()
    steps: list[Step] = []
    if procs:
        steps.append(Step("mkdir", sup))
        steps.extend(Step("write", sup / "cgroup.procs", str(pid)) for pid in procs)
    steps.append(Step("write", root / "cgroup.subtree_control", ENABLE))
    steps.append(Step("mkdir", work))
    steps.append(Step("write", work / "cgroup.subtree_control", ENABLE))
    return tuple(steps)


def apply_steps(steps: Sequence[Step]) -> None:
    """Perform ``steps`` in order; :class:`CgroupError` names the first that failed."""
    for step in steps:
        try:
            if step.kind == "mkdir":
                step.path.mkdir(exist_ok=True)
            else:
                step.path.write_text(step.value)
        except ProcessLookupError:
            continue  # a process listed in cgroup.procs exited before it could move
        except OSError as exc:
            hint = ""
            if exc.errno == 16 and step.path.name == "cgroup.subtree_control":  # EBUSY
                hint = f" (no-internal-processes rule: {step.path.parent} still holds processes)"
            raise CgroupError(
                exc.errno, f"{step.describe()}: {exc.strerror or exc}{hint}"
            ) from None


def delegate(setting: str) -> CgroupLayout:
    """Lay out edged's delegated cgroup (edged moves into its supervisor leaf). Never raises:
    the returned layout's ``problem`` says why workers are on rlimits instead."""
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError as exc:
        return _report(CgroupLayout(Hierarchy.NONE, problem=f"cannot read /proc: {exc}"))
    layout = plan_layout(setting, mountinfo=mountinfo, proc_cgroup=proc_cgroup)
    if setting == "off":
        log.info("worker limits are rlimits, as configured", problem=layout.problem)
        return layout
    if layout.delegated is not None and not layout.problem:
        root = layout.delegated
        try:
            controllers: list[str] | None = (root / "cgroup.controllers").read_text().split()
        except OSError:
            controllers = None
        layout = check_controllers(layout, controllers, writable=os.access(root, os.W_OK))
    if layout.usable and layout.delegated is not None:
        try:
            procs = _read_procs(layout.delegated)
            apply_steps(plan_steps(layout, procs))
        except OSError as exc:
            layout = layout.unusable(str(exc))
    return _report(layout)


def _read_procs(cgroup: Path) -> list[int]:
    text = (cgroup / "cgroup.procs").read_text()
    return [int(word) for word in text.split() if word.isdigit()]


def _report(layout: CgroupLayout) -> CgroupLayout:
    if layout.usable:
        log.info("worker cgroups", delegated=str(layout.delegated), workloads=str(layout.workloads))
    else:
        log.warning(
            "worker limits are rlimits, not cgroup v2",
            hierarchy=layout.hierarchy.value,
            problem=layout.problem,
        )
    return layout


# -- workers that outlive edged (runtime/adopting.py) ------------------------------------------
def keep_blocker(
    layout: CgroupLayout, *, delegate_subgroup: str | None, launcher_cleanup: bool = False
) -> str:
    """Pure: why workers must not outlive edged with this layout ("" when they may).

    With cgroup v2 limits in use, edged enabled controllers in the delegated cgroup's
    ``subtree_control`` and its workers live in leaves below it; while they run systemd cannot
    remove that cgroup when the unit stops, and cannot start the unit's next process in it
    (the no-internal-processes rule: the start fails with 219/CGROUP, again at each restart,
    until the start limit gives up). Only ``DelegateSubgroup=`` (systemd 254) starts the next
    process in a leaf of its own: ``delegate_subgroup`` is the unit's (None: not known, or no
    systemd unit; "": not set).

    ``launcher_cleanup``: edged runs under edged-launcher and the unit's ``ExecStopPost=``
    is ``edged-launcher cleanup``. The edged restarts inside the launcher (a switch of
    release, a crash of edged, a trial rolled back) do not restart the unit; once the unit
    stops (systemctl stop or restart, a launcher that died) the cleanup ends what is not a
    kept worker and disables the controllers below the unit's cgroup, so systemd can start
    it again; the next edged enables them and writes each adopted worker's limits again."""
    if not layout.usable:
        return ""  # workers share edged's cgroup: nothing keeps systemd from starting again
    if delegate_subgroup or launcher_cleanup:
        return ""
    return (
        "workers in cgroup v2 leaves of the delegated cgroup would keep the next start of the "
        "unit from placing its process (no-internal-processes rule: 219/CGROUP): the unit needs "
        "DelegateSubgroup=supervisor (systemd 254), or edged-launcher as its main process and "
        "ExecStopPost=edged-launcher cleanup"
    )


def unit_of(cgroup: Path | None) -> str:
    """Pure: the systemd unit a cgroup path belongs to (its last ``.service`` component)."""
    if cgroup is None:
        return ""
    return next((p for p in reversed(cgroup.parts) if p.endswith(".service")), "")


def read_delegate_subgroup(unit: str) -> str | None:
    """The unit's ``DelegateSubgroup=`` as systemd says (``systemctl show``); None when it
    cannot be asked. systemd before 254 knows no such property: ""."""
    import subprocess

    if not unit:
        return None
    try:
        done = subprocess.run(
            ["systemctl", "show", "--property=DelegateSubgroup", "--value", unit],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def read_launcher_cleanup(unit: str, environ: dict[str, str]) -> bool:
    """Whether this edged runs under edged-launcher (which sets ``EDGED_LAUNCHER_STATE``) in
    a unit whose ``ExecStopPost=`` is ``edged-launcher cleanup`` (as systemd says)."""
    import subprocess

    if not unit or not environ.get("EDGED_LAUNCHER_STATE"):
        return False
    try:
        done = subprocess.run(
            ["systemctl", "show", "--property=ExecStopPost", "--value", unit],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and has_launcher_cleanup(done.stdout)


def has_launcher_cleanup(exec_stop_post: str) -> bool:
    """Pure: whether ``systemctl show --property=ExecStopPost --value`` names the cleanup
    (``{ path=... ; argv[]=/opt/edgefleet/bin/edged-launcher cleanup ; ... }``)."""
    for line in exec_stop_post.splitlines():
        argv = line.partition("argv[]=")[2].partition(" ;")[0].split()
        if len(argv) >= 2 and argv[0].endswith("/edged-launcher") and argv[1] == "cleanup":
            return True
    return False
