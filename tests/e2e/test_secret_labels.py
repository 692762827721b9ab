"""A device's own labels never bring it a Secret, end to end (issue 29 item 8): a real ``hub
serve``, two real enrolled ``edged run`` processes, real gRPC with real certificates, real
workers, a real tmpfs (/dev/shm).

``s1-x`` is enrolled with a token labelled ``pool=lab`` and its own ``edged.toml`` labels it
``site=retail`` (and ``pool=retail``), which its Hello reports. ``s1-z``'s token says
``site=retail``. A ``site=retail`` deployment mounting a Secret runs on ``s1-z`` with its
secret; ``s1-x`` is never sent it, and the hub says why: in the device's ``notRunning``, in
the deployment's ``SecretsDelivered`` condition and when it is applied."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for

from edged.runtime import landlock
from edgefleet.demo import TINY_MLP, build_mlp

SHM = Path("/dev/shm")
pytestmark = [
    pytest.mark.scenario,
    pytest.mark.skipif(landlock.abi_version() < 1, reason="no Landlock on this kernel"),
    pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm"),
]

VALUE = "retail-till-" + uuid.uuid4().hex
MANIFESTS = f"""\
apiVersion: edgefleet.io/v1
kind: Secret
metadata: {{name: till}}
spec:
  stringData: {{token: "{VALUE}"}}
---
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: pos}}
spec:
  model: {{name: mpos, version: "1.0.0"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  placement: {{nodeSelector: {{site: retail}}}}
  secrets: [{{name: till, mountPath: /run/secrets/till}}]
"""
OWN_LABELS = '\n[device.labels]\nsite = "retail"\npool = "retail"\n'


@pytest.fixture
def secrets_root() -> Iterator[Path]:
    root = SHM / f"edgefleet-e2e-{uuid.uuid4().hex[:8]}"
    yield root
    for dirpath, dirnames, _ in os.walk(root):
        os.chmod(dirpath, 0o700)
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o700)
    shutil.rmtree(root, ignore_errors=True)


def test_a_label_the_device_gives_itself_never_brings_it_a_secret(
    tmp_path: Path, edged_factory: Callable[..., Edged], secrets_root: Path
) -> None:
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init().start()
    try:
        model = tmp_path / "mlp.onnx"
        build_mlp(model, TINY_MLP, seed=1)
        hub.edgectl("models", "push", str(model), "--name", "mpos", "--version", "1.0.0")
        devices: dict[str, Edged] = {}
        for name, token_labels, own in (
            ("s1-x", {"pool": "lab"}, OWN_LABELS),
            ("s1-z", {"site": "retail"}, ""),
        ):
            data = tmp_path / name
            out = enroll(hub, data, name, {}, token_labels=token_labels)
            assert out.returncode == 0, out.stdout + out.stderr
            config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
            config += f'\n[secrets]\ndir = "{secrets_root / name}"\n' + own
            devices[name] = edged_factory(None, data=data, config=config).start()

        def labels(name: str) -> dict[str, str]:
            doc = orjson.loads(hub.edgectl("get", "device", name, "-o", "json").stdout)
            shown: dict[str, str] = doc["metadata"]["labels"]
            return shown

        wait_for(lambda: labels("s1-x").get("site") == "retail", 60, "s1-x to report its labels")
        assert labels("s1-x")["pool"] == "lab"  # a Hello never changes a label its token set
        path = tmp_path / "pos.yaml"
        path.write_text(MANIFESTS)
        applied = hub.edgectl("apply", "-f", str(path))

        # the honest path: s1-z's token says site=retail, its worker gets the secret
        secret_file = secrets_root / "s1-z" / "pos" / "till" / "token"
        wait_for(
            lambda: secret_file.exists() and secret_file.read_text() == VALUE,
            120,
            "s1-z to be given the secret",
        )

        def not_running(name: str) -> dict[str, str]:
            doc = orjson.loads(hub.edgectl("get", "device", name, "-o", "json").stdout)
            shown: dict[str, str] = doc["status"]["notRunning"]
            return shown

        def pos_on_x() -> bool:
            return any(w["name"] == "pos" for w in devices["s1-x"].status()["workloads"])

        # the hub settles on s1-x: the deployment left out, or sent to it
        wait_for(lambda: "pos" in not_running("s1-x") or pos_on_x(), 60, "s1-x to be settled")
        mounted = list((secrets_root / "s1-x").rglob("token"))
        assert not mounted and not pos_on_x(), "s1-x was given the secret through its own label"
        reason = not_running("s1-x")["pos"]
        assert "only through labels it chose" in reason, reason
        assert "site='retail' reported by the device itself" in reason, reason

        doc = orjson.loads(hub.edgectl("get", "deployment", "pos", "-o", "json").stdout)
        conditions = {c["type"]: c for c in doc["status"]["conditions"]}
        assert conditions["SecretsDelivered"]["status"] == "False", conditions
        assert conditions["SecretsDelivered"]["message"].startswith("not sent to s1-x: ")
        assert "not sent to s1-x: secret till" in applied.stdout + applied.stderr
        for e in devices.values():
            assert e.terminate() == 0
    finally:
        hub.stop()
