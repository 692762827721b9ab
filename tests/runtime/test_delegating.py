"""edged's delegated cgroup: the pure planning as tables, the write order checked against a
model of cgroup v2's rules, and the writes against a fake cgroupfs in tmp. That the kernel
accepts them and enforces the limits is the VM lab's to show (tests/vmlab)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from edged.runtime.delegating import (
    CgroupError,
    CgroupLayout,
    Hierarchy,
    Step,
    apply_steps,
    check_controllers,
    delegate,
    detect_hierarchy,
    plan_layout,
    plan_steps,
)
from edged.runtime.egressfilter import egress_base

V2_ROOT = "25 1 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"  # noqa: E501
V2_UNIFIED = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
V1_MEMORY = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
V1_SYSTEMD = (
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n"
)
TMPFS = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"

HIERARCHIES = {
    "unified: cgroup2 at /sys/fs/cgroup": (V2_ROOT, Hierarchy.UNIFIED, "/sys/fs/cgroup"),
    "hybrid: v1 controllers beside cgroup2": (
        TMPFS + V1_MEMORY + V1_SYSTEMD + V2_UNIFIED,
        Hierarchy.HYBRID,
        "/sys/fs/cgroup/unified",
    ),
    "name=systemd alone holds no controller: unified": (
        TMPFS + V1_SYSTEMD + V2_UNIFIED,
        Hierarchy.UNIFIED,
        "/sys/fs/cgroup/unified",
    ),
    "legacy: v1 only": (TMPFS + V1_MEMORY + V1_SYSTEMD, Hierarchy.LEGACY, None),
    "none: no cgroup file system": (TMPFS, Hierarchy.NONE, None),
}


@pytest.mark.parametrize(("mountinfo", "kind", "mount"), HIERARCHIES.values(), ids=HIERARCHIES)
def test_detect_hierarchy(mountinfo: str, kind: Hierarchy, mount: str | None) -> None:
    assert detect_hierarchy(mountinfo) == (kind, Path(mount) if mount else None)


SERVICE = Path("/sys/fs/cgroup/system.slice/edged.service")
HYBRID = TMPFS + V1_MEMORY + V2_UNIFIED

LAYOUTS = {
    "auto under systemd: the service's cgroup": (
        "auto",
        V2_ROOT,
        "0::/system.slice/edged.service\n",
        CgroupLayout(Hierarchy.UNIFIED, SERVICE),
    ),
    "auto, already in the supervisor leaf: its parent": (
        "auto",
        V2_ROOT,
        "0::/system.slice/edged.service/supervisor\n",
        CgroupLayout(Hierarchy.UNIFIED, SERVICE),
    ),
    "auto on a hybrid host: the unified mount": (
        "auto",
        HYBRID,
        "4:memory:/x\n0::/user.slice\n",
        CgroupLayout(Hierarchy.HYBRID, Path("/sys/fs/cgroup/unified/user.slice")),
    ),
    "a path from edged.toml": (
        "/sys/fs/cgroup/edge.slice",
        V2_ROOT,
        "0::/system.slice/edged.service\n",
        CgroupLayout(Hierarchy.UNIFIED, Path("/sys/fs/cgroup/edge.slice")),
    ),
    "off": (
        "off",
        V2_ROOT,
        "0::/\n",
        CgroupLayout(Hierarchy.UNIFIED, problem="[workers] cgroupRoot is off"),
    ),
    "no cgroup v2 line in /proc/self/cgroup": (
        "auto",
        V2_ROOT,
        "4:memory:/x\n",
        CgroupLayout(Hierarchy.UNIFIED, problem="edged is in no cgroup v2 (/proc/self/cgroup)"),
    ),
}


@pytest.mark.parametrize(("setting", "mountinfo", "own", "expected"), LAYOUTS.values(), ids=LAYOUTS)
def test_plan_layout(setting: str, mountinfo: str, own: str, expected: CgroupLayout) -> None:
    assert plan_layout(setting, mountinfo=mountinfo, proc_cgroup=own) == expected


def test_plan_layout_on_cgroup_v1_says_so() -> None:
    layout = plan_layout("auto", mountinfo=TMPFS + V1_MEMORY, proc_cgroup="4:memory:/x\n")
    assert not layout.usable and layout.limits_mode == "rlimit"
    assert "no cgroup v2 hierarchy is mounted (legacy cgroups)" in layout.problem


ON_SERVICE = CgroupLayout(Hierarchy.UNIFIED, SERVICE)
ON_HYBRID = CgroupLayout(Hierarchy.HYBRID, Path("/sys/fs/cgroup/unified/user.slice"))
CONTROLLER_CHECKS = {
    "delegated with cpu and memory: usable": (ON_SERVICE, "cpuset cpu io memory pids", True, ""),
    "hybrid: the controllers are v1's": (
        ON_HYBRID,
        "hugetlb",
        True,
        "cgroup v1/hybrid hierarchy: the cpu and memory controllers are bound to cgroup v1",
    ),
    "unified, memory missing: not delegated": (
        ON_SERVICE,
        "cpu pids",
        True,
        f"{SERVICE} lacks the memory controllers (is the service Delegate=yes?)",
    ),
    "not writable": (ON_SERVICE, "cpu memory", False, "is not writable by edged"),
    "unreadable": (ON_SERVICE, None, True, "is not a cgroup v2 directory edged can read"),
}


@pytest.mark.parametrize(
    ("layout", "controllers", "writable", "problem"),
    CONTROLLER_CHECKS.values(),
    ids=CONTROLLER_CHECKS,
)
def test_check_controllers(
    layout: CgroupLayout, controllers: str | None, writable: bool, problem: str
) -> None:
    words = controllers.split() if controllers is not None else None
    checked = check_controllers(layout, words, writable=writable)
    assert problem in checked.problem and bool(checked.problem) == bool(problem)
    assert checked.workloads == (None if problem else SERVICE / "workloads")


def test_plan_steps_moves_edged_out_before_enabling_controllers() -> None:
    assert plan_steps(ON_SERVICE, [812, 813]) == (
        Step("mkdir", SERVICE / "supervisor"),
        Step("write", SERVICE / "supervisor" / "cgroup.procs", "812"),
        Step("write", SERVICE / "supervisor" / "cgroup.procs", "813"),
        Step("write", SERVICE / "cgroup.subtree_control", "+cpu +memory"),
        Step("mkdir", SERVICE / "workloads"),
        Step("write", SERVICE / "workloads" / "cgroup.subtree_control", "+cpu +memory"),
    )
    assert plan_steps(ON_SERVICE, [])[0] == Step(
        "write", SERVICE / "cgroup.subtree_control", "+cpu +memory"
    )
    assert plan_steps(ON_SERVICE.unusable("off"), [812]) == ()


class CgroupRules:
    """A model of what cgroup v2 allows: a cgroup with controllers in its subtree_control holds
    no process (EBUSY), and a child can enable only what its parent enabled (ENOENT)."""

    def __init__(self, root: Path, procs: list[int]) -> None:
        self.procs: dict[Path, set[int]] = {root: set(procs)}
        self.enabled: dict[Path, set[str]] = {root.parent: {"cpu", "memory"}, root: set()}

    def apply(self, step: Step) -> None:
        if step.kind == "mkdir":
            self.procs.setdefault(step.path, set())
            self.enabled.setdefault(step.path, set())
        elif step.path.name == "cgroup.procs":
            group, pid = step.path.parent, int(step.value)
            assert not self.enabled[group], f"EBUSY: {group} enables controllers"
            for held in self.procs.values():
                held.discard(pid)
            self.procs[group].add(pid)
        else:
            group = step.path.parent
            wanted = {w.lstrip("+") for w in step.value.split()}
            assert not self.procs[group], f"EBUSY: {group} holds processes"
            assert wanted <= self.enabled[group.parent], f"ENOENT: {group.parent} lacks some"
            self.enabled[group] |= wanted


def test_the_planned_order_is_one_the_kernel_accepts() -> None:
    kernel = CgroupRules(SERVICE, [812])
    for step in plan_steps(ON_SERVICE, [812]):
        kernel.apply(step)
    assert kernel.procs[SERVICE / "supervisor"] == {812}
    assert kernel.enabled[SERVICE / "workloads"] == {"cpu", "memory"}
    # a worker's leaf below workloads may now hold the worker and get cpu.max and memory.max
    kernel.apply(Step("mkdir", SERVICE / "workloads" / "r-0"))
    kernel.apply(Step("write", SERVICE / "workloads" / "r-0" / "cgroup.procs", "900"))


def test_the_old_order_is_refused_by_the_model() -> None:
    """What edged did before: controllers enabled in the cgroup it runs in (EBUSY)."""
    kernel = CgroupRules(SERVICE, [812])
    with pytest.raises(AssertionError, match="EBUSY"):
        kernel.apply(Step("write", SERVICE / "cgroup.subtree_control", "+cpu +memory"))


def fake_delegated(root: Path, procs: str = "4242\n") -> Path:
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.procs").write_text(procs)
    return root


def test_apply_steps_against_a_fake_cgroupfs(tmp_path: Path) -> None:
    root = fake_delegated(tmp_path / "edged.service")
    layout = CgroupLayout(Hierarchy.UNIFIED, root)
    apply_steps(plan_steps(layout, [4242]))
    assert (root / "supervisor" / "cgroup.procs").read_text() == "4242"
    assert (root / "cgroup.subtree_control").read_text() == "+cpu +memory"
    assert (root / "workloads" / "cgroup.subtree_control").read_text() == "+cpu +memory"
    apply_steps(plan_steps(layout, []))  # edged started again in place: the same layout


def test_apply_steps_names_the_write_that_failed(tmp_path: Path) -> None:
    root = fake_delegated(tmp_path / "edged.service")
    (root / "cgroup.subtree_control").mkdir()  # the write fails (EISDIR)
    with pytest.raises(CgroupError) as caught:
        apply_steps(plan_steps(CgroupLayout(Hierarchy.UNIFIED, root), [4242]))
    assert str(caught.value).startswith(
        f"[Errno {errno.EISDIR}] cannot write '+cpu +memory' to {root}/cgroup.subtree_control"
    )


def test_apply_steps_explains_ebusy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def busy(self: Path, text: str) -> int:
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(Path, "write_text", busy)
    with pytest.raises(CgroupError, match=r"no-internal-processes rule: .* still holds processes"):
        apply_steps([Step("write", tmp_path / "cgroup.subtree_control", "+cpu +memory")])


def test_delegate_a_configured_path(tmp_path: Path) -> None:
    """The daemon's entry: reads /proc, checks, lays out a fake delegated tree."""
    if detect_hierarchy(Path("/proc/self/mountinfo").read_text())[1] is None:
        pytest.skip("no cgroup v2 mount on this host: plan_layout refuses any path")
    root = fake_delegated(tmp_path / "edged.service")
    layout = delegate(str(root))
    assert layout.workloads == root / "workloads" and layout.limits_mode == "cgroup"
    assert (root / "supervisor" / "cgroup.procs").read_text() == "4242"


def test_delegate_refusal_is_a_reason_not_an_exception(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu pids\n")
    layout = delegate(str(tmp_path))
    assert layout.workloads is None and layout.limits_mode == "rlimit"
    assert layout.problem
    assert delegate("off").problem == "[workers] cgroupRoot is off"


EGRESS_BASES = {
    "in the supervisor leaf: below workloads": (
        "/system.slice/edged.service/supervisor",
        "/system.slice/edged.service/workloads/edgefleet-egress",
    ),
    "elsewhere: below its own cgroup": ("/user.slice", "/user.slice/edgefleet-egress"),
    "the root cgroup": ("/", "/edgefleet-egress"),
}


@pytest.mark.parametrize(("own", "expected"), EGRESS_BASES.values(), ids=EGRESS_BASES)
def test_egress_leaves_stay_below_workloads(own: str, expected: str) -> None:
    assert egress_base(own) == expected


def test_workers_may_outlive_edged_only_where_systemd_can_start_it_again() -> None:
    from edged.runtime.delegating import keep_blocker, unit_of

    usable = CgroupLayout(Hierarchy.UNIFIED, Path("/sys/fs/cgroup/system.slice/edged.service"))
    assert "DelegateSubgroup=supervisor" in keep_blocker(usable, delegate_subgroup="")
    assert "219/CGROUP" in keep_blocker(usable, delegate_subgroup=None)
    assert keep_blocker(usable, delegate_subgroup="supervisor") == ""
    # systemd 252: kept across the edged restarts inside the launcher, ended at the unit's stop
    assert keep_blocker(usable, delegate_subgroup="", launcher_cleanup=True) == ""
    rlimits = usable.unusable("cgroup v1/hybrid hierarchy")
    assert keep_blocker(rlimits, delegate_subgroup=None) == ""
    assert unit_of(usable.delegated) == "edged.service"
    assert unit_of(Path("/sys/fs/cgroup/user.slice")) == ""
    assert unit_of(None) == ""


def test_the_units_cleanup_is_read_from_what_systemctl_shows() -> None:
    from edged.runtime.delegating import has_launcher_cleanup, read_launcher_cleanup

    shown = (
        "{ path=/opt/edgefleet/bin/edged-launcher ; argv[]=/opt/edgefleet/bin/edged-launcher "
        "cleanup ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; "
        "code=(null) ; status=0/0 }\n"
    )
    assert has_launcher_cleanup(shown)
    assert not has_launcher_cleanup(shown.replace("launcher cleanup", "launcher run"))
    assert not has_launcher_cleanup(shown.replace("edged-launcher ", "rm -rf /tmp/edged-launcher "))
    assert not has_launcher_cleanup("")
    # not under the launcher (no EDGED_LAUNCHER_STATE): systemd is not even asked
    assert not read_launcher_cleanup("edged.service", {})
    assert not read_launcher_cleanup("", {"EDGED_LAUNCHER_STATE": "/x"})
