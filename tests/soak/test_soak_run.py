"""The soak harness in CI (docs/soak.md): a short run of the whole fleet — a root hub, a
regional hub of two replicas on a 3-member etcd, two real edged and 50 simulated devices — under
the faults and operator actions of a fixed seed, every invariant judged. The long run is the
same with ``python -m tests.soak.run --duration 3600``."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from soakplan import POWER, SLOW, SLOW_DELAY, VERSIONS, VM_DEPLOYMENT, make_plan
from soakrun import Settings, run

CI_SEED = 35
CI_DURATION = 75.0


def test_the_plan_is_the_seeds() -> None:
    targets = {
        "root": "hub",
        "eu-r0": "hub",
        "eu-r1": "hub",
        "etcd-0": "etcd",
        "etcd-1": "etcd",
        "etcd-2": "etcd",
        "dev-0": "edged",
        "dev-0-worker": "worker",
        "eu-root-link": "link",
    }
    a = make_plan(CI_SEED, 600, targets)
    assert a == make_plan(CI_SEED, 600, targets)
    assert a != make_plan(CI_SEED + 1, 600, targets)
    assert {f.kind for f in a.faults} == {"hub", "etcd", "edged", "worker", "link"}
    assert {f.action for f in a.faults} == {"kill", "stop", "cut"}
    for f in a.faults:  # every fault over by the end; one per target at a time
        assert f.at + f.duration <= 600
        same = [g for g in a.faults if g.target == f.target and g is not f]
        assert all(g.at >= f.at + f.duration or g.at + g.duration <= f.at for g in same)
    etcd = [f for f in a.faults if f.kind == "etcd"]  # never two etcd members out at once
    for f in etcd:
        assert all(g is f or g.at >= f.at + f.duration or g.at + g.duration <= f.at for g in etcd)
    assert {a.op for a in a.actions} == {"apply", "delete", "read"}


def test_slow_io_is_a_stream_of_its_own() -> None:
    """A device's slow disk adds its faults and leaves the seed's others as they were; each
    slows every operation by 50 ms to 2 s for a window, then the disk is normal."""
    targets = {"root": "hub", "etcd-0": "etcd", "dev-1": "edged", "dev-1-net": "net",
               "eu-root-link": "link", "root-disk": "disk", "dev-1-clock": "clock"}  # fmt: skip
    before = make_plan(CI_SEED, 600, targets)
    after = make_plan(CI_SEED, 600, {**targets, "dev-1-io": "io"})
    slow = [f for f in after.faults if f.target == "dev-1-io"]
    assert [f for f in after.faults if f not in slow] == before.faults
    assert slow and all(f.action == SLOW and f.kind == "io" for f in slow)
    assert all(SLOW_DELAY[0] <= f.delay <= SLOW_DELAY[1] and f.duration > 0 for f in slow)
    assert all(f.delay == 0 for f in before.faults)
    assert len({f.delay for f in slow}) > 1
    for f, g in itertools.pairwise(slow):  # one window at a time
        assert f.at + f.duration <= g.at


def test_a_hubs_slow_disk_is_a_stream_of_its_own() -> None:
    """The root's and an etcd member's slow disks add their faults and leave a seed's others
    as they were, a device's slow disk included, its delays too."""
    targets = {"root": "hub", "etcd-0": "etcd", "dev-1": "edged", "dev-1-io": "io",
               "root-disk": "disk", "dev-1-clock": "clock"}  # fmt: skip
    before = make_plan(CI_SEED, 600, targets)
    after = make_plan(CI_SEED, 600, {**targets, "root-io": "io", "etcd-2-io": "io"})
    hubs = [f for f in after.faults if f.target in ("root-io", "etcd-2-io")]
    assert [f for f in after.faults if f not in hubs] == before.faults
    assert {f.target for f in hubs} == {"root-io", "etcd-2-io"}
    assert all(f.action == SLOW and SLOW_DELAY[0] <= f.delay <= SLOW_DELAY[1] for f in hubs)


def test_some_applies_push_a_rollback_allowance_first() -> None:
    """One apply of a working version in three is preceded by that version pushed again with
    a rollback allowance; never the broken one, never another kind of call."""
    plan = make_plan(CI_SEED, 3600, {"root": "hub"})
    allowed = [a for a in plan.actions if a.allow_rollback]
    applies = [a for a in plan.actions if a.op == "apply" and a.version in VERSIONS]
    assert all(a in applies for a in allowed)
    assert 0.2 < len(allowed) / len(applies) < 0.45
    assert all(a.key.startswith("ModelDeployment/") for a in allowed)


def test_a_vms_power_cuts_and_its_updates_are_streams_of_their_own() -> None:
    """Lab VMs (``--vm-devices``) add power cuts (QEMU killed, booted again) minutes apart and
    the operator's version changes of soak-v, each pushed again first; a seed's other faults
    and actions stay as they were."""
    targets = {"root": "hub", "etcd-0": "etcd", "dev-1": "edged", "dev-1-io": "io",
               "eu-root-link": "link"}  # fmt: skip
    before = make_plan(CI_SEED, 3600, targets)
    after = make_plan(CI_SEED, 3600, {**targets, "vm-0": "vm"})
    cuts = [f for f in after.faults if f.target == "vm-0"]
    assert [f for f in after.faults if f not in cuts] == before.faults
    assert after.actions == before.actions and after.enrollments == before.enrollments
    assert not before.vm_updates
    assert cuts and all(f.action == POWER and f.kind == "vm" and f.duration > 0 for f in cuts)
    assert 8 <= len(cuts) <= 40  # every 3 minutes on average: a boot under TCG takes minutes
    updates = after.vm_updates
    assert 12 <= len(updates) <= 60
    assert all(u.key == f"ModelDeployment/{VM_DEPLOYMENT}" and u.allow_rollback for u in updates)
    versions = [u.version for u in updates]
    assert all(v != w for v, w in itertools.pairwise(versions)) and set(versions) == set(VERSIONS)
    assert all(u.at < 3600 for u in updates) and updates == sorted(updates, key=lambda u: u.at)


@pytest.mark.scenario
@pytest.mark.timeout(480)
def test_a_short_soak_run_keeps_every_invariant(tmp_path: Path) -> None:
    """Seed 35 found the follower defect (docs/soak.md): a device on a follower replica got no
    new desired state and never converged; it converges now."""
    settings = Settings(
        seed=CI_SEED,
        duration=CI_DURATION,
        directory=tmp_path / "soak",
        real_devices=2,
        sim_devices=50,
        converge_within=120,
    )
    result = run(settings)
    report = (tmp_path / "soak" / "report.txt").read_text()
    assert result["ok"], report
    assert result["faults"]["total"] >= 5, report
    assert result["invariants"]["linearizable"]["operations"] >= 30, report
    # the harness judged itself too: its descriptors and threads within their bound
    assert "threads" in result["invariants"]["growth"]["processes"]["harness"], report
    if os.geteuid() == 0:  # CI: namespaces and mounts can be made, so every kind ran
        assert not result["faults"]["not_run_here"], report
        kinds = {k.split(":")[0] for k in result["faults"]["by_kind"]}
        assert {"link", "net", "disk", "clock", "io"} <= kinds, report
