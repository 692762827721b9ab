"""A uid of its own per worker replica under a real ``edged run`` as root: two replicas run as
two uids that are neither root nor edged's (read from ``/proc/PID/status``), serve inference,
are not findings of the drift watch, free their uids when they stop, and get the same ones
back when their slots start again. ``separateUids = false`` keeps them as root and says why,
unless a baseline requires the sandbox.

Needs root (skipped otherwise): only root can give workers another uid.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness import UNSIGNED_CONFIG, Edged, wait_for, write_manifest

from edged.runtime.identities import LOCK_DIR
from edgefleet.demo import TINY_MLP

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root can give workers a uid")

BASELINE = """\
apiVersion: edgefleet.io/v1
kind: SecurityBaseline
metadata: {name: fleet}
spec:
  drift: {action: alert, period: 1s}
"""


def ids_of(pid: int) -> tuple[list[int], list[int], str]:
    lines = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return (
        [int(x) for x in lines["Uid"].split()],
        [int(x) for x in lines["Gid"].split()],
        (lines["Groups"].strip()),
    )


def uids_by_slot(e: Edged) -> dict[str, int]:
    out = {}
    for r in e.workload("mlp")["replicas"]:
        sandbox = r["sandbox"]
        assert sandbox["inForce"] and sandbox["separateUid"] is True, sandbox
        out[r["id"].rsplit("-", 1)[1]] = sandbox["uid"]
    return out


def replicas(e: Edged) -> list[dict]:
    try:
        return list(e.workload("mlp")["replicas"])
    except KeyError:
        return []


def two_ready(e: Edged) -> bool:
    found = replicas(e)
    return len(found) == 2 and all(r["ready"] for r in found)


# A range of its own, outside the default one every other edged of the suite takes from: a
# test on another xdist worker, running edged as root with a workload of the same name
# (the same preferred uid), could otherwise take a uid between this test's stop and start.
OWN_RANGE = "[workers]\nuidBase = 60100\nuidCount = 64\n"


def test_each_replica_runs_as_its_own_uid_which_is_freed_and_reused(
    model_dir: Path, edged_factory, tmp_path: Path
) -> None:
    write_manifest(model_dir, replicas=2)
    (model_dir / "baseline.yaml").write_text(BASELINE)
    config = UNSIGNED_CONFIG.format(absent=tmp_path / "no-root") + OWN_RANGE
    e: Edged = edged_factory(model_dir, config=config).start()
    wait_for(lambda: two_ready(e), 90, "two ready replicas")
    uids = uids_by_slot(e)
    assert len(set(uids.values())) == 2 and not {0, os.getuid()} & set(uids.values())
    assert all(60100 <= u < 60164 for u in uids.values()), uids
    for r in e.workload("mlp")["replicas"]:
        uid = r["sandbox"]["uid"]
        assert ids_of(r["pid"]) == ([uid] * 4, [uid] * 4, "")
        assert (LOCK_DIR / str(uid)).exists()
    for _ in range(4):
        status, doc = e.infer("mlp", [[0.5] * TINY_MLP[0]])
        assert status == 200, doc
    # the drift watch sees its own workers, not strays or openers of models
    compliance = lambda: e.status()["device"]["compliance"]  # noqa: E731
    wait_for(lambda: compliance().get("checkedAt") is not None, 30, "a drift check")
    assert compliance()["compliant"] is True, compliance()

    # stopped: the uids are free (systemd's lock files gone) ...
    (model_dir / "mlp.yaml").unlink()
    wait_for(lambda: not replicas(e), 60, "the replicas to stop")
    wait_for(lambda: not any((LOCK_DIR / str(u)).exists() for u in uids.values()), 30,
             "the uids to be freed")  # fmt: skip
    # ... and each slot gets its own again
    write_manifest(model_dir, replicas=2)
    wait_for(lambda: two_ready(e), 90, "two ready replicas again")
    assert uids_by_slot(e) == uids
    assert e.terminate() == 0
    assert not any((LOCK_DIR / str(u)).exists() for u in uids.values())


REQUIRE = """\
apiVersion: edgefleet.io/v1
kind: SecurityBaseline
metadata: {name: strict}
spec:
  requireSandbox: true
"""


@pytest.mark.parametrize("required", [False, True], ids=["off", "off-but-required"])
def test_separate_uids_can_be_turned_off_unless_a_baseline_requires_the_sandbox(
    model_dir: Path, edged_factory, tmp_path: Path, required: bool
) -> None:
    write_manifest(model_dir)
    if required:
        (model_dir / "baseline.yaml").write_text(REQUIRE)
    config = UNSIGNED_CONFIG.format(absent=tmp_path / "no-root") + (
        "[workers]\nseparateUids = false\n"
    )
    e: Edged = edged_factory(model_dir, config=config).start()
    e.wait_ready()
    (replica,) = e.workload("mlp")["replicas"]
    sandbox = replica["sandbox"]
    if required:  # the baseline wins over edged.toml, as it does over sandbox = "off"
        assert sandbox["separateUid"] is True and sandbox["uid"] not in (0, os.getuid())
        assert "uidNote" not in sandbox
        assert ids_of(replica["pid"])[0] == [sandbox["uid"]] * 4
    else:
        assert sandbox["separateUid"] is False and sandbox["uid"] == os.geteuid() == 0
        assert sandbox["uidNote"] == "turned off ([workers] separateUids = false)"
        assert ids_of(replica["pid"])[0] == [0] * 4
    assert e.terminate() == 0
