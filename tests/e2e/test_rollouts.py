"""Rolling updates end to end: a real hub, four real edged devices, real ONNX Runtime workers.

The budget is checked from the devices themselves (their status sockets) at every sample of
the whole run, not from what the hub says about them; the hub's own counts are checked too.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, TcpProxy, enroll
from harness import Edged
from rollouttesting import apply, on_device, push, run_until

N = 4


@pytest.fixture
def fleet_size() -> int:
    return N


def edgectl(hub: HubProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return hub.edgectl(*args, check=False)


def test_a_rolling_update_keeps_its_budget_and_a_failing_revision_is_rolled_back(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    for version in ("1.0.0", "1.1.0"):
        push(hub, tmp_path, version)
    push(hub, tmp_path, "2.0.0", bad=True)
    apply(hub, tmp_path, "1.0.0")  # the first revision goes everywhere at once
    run_until(hub, devices, lambda s: s["readyDevices"] == N, 120, new="1.0.0", budget=N)

    # 1. A good version rolls through every device, one at a time (maxSurge 0, maxUnavailable
    # 1), checked from the devices at every sample of the whole run.
    apply(hub, tmp_path, "1.1.0")
    samples = run_until(
        hub,
        devices,
        lambda s: s.get("rollout", {}).get("phase") == "Complete",
        180,
        new="1.1.0",
        budget=1,
    )
    assert samples[-1]["readyDevices"] == N and samples[-1]["availableDevices"] == N
    assert min(s["availableDevices"] for s in samples) == N  # never dropped
    assert all(on_device(e)[0] == {"1.1.0"} for e in devices)
    done = edgectl(hub, "rollout", "status", "det")
    assert done.returncode == 0 and "Complete" in done.stdout, done.stdout + done.stderr
    history = edgectl(hub, "rollout", "history", "det").stdout
    assert "1.0.0" in history and "1.1.0" in history and "stable" in history, history

    # 2. A version that fails to load: the first device fails it, the rollout is rolled back
    # everywhere, no other device was ever given it, and status never claims it.
    apply(hub, tmp_path, "2.0.0")
    samples = run_until(
        hub,
        devices,
        lambda s: s.get("rollout", {}).get("phase") == "RolledBack",
        120,
        new="2.0.0",
        budget=1,
    )
    assert all(s["updatedDevices"] == 0 for s in samples)
    rollout = samples[-1]["rollout"]
    assert rollout["reason"] == "RevisionFailed"
    assert "2.0.0 Failed: " in rollout["message"], rollout
    failed = edgectl(hub, "rollout", "status", "det", "--watch", "--timeout", "30s")
    assert failed.returncode == 1 and "2.0.0 Failed: " in failed.stdout, failed.stdout
    # every device serves the stable revision again, and the others never held 2.0.0
    touched = [e for e in devices if "2.0.0" in e.logs()]
    assert len(touched) == 1
    run_until(
        hub,
        devices,
        lambda s: s["availableDevices"] == N and not s["failing"],
        60,
        new="1.1.0",
        budget=1,
    )
    events = json.loads(
        hub.edgectl("get", "events", "--for", "ModelDeployment/det", "-o", "json").stdout
    )["items"]
    assert "RolledBack" in {e["reason"] for e in events}

    # 3. undo: the deployment asks for 1.1.0 again, the stable revision: no new revision
    undo = edgectl(hub, "rollout", "undo", "det")
    assert undo.returncode == 0, undo.stdout + undo.stderr
    run_until(
        hub,
        devices,
        lambda s: s.get("rollout", {}).get("phase") == "Complete",
        60,
        new="1.1.0",
        budget=1,
    )
    got = json.loads(hub.edgectl("get", "deployments", "det", "-o", "json").stdout)
    assert got["spec"]["model"]["version"] == "1.1.0"
    history = edgectl(hub, "rollout", "history", "det").stdout
    assert "copy of" not in history, history
    assert "rolled back (RevisionFailed)" in history, history  # 2.0.0 keeps its outcome


def fast_heartbeats(hub: HubProcess) -> None:
    toml = hub.data / "hub.toml"
    lines = toml.read_text().splitlines()
    for key, value in (("heartbeatInterval", "1s"), ("heartbeatGrace", "4s")):
        lines = [f'{key} = "{value}"' if line.startswith(f"{key} =") else line for line in lines]
    toml.write_text("\n".join(lines) + "\n")


def test_an_offline_device_and_a_hub_killed_mid_rollout(
    tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    """dev-2 is cut off while a bad revision is rolled out and rolled back, and while a good one
    rolls; the hub is killed with SIGKILL in the middle of that rollout and started again. The
    rollout resumes from the store (no device assigned twice, every step counted once), dev-2
    is skipped while away, and when it returns it converges to what is current: it never ran
    the revision that was rolled back meanwhile."""
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init()
    fast_heartbeats(hub)
    hub.start()
    host, port = hub.address.split(":")
    proxy = TcpProxy((host, int(port)))
    started: list[Edged] = []
    try:
        for i in range(3):
            data = tmp_path / f"dev-{i}"
            via = proxy.address if i == 2 else None
            out = enroll(hub, data, f"dev-{i}", {"site": "a"}, via=via)
            assert out.returncode == 0, out.stdout + out.stderr
            if via is not None:
                link = data / "hub" / "link.json"
                doc = json.loads(link.read_text())
                doc["hub"] = via
                link.write_text(json.dumps(doc))
            config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
            started.append(edged_factory(None, data=data, config=config).start())
        push(hub, tmp_path, "1.0.0")
        push(hub, tmp_path, "2.0.0", bad=True)
        apply(hub, tmp_path, "1.0.0")
        run_until(hub, started, lambda s: s["readyDevices"] == 3, 120, new="1.0.0", budget=3)

        proxy.cut()
        run_until(
            hub,
            started[:2],
            lambda s: "dev-2" in s.get("rollout", {}).get("skipped", {}),
            60,
            new="1.0.0",
            budget=2,
        )
        apply(hub, tmp_path, "2.0.0")  # dev-0 fails it: rolled back; dev-2 is away
        run_until(
            hub,
            started[:2],
            lambda s: s["rollout"]["phase"] == "RolledBack",
            90,
            new="2.0.0",
            budget=1,
        )

        # the fix: a newer version (dev-0 accepted 2.0.0's metadata and version, so anything
        # signed before it, or older, would be refused as a rollback)
        push(hub, tmp_path, "2.1.0")
        apply(hub, tmp_path, "2.1.0")
        run_until(
            hub,
            started[:2],
            lambda s: s["rollout"]["updatedDevices"] >= 1,
            60,
            new="2.1.0",
            budget=1,
        )
        hub.kill9()  # mid-rollout
        hub.start()
        # Until each device reports again (on its new stream), the hub counts from the last
        # reports it had stored, which may be older than the kill: only the devices' own view
        # of the budget is checked here.
        samples = run_until(
            hub,
            started[:2],
            lambda s: s["rollout"]["readyDevices"] == 2,
            120,
            new="2.1.0",
            budget=1,
            hub_counts=False,
        )
        assert samples[-1]["rollout"]["skipped"].keys() == {"dev-2"}
        assert samples[-1]["rollout"]["phase"] == "Progressing"  # dev-2 holds completion

        proxy.heal()
        run_until(
            hub,
            started,
            lambda s: s["readyDevices"] == 3 and s["availableDevices"] == 3,
            120,
            new="2.1.0",
            budget=1,
        )
        assert on_device(started[2])[0] == {"2.1.0"}
        assert "2.0.0" not in started[2].logs()  # never given the rolled-back revision
        revisions = hub.edgectl("rollout", "history", "det").stdout
        rows = [line.split()[0] for line in revisions.splitlines()[1:] if line[:1].isdigit()]
        assert rows == ["1", "2", "3"], revisions  # (the rollback's message follows the table)
        run_until(
            hub,
            started,
            lambda s: s["rollout"]["phase"] == "Complete",
            60,
            new="2.1.0",
            budget=1,
        )
        shown = json.loads(hub.edgectl("get", "deployments", "det", "-o", "json").stdout)
        history = shown["status"]["rollout"]
        assert history["revision"] == 3 and history["stableRevision"] == 3
        # one step per device assigned (maxSurge 0, maxUnavailable 1): none taken twice
        assert history["steps"] == history["updatedDevices"] == 3
    finally:
        proxy.close()
        for e in started:
            if e.proc is not None and e.proc.poll() is None:
                e.terminate()
        hub.stop()
