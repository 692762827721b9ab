"""Going back two versions, end to end: a real hub, two real edged devices. After 1.0.0 ->
1.1.0 -> 1.2.0, ``rollout undo --to-revision 1`` (1.0.0) is below what the devices accepted:
the hub refuses it up front (nothing is sent, nothing rolls), first for its metadata (signed
before what the devices accepted since: ``MetadataRollback``, with the commands that fix it),
then, signed again, for its model version (no allowance: ``ModelVersionRollback``, naming the
``edgectl rollback allow`` that permits it). With that allowance pushed to the hub
(``edgectl rollback push``), the same undo is accepted and the devices serve 1.0.0.
(Issue 29, item 6: the undo used to exit 0 and fail on every device.) The hub keeps no TUF
repository (``hub init --no-tuf``): with TUF a separate allowance is refused, and the allowance
goes in the publisher's targets (``test_tuf_rollback.py``; ``test_tuf_publisher_reach.py``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fleet import HubProcess
from harness import Edged, wait_for
from rollouttesting import apply, on_device, push, run_until

N = 2


@pytest.fixture
def fleet_size() -> int:
    return N


@pytest.fixture
def hub_init_args() -> tuple[str, ...]:
    return ("--no-tuf",)


def rollout_of(hub: HubProcess) -> tuple[object, object]:
    doc = json.loads(hub.edgectl("get", "deployments", "det", "-o", "json").stdout)
    rollout = doc["status"]["rollout"]
    return rollout["revision"], rollout["phase"]


def complete(s: dict[str, object]) -> bool:
    rollout = s.get("rollout")
    return isinstance(rollout, dict) and rollout.get("phase") == "Complete"


def test_an_allowance_pushed_to_the_hub_lets_devices_go_back_two_versions(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    # without TUF a push signs metadataVersion = the Unix second: 1.0.0 is signed in an earlier
    # second than the versions after it, so its metadata is older than what devices accept later
    pushed_at = int(time.time())
    push(hub, tmp_path, "1.0.0")
    apply(hub, tmp_path, "1.0.0")
    run_until(hub, devices, lambda s: s["readyDevices"] == N, 120, new="1.0.0", budget=N)
    wait_for(lambda: int(time.time()) > pushed_at + 1, 5, "the next second")
    for version in ("1.1.0", "1.2.0"):
        push(hub, tmp_path, version)
        latest_at = int(time.time())
        apply(hub, tmp_path, version)
        run_until(hub, devices, complete, 180, new=version, budget=1)

    def undo_refused_with(*needles: str) -> None:
        before = rollout_of(hub)
        undo = hub.edgectl("rollout", "undo", "det", "--to-revision", "1", check=False)
        said = undo.stdout + undo.stderr
        assert undo.returncode != 0, said  # refused up front, not on every device
        for needle in needles:
            assert needle in said, said
        after = rollout_of(hub)
        assert after == before, (before, after)  # nothing written: no new revision, no rollout
        assert all(on_device(e)[0] == {"1.2.0"} for e in devices)

    # as it was signed then: older metadata than the devices accepted since
    undo_refused_with(
        "MetadataRollback",
        "edgectl models push MODEL_FILE --name det --version 1.0.0",
        "edgectl rollback allow --name det --version 1.0.0",
    )

    # signed again (the same bytes, newer metadata): an older model version, no allowance
    wait_for(lambda: int(time.time()) > latest_at + 1, 5, "a second after 1.2.0 was signed")
    again = hub.edgectl(
        "models", "push", str(tmp_path / "det-1.0.0.onnx"), "--name", "det", "--version", "1.0.0",
        check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    undo_refused_with(
        "ModelVersionRollback",
        "edgectl rollback allow --name det --version 1.0.0 --sha256 ",
        "edgectl rollback push det-1.0.0.rollback.json",
    )

    # with a signed allowance pushed to the hub: the same undo is accepted and goes through
    allowance = tmp_path / "det-1.0.0.rollback.json"
    signed = hub.edgectl(
        "rollback", "allow", "--name", "det", "--version", "1.0.0",
        "--model", str(tmp_path / "det-1.0.0.onnx"),
        "--key", str(hub.data / "publisher.key"), "--out", str(allowance),
    )  # fmt: skip
    assert signed.returncode == 0, signed.stdout + signed.stderr
    pushed = hub.edgectl("rollback", "push", str(allowance), check=False)
    assert pushed.returncode == 0 and "stored" in pushed.stdout, pushed.stdout + pushed.stderr
    undo = hub.edgectl("rollout", "undo", "det", "--to-revision", "1", check=False)
    assert undo.returncode == 0, undo.stdout + undo.stderr
    run_until(hub, devices, complete, 180, new="1.0.0", budget=1)
    assert all(on_device(e)[0] == {"1.0.0"} for e in devices)
