"""A model configuration change rolled out like a new version (kind: ModelConfig, issue 36):
a real hub and two real edged (site=a), real workers.

A change of the ModelConfig makes a new revision of the deployment: its canary step gives one
device the new config while the other keeps the old one (the hub counts each as running the
config it is sent), ``rollout promote`` takes it everywhere, ``rollout undo`` brings the older
config back (the ModelConfig object too), a canary whose devices cannot apply the config
(here: its directory made immutable) is rolled back on its own, every device keeping the
config it ran, and deleting the ModelConfig rolls out a revision without one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fleet import HubProcess
from harness import Edged
from modelconfigtesting import apply, deployment, rollout
from polltesting import wait_for
from rollouttesting import push, status

pytestmark = pytest.mark.scenario

CONFIG = """\
apiVersion: edgefleet.io/v1
kind: ModelConfig
metadata: {{name: det}}
spec:
  model: det
  data: {{threshold: {threshold}}}
"""


def thresholds(devices: list[Edged]) -> list[float | None]:
    out: list[float | None] = []
    for e in devices:
        path = e.data / "configs" / "det" / "config.json"
        try:
            out.append(json.loads(path.read_text())["data"]["threshold"])
        except (OSError, ValueError):
            out.append(None)
    return out


def immutable(path: Path, on: bool) -> None:
    subprocess.run(["chattr", "+i" if on else "-i", str(path)], check=True)


def test_a_config_change_is_a_canaried_revision_promoted_undone_and_rolled_back(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    push(hub, tmp_path, "1.0.0")
    apply(hub, tmp_path, deployment() + "---\n" + CONFIG.format(threshold=0.5), "all")
    wait_for(lambda: thresholds(devices) == [0.5, 0.5], 120, "0.5 on both devices")
    wait_for(lambda: rollout(hub).get("phase") == "Complete", 60, "revision 1 complete")

    # 1. a change: a new revision, its canary step on one device only
    said = apply(hub, tmp_path, CONFIG.format(threshold=0.6), "config")
    assert "new revision" in said, said
    wait_for(lambda: rollout(hub).get("reason") == "CanaryPause", 120, "the pause after 50%")
    wait_for(lambda: sorted(map(str, thresholds(devices))) == ["0.5", "0.6"], 60, "1 canary",
             detail=lambda: f"{thresholds(devices)} {rollout(hub)}")  # fmt: skip
    assert rollout(hub).get("revision") == 2
    shown = hub.edgectl("rollout", "status", "det", check=False).stdout
    assert "revision 2" in shown, shown
    # each device runs the config its revision carries: both count as running the desired
    wait_for(lambda: status(hub).get("config", {}).get("runningDesired") == 2, 60, "2 of 2")

    # 2. promoted: everywhere
    assert hub.edgectl("rollout", "promote", "det").returncode == 0
    wait_for(lambda: thresholds(devices) == [0.6, 0.6], 120, "0.6 on both devices")
    wait_for(lambda: rollout(hub).get("phase") == "Complete", 60, "revision 2 complete")

    # 3. undone: the older config comes back, with its ModelConfig
    undone = hub.edgectl("rollout", "undo", "det")
    assert "ModelConfig det set back to revision 1's" in undone.stdout, undone.stdout
    got = json.loads(hub.edgectl("get", "modelconfig", "det", "-o", "json").stdout)
    assert got["spec"]["data"] == {"threshold": 0.5}
    wait_for(lambda: rollout(hub).get("reason") == "CanaryPause", 120, "the undo's canary")
    assert hub.edgectl("rollout", "promote", "det").returncode == 0
    wait_for(lambda: thresholds(devices) == [0.5, 0.5], 120, "0.5 on both again")
    wait_for(lambda: rollout(hub).get("phase") == "Complete", 60, "the undo complete")

    # 4. a canary its devices cannot apply: rolled back on its own
    dirs = [e.data / "configs" / "det" for e in devices]
    for d in dirs:
        immutable(d, True)
    try:
        apply(hub, tmp_path, CONFIG.format(threshold=0.9), "config")
        wait_for(lambda: rollout(hub).get("phase") == "RolledBack", 120, "the rollback",
                 detail=lambda: f"{rollout(hub)}")  # fmt: skip
        assert "ModelConfigRefused" in json.dumps(rollout(hub)), rollout(hub)
    finally:
        for d in dirs:
            immutable(d, False)
    assert thresholds(devices) == [0.5, 0.5]
    wait_for(lambda: status(hub).get("config", {}).get("runningDesired") == 2, 60,
             "both on the stable config, no error")  # fmt: skip

    # 5. deleted: a revision without a config, rolled out the same way; its files go
    assert hub.edgectl("delete", "modelconfig", "det").returncode == 0
    wait_for(lambda: rollout(hub).get("reason") == "CanaryPause", 120, "the deletion's canary")
    assert sorted(map(str, thresholds(devices))) == ["0.5", "None"]
    assert hub.edgectl("rollout", "promote", "det").returncode == 0
    wait_for(lambda: thresholds(devices) == [None, None], 120, "no config on either device")
    wait_for(lambda: "config" not in status(hub), 60, "no config status")
