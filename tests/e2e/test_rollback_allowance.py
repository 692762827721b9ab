"""Going back two versions, end to end: a real hub, two real edged devices. After 1.0.0 ->
1.1.0 -> 1.2.0, ``rollout undo --to-revision 1`` (1.0.0) is refused by the first device and
rolled back to 1.2.0: first for its metadata (signed before what the devices accepted since),
then, signed again, for its model version (no allowance). With a signed allowance for 1.0.0
pushed to the hub (``edgectl rollback push``), the same revision goes through and the devices
serve 1.0.0. The hub keeps no TUF repository (``hub init --no-tuf``): with TUF a separate
allowance is refused, and the allowance goes in the publisher's targets
(``test_tuf_rollback.py``; ``test_tuf_publisher_reach.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enrolled_devices
from harness import Edged
from test_rollouts import apply, on_device, push, run_until

N = 2


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    h = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init("--no-tuf").start()
    yield h
    h.stop()


@pytest.fixture
def devices(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> Iterator[list[Edged]]:
    with enrolled_devices(hub, tmp_path, edged_factory, N, SIGNED_DEVICE_CONFIG) as started:
        yield started


def complete(s: dict[str, object]) -> bool:
    rollout = s.get("rollout")
    return isinstance(rollout, dict) and rollout.get("phase") == "Complete"


def test_an_allowance_pushed_to_the_hub_lets_devices_go_back_two_versions(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    for version in ("1.0.0", "1.1.0", "1.2.0"):
        push(hub, tmp_path, version)
    apply(hub, tmp_path, "1.0.0")
    run_until(hub, devices, lambda s: s["readyDevices"] == N, 120, new="1.0.0", budget=N)
    for version in ("1.1.0", "1.2.0"):
        apply(hub, tmp_path, version)
        run_until(hub, devices, complete, 180, new=version, budget=1)

    def refused_with(reason: str) -> None:
        samples = run_until(
            hub,
            devices,
            lambda s: s.get("rollout", {}).get("phase") == "RolledBack",
            120,
            new="1.0.0",
            budget=1,
        )
        assert reason in samples[-1]["rollout"]["message"], samples[-1]["rollout"]

    # as it was signed then: older metadata than the devices accepted since
    undo = hub.edgectl("rollout", "undo", "det", "--to-revision", "1", check=False)
    assert undo.returncode == 0, undo.stdout + undo.stderr
    refused_with("MetadataRollback")

    # signed again (the same bytes, newer metadata): an older model version, no allowance
    again = hub.edgectl(
        "models", "push", str(tmp_path / "det-1.0.0.onnx"), "--name", "det", "--version", "1.0.0",
        check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert hub.edgectl("rollout", "resume", "det", check=False).returncode == 0
    refused_with("ModelVersionRollback")

    # with a signed allowance pushed to the hub: the same revision retried goes through
    allowance = tmp_path / "det-1.0.0.rollback.json"
    signed = hub.edgectl(
        "rollback", "allow", "--name", "det", "--version", "1.0.0",
        "--model", str(tmp_path / "det-1.0.0.onnx"),
        "--key", str(hub.data / "publisher.key"), "--out", str(allowance),
    )  # fmt: skip
    assert signed.returncode == 0, signed.stdout + signed.stderr
    pushed = hub.edgectl("rollback", "push", str(allowance), check=False)
    assert pushed.returncode == 0 and "stored" in pushed.stdout, pushed.stdout + pushed.stderr
    assert hub.edgectl("rollout", "resume", "det", check=False).returncode == 0
    run_until(hub, devices, complete, 180, new="1.0.0", budget=1)
    assert all(on_device(e)[0] == {"1.0.0"} for e in devices)
