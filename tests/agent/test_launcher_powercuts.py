"""Power cuts during an update: the launcher is killed (kill -9 of it and every process it
started) at each of its steps in turn, from edged's request to the commit, and the next boot
must run a working edged and finish the update; the launcher's temp files left behind by a
cut are harmless."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launchertesting import install_fake, install_slot, launcher, runs, state, try_request
from polltesting import wait_for

# the steps of one update, from the package's request to the commit (Launcher.step): the
# request taken (save: 3 steps, its removal: 1), the first try counted (3) and started (1), the
# commit saved (3), with the first start of the package (1) and a margin past the end
LAST_STEP = 12
STEPS = range(1, LAST_STEP + 2)


@pytest.mark.parametrize("cut_at", STEPS)
def test_a_power_cut_at_any_step_boots_a_working_edged(tmp_path: Path, cut_at: int) -> None:
    data = tmp_path / "d"
    package = install_fake(tmp_path / "package", "0.1.0", "request")
    install_slot(data, "b", "0.2.0", "commit")
    (data / "next-request.json").write_text(json.dumps(try_request("b", "0.2.0")))

    def committed() -> bool:
        return state(data)["committed"] == "b"

    with launcher(data, package, env={"EDGED_LAUNCHER_FAILPOINT": str(cut_at)}) as lp:
        # a cut kills the launcher (its last step comes after the commit is saved, so the
        # commit alone does not say the cut happened); past the last step, the commit
        wait_for(
            lambda: lp.proc.poll() is not None or (cut_at > LAST_STEP and committed()),
            20,
            "the cut" if cut_at <= LAST_STEP else "the commit",
            detail=lp.output,
        )
        cut = f"failpoint {cut_at} " in lp.output()
        lp.kill_everything()
    assert cut or cut_at > LAST_STEP, lp.output()
    before = len(runs(data))
    # the next boot: a working edged, and the update finishes (or was finished)
    with launcher(data, package) as lp:
        wait_for(lambda: len(runs(data)) > before, 20, "an edged after the cut", detail=lp.output)
        wait_for(committed, 20, "the commit after the cut", detail=lp.output)
        wait_for(lambda: runs(data)[-1]["slot"] == "b", 20, "slot b running")
        s = state(data)
        assert s["trying"] is None and s["last"]["outcome"] == "Committed"
        assert not (data / "agent" / "request.json").exists()
        assert lp.stop() == 0
