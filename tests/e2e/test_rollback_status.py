"""What operators read after a canary is rolled back, end to end: a real hub, two real edged
devices, real ONNX Runtime workers (issue 29, item 5).

A canary of a version that cannot load fails on its first device and is rolled back; every
device serves the stable version. Then ``edgectl describe deployment`` says RolledBack (not
``RollingOut 0 of 2``) and names the failing device and why, ``edgectl get deployments``
shows the version that serves with the rejected one beside it, and ``-o json`` carries both
versions, the failed devices and RFC 3339 times.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deploymenttesting import det_canary
from fleet import HubProcess
from harness import Edged
from rollouttesting import apply, on_device, push, run_until

from edgefleet.timestamps import epoch_of

DEPLOYMENT = det_canary('["50%", {{pause: {{}}}}, "100%"]')
N = 2


@pytest.fixture
def fleet_size() -> int:
    return N


def test_after_a_canary_is_rolled_back_status_says_so_and_shows_what_serves(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    push(hub, tmp_path, "1.0.0")
    push(hub, tmp_path, "2.0.0", bad=True)
    apply(hub, tmp_path, "1.0.0", DEPLOYMENT)
    run_until(hub, devices, lambda s: s["readyDevices"] == N, 120, new="1.0.0", budget=N)
    apply(hub, tmp_path, "2.0.0", DEPLOYMENT)  # the canary's first device fails to load it
    run_until(
        hub,
        devices,
        lambda s: s.get("rollout", {}).get("phase") == "RolledBack" and s["availableDevices"] == N,
        120,
        new="2.0.0",
        budget=1,
    )
    assert all(on_device(e)[0] == {"1.0.0"} for e in devices)

    doc: dict[str, Any] = json.loads(hub.edgectl("get", "deployments", "det", "-o", "json").stdout)
    status = doc["status"]
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "RolledBack"), progressing
    assert "revision 2 (2.0.0)" in progressing["message"], progressing
    assert "rolled back to revision 1 (1.0.0)" in progressing["message"], progressing
    rollout = status["rollout"]
    assert (rollout["version"], rollout["stableVersion"]) == ("2.0.0", "1.0.0"), rollout
    assert list(rollout["failedDevices"]) == ["dev-0"], rollout
    assert "2.0.0 Failed" in rollout["failedDevices"]["dev-0"], rollout
    for when in ("startedAt", "changedAt"):  # RFC 3339, as the docs promise
        assert isinstance(rollout[when], str) and rollout[when].endswith("Z"), rollout
        assert epoch_of(rollout[when]) is not None

    table = hub.edgectl("get", "deployments").stdout
    row = next(line for line in table.splitlines() if line.startswith("det "))
    assert "det:1.0.0 (2.0.0 rolled back)" in row, table

    page = hub.edgectl("describe", "deployment", "det").stdout
    assert "RollingOut" not in page, page
    assert "RolledBack" in page, page
    assert "Failing devices:  <none>" not in page, page
    assert "dev-0: 2.0.0 Failed" in page and "(revision 2, rolled back)" in page, page
