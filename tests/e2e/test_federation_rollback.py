"""A region rolls back what the root rolled out, end to end (docs/soak.md, defect 5): a root hub
and one regional hub (eu) enrolled with it (``hub init --parent``), a real edged device
enrolled at eu with real ONNX Runtime workers, all real processes with real certificates on
loopback.

A deployment placed only in eu (``placement.regions: [eu]``): the root has no device of it,
so its own rollout of a new revision completes at once. Revision 2 cannot load: eu's device
fails it and eu rolls it back to revision 1, which its device serves again. The root must
never say Complete of revision 2: while eu rolls out it says Progressing, then RolledBack
naming eu (its status, the Progressing condition, ``edgectl rollout status``, which exits 1).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from federationtesting import SLACK, serving
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for
from rollouttesting import push

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: det}}
spec:
  model: {{name: det, version: "{version}"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  placement: {{regions: [eu], nodeSelector: {{site: a}}}}
  rollout: {{maxSurge: 0, maxUnavailable: 1}}
  probes:
    readiness: {{periodSeconds: 1, timeoutSeconds: 1}}
"""


def root_status(root: HubProcess) -> dict[str, Any]:
    out = root.edgectl("get", "deployments", "det", "-o", "json", check=False)
    if out.returncode != 0:
        return {}
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc["status"]  # type: ignore[no-any-return]


def rollout_of(status: dict[str, Any]) -> dict[str, Any]:
    return dict(status.get("rollout") or {})


def test_the_root_never_says_complete_of_a_revision_its_region_rolled_back(
    tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    root = HubProcess(tmp_path / "root", tmp_path / "root.log").init("--region", "root").start()
    eu: HubProcess | None = None
    device: Edged | None = None
    try:
        token, pin = root.token("--for-region", "eu")
        eu = HubProcess(tmp_path / "eu", tmp_path / "eu.log")
        eu.init("--region", "eu", "--parent", root.address, "--token", token,
                "--parent-ca-hash", pin)  # fmt: skip
        eu.start()
        out = enroll(eu, tmp_path / "dev-eu-0", "dev-eu-0", {"site": "a"})
        assert out.returncode == 0, out.stdout + out.stderr
        config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
        device = edged_factory(None, data=tmp_path / "dev-eu-0", config=config).start()

        push(root, tmp_path, "1.0.0")
        push(root, tmp_path, "2.0.0", bad=True)  # cannot load: the device fails it
        doc = tmp_path / "det.yaml"
        doc.write_text(DEPLOYMENT.format(version="1.0.0"))
        root.edgectl("apply", "-f", str(doc))
        dev = device

        def explain() -> str:
            return (
                f"\nroot: {json.dumps(root_status(root), sort_keys=True)}"
                f"\neu: {json.dumps(root_status(eu), sort_keys=True) if eu else '-'}"
            )

        wait_for(lambda: serving(dev, version="1.0.0"), SLACK, "dev-eu-0 serving 1.0.0")
        wait_for(
            lambda: (
                rollout_of(root_status(root)).get("phase") == "Complete"
                and (root_status(root).get("regions", {}).get("eu") or {}).get("readyDevices") == 1
            ),
            SLACK,
            "the root to say revision 1 Complete, eu ready",
            detail=explain,
        )

        doc.write_text(DEPLOYMENT.format(version="2.0.0"))
        root.edgectl("apply", "-f", str(doc))
        seen: list[tuple[Any, ...]] = []  # every rollout the root showed of revision 2

        def rolled_back() -> dict[str, Any] | None:
            status = root_status(root)
            rollout = rollout_of(status)
            if rollout.get("version") == "2.0.0":
                seen.append((rollout.get("phase"), rollout.get("reason"), time.monotonic()))
                if rollout.get("phase") == "RolledBack":
                    return status
            return None

        status = wait_for(rolled_back, SLACK * 2, "the root to say eu rolled back", detail=explain)
        assert all(phase != "Complete" for phase, _, _ in seen), seen
        rollout = rollout_of(status)
        assert rollout["reason"] == "RegionRolledBack", rollout
        assert "rolled back in region(s) eu" in rollout["message"], rollout
        assert "revision 1 is served there again" in rollout["message"], rollout
        assert (rollout["stableRevision"], rollout["stableVersion"]) == (1, "1.0.0"), rollout
        progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
        assert (progressing["status"], progressing["reason"]) == ("False", "RolledBack")
        assert "eu" in progressing["message"], progressing
        wait_for(lambda: serving(dev, version="1.0.0"), SLACK, "dev-eu-0 back on 1.0.0")

        shown = root.edgectl("rollout", "status", "det", check=False)
        assert shown.returncode == 1, shown.stdout + shown.stderr
        assert "RolledBack (RegionRolledBack)" in shown.stdout, shown.stdout
        assert "region(s) eu" in shown.stdout, shown.stdout
        # it stays so: nothing made it Complete since
        time.sleep(2)
        assert rollout_of(root_status(root))["phase"] == "RolledBack", explain()
    finally:
        if device is not None and device.proc is not None and device.proc.poll() is None:
            device.terminate()
        if eu is not None:
            eu.stop()
        root.stop()
