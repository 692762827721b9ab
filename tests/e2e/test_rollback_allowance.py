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
from deploymenttesting import det_canary
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


CANARY = det_canary('["50%", {{pause: {{}}}}, "100%"]')


def test_devices_refusing_the_stable_version_applied_again_hold_the_rollout_saying_why(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    """Soak defect 4: an operator's downgrade the devices refuse by design (no rollback
    allowance) left them serving nothing, the rollout ``Complete (StableTemplate)`` with 0 of
    N available. 1.1.0 then 1.2.0 are canaried on dev-0 (each paused at 50%: the stable
    revision stays 1.0.0), then 1.0.0 is applied again: the stable template, no new revision,
    and dev-0 refuses it (its metadata is older than 1.2.0's, and 1.0.0 is neither what it
    runs nor what it ran just before). The rollout is not Complete: it names dev-0, why and
    how to allow it; dev-0 keeps serving 1.2.0 (or a later canary) meanwhile. Signed again
    and allowed, dev-0 takes 1.0.0 and the rollout completes."""
    dev0, dev1 = devices
    pushed_at = int(time.time())
    push(hub, tmp_path, "1.0.0")
    apply(hub, tmp_path, "1.0.0", CANARY)
    run_until(hub, devices, lambda s: s["readyDevices"] == N, 120, new="1.0.0", budget=N)
    latest_at = pushed_at

    def ran_before() -> str:  # what dev-0 would take back as it was (edged's hub state)
        doc = json.loads((dev0.data / "state" / "hub.json").read_text())
        return str(next(
            (p["deployment"]["spec"]["model"]["version"] for p in doc.get("previous", [])),
            "",
        ))  # fmt: skip

    # Canaries on dev-0 until it ran one canary version right before another: the hub may
    # first take dev-0 back to the stable 1.0.0 before the next canary (it did under load),
    # and then 1.0.0 is what dev-0 ran just before, which it takes back by design.
    for version in ("1.1.0", "1.2.0", "1.3.0", "1.4.0"):
        wait_for(lambda at=latest_at: int(time.time()) > at + 1, 5, "the next second")
        push(hub, tmp_path, version)
        latest_at = int(time.time())
        apply(hub, tmp_path, version, CANARY)
        run_until(
            hub,
            devices,
            lambda s, v=version: (
                s.get("rollout", {}).get("phase") == "Paused" and on_device(dev0)[0] == {v}
            ),
            180,
            new=version,
            budget=1,
        )
        latest = version
        if version != "1.1.0" and ran_before() not in ("", "1.0.0"):
            break
    assert ran_before() not in ("", "1.0.0"), ran_before()
    assert on_device(dev1)[0] == {"1.0.0"}

    apply(hub, tmp_path, "1.0.0", CANARY)  # the stable template: accepted, no new revision

    def shown() -> dict[str, object]:
        doc = json.loads(hub.edgectl("get", "deployments", "det", "-o", "json").stdout)
        return doc["status"]  # type: ignore[no-any-return]

    seen: list[object] = []

    def refused() -> dict[str, object] | None:
        status = shown()
        rollout = status.get("rollout")
        assert isinstance(rollout, dict)
        if rollout.get("version") == "1.0.0":
            seen.append((rollout.get("phase"), rollout.get("reason")))
        return rollout if rollout.get("reason") == "RevisionRefused" else None

    rollout = wait_for(
        refused, 120, "the rollout to say dev-0 refuses 1.0.0", detail=lambda: str(shown())
    )
    assert ("Complete", "StableTemplate") not in seen and rollout["phase"] == "Progressing"
    message = str(rollout["message"])
    assert "refused or failed on 1 of 2 device(s) (dev-0: 1.0.0 Refused: MetadataRollback" in (
        message
    ), message
    assert "edgectl rollback allow --name det --version 1.0.0" in message, message
    assert "edgectl models push MODEL_FILE --name det --version 1.0.0" in message, message
    assert "RevisionRefused" in hub.edgectl("get", "events").stdout
    said = hub.edgectl("rollout", "status", "det", check=False).stdout
    assert "Progressing (RevisionRefused)" in said, said
    # the device that refuses keeps serving what it ran; the other serves 1.0.0
    assert on_device(dev0)[0] == {latest} and on_device(dev1)[0] == {"1.0.0"}
    time.sleep(2)  # it stays so: nothing claims it Complete meanwhile
    assert shown()["rollout"]["phase"] == "Progressing", shown()  # type: ignore[index]
    assert on_device(dev0)[0] == {latest}

    # signed again (newer metadata) and allowed: dev-0 takes 1.0.0, the rollout completes
    wait_for(lambda: int(time.time()) > latest_at + 1, 5, f"a second after {latest} was signed")
    again = hub.edgectl(
        "models", "push", str(tmp_path / "det-1.0.0.onnx"), "--name", "det", "--version", "1.0.0",
        check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    allowance = tmp_path / "det-1.0.0.rollback.json"
    signed = hub.edgectl(
        "rollback", "allow", "--name", "det", "--version", "1.0.0",
        "--model", str(tmp_path / "det-1.0.0.onnx"),
        "--key", str(hub.data / "publisher.key"), "--out", str(allowance),
    )  # fmt: skip
    assert signed.returncode == 0, signed.stdout + signed.stderr
    pushed = hub.edgectl("rollback", "push", str(allowance), check=False)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    run_until(hub, devices, complete, 180, new="1.0.0", budget=1)
    assert all(on_device(e)[0] == {"1.0.0"} for e in devices)
