"""The soak harness with a lab VM (issue 35: power cuts in the device lab's VMs,
tests/soak/soakvms.py, docs/soak.md): seed 19's 4 minutes of faults — the region's and the
devices' as in the CI soak run, plus two power cuts of the VM (QEMU killed -9, booted again)
around two version changes of its deployment, each pushed again with a rollback allowance —
and every invariant judged, the VM included: it converges to the root's version, and after
the final power cut, booted with edged masked, ``edged check`` and its artifacts' hashes pass
in the guest. About 8 minutes under TCG on the 2-core development machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for _path in (HERE.parent / "soak", HERE.parent / "e2e"):
    if str(_path) not in sys.path:
        sys.path.append(str(_path))

pytestmark = [pytest.mark.vmlab, pytest.mark.timeout(2400)]

SEED = 19  # two power cuts (64 s, 203 s) and two version changes (77 s, 145 s) in 240 s


def test_a_soak_run_with_power_cuts_of_a_lab_vm_keeps_every_invariant(
    image: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from soakplan import POWER, make_plan
    from soakrun import Settings, run

    plan = make_plan(SEED, 240, {"root": "hub", "vm-0": "vm"})
    assert len([f for f in plan.faults if f.action == POWER]) == 2 and len(plan.vm_updates) == 2
    monkeypatch.setenv("EDGEFLEET_SOAK_VM_IMAGE", str(image))
    settings = Settings(
        seed=SEED,
        duration=240,
        directory=tmp_path / "soak",
        real_devices=1,
        sim_devices=10,
        converge_within=600,
        vm_devices=1,
    )
    result = run(settings)
    report = (tmp_path / "soak" / "report.txt").read_text()
    assert result["ok"], report
    assert result["faults"]["by_kind"].get("vm:power") == 2, report
    vm_checks = [
        c for c in result["invariants"]["intact"]["checks"] if c["what"].startswith("vm-0")
    ]
    assert len(vm_checks) == 1 and vm_checks[0]["ok"], report
    assert "edged check" in vm_checks[0]["detail"], report
