"""Trust with a real edged, fully signed: a publisher key, a trust root in ``trust.rootFile``,
signed metadata next to each model. Refusals show in status with their reason while the
previous good version keeps serving; kill -9 during an ingest and during a version switch
never leaves a partial or unverified file in use."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from harness import Edged, wait_for, write_manifest

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.trust.signing import create_root, generate_key_pair, sign_artifact

X = np.linspace(-1, 1, TINY_MLP[0], dtype=np.float32).reshape(1, -1)


def expected(model: Path) -> list[float]:
    import onnxruntime as ort

    s = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    out: list[float] = s.run(None, {"input": X})[0].ravel().tolist()
    return out


class Publisher:
    def __init__(self, tmp: Path, manifests: Path) -> None:
        self.manifests = manifests
        generate_key_pair(tmp / "publisher")
        self.key = tmp / "publisher.key"
        self.root = tmp / "trust-root.json"
        create_root(root_keys=[self.key], artifact_keys=[tmp / "publisher.pub"], out=self.root)
        self.config = f'[trust]\nrootFile = "{self.root}"\n'
        self.outputs: dict[str, list[float]] = {}

    def model(self, version: str, seed: int, *, sign: bool = True) -> Path:
        path = self.manifests / f"mlp-{version}.onnx"
        build_mlp(path, TINY_MLP, seed=seed)
        self.outputs[version] = expected(path)
        if sign:
            sign_artifact(path, name="mlp", version=version, keys=[self.key])
        return path


def serving(e: Edged) -> str | None:
    """The version whose answers edged gives now (by comparing logits)."""
    status, doc = e.infer("mlp", X)
    if status != 200:
        return None
    got = doc["outputs"][0]["data"]
    for version, want in e.pub.outputs.items():  # type: ignore[attr-defined]
        if np.allclose(got, want, rtol=1e-5, atol=1e-5):
            return version
    raise AssertionError("edged answers with logits of no known model")


def problem(e: Edged, reason: str) -> dict[str, Any] | None:
    for p in e.status()["source"]["problems"]:
        if p["reason"] == reason:
            return dict(p)
    return None


def state_version(data: Path) -> int:
    state = orjson.loads((data / "trust" / "state.json").read_bytes())
    return int(state["artifacts"]["mlp"]["metadataVersion"])


def store_is_clean(data: Path) -> None:
    """Every blob in the store is complete (its name is its digest); staging is empty."""
    for blob in (data / "artifacts" / "sha256").iterdir():
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    assert not list((data / "artifacts" / "staging").iterdir())


def test_signed_serving_refusals_and_kill9(tmp_path: Path, edged_factory) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    pub = Publisher(tmp_path, manifests)
    pub.model("1.0.0", seed=1)
    write_manifest(manifests, version="1.0.0", path="mlp-1.0.0.onnx")
    e: Edged = edged_factory(manifests, config=pub.config).start()
    e.pub = pub  # type: ignore[attr-defined]
    e.wait_ready()
    assert serving(e) == "1.0.0"
    trust = e.status()["device"]["trust"]
    assert trust["rootVersion"] == 1 and trust["allowUnsigned"] is False
    assert (e.data / "trust" / "root.json").exists()
    assert e.status()["source"]["problems"] == []  # *.metadata.json are not manifests

    # Tampered bytes: refused with the exact reason; 1.0.0 keeps serving.
    v2 = pub.model("2.0.0", seed=2)
    v2.write_bytes(v2.read_bytes()[:-4] + b"\x00\x00\x00\x00")
    write_manifest(manifests, version="2.0.0", path="mlp-2.0.0.onnx")
    p = wait_for(lambda: problem(e, "DigestMismatch"), 20, "DigestMismatch")
    assert p["workload"] == "mlp" and "mlp 2.0.0" in p["message"]
    assert serving(e) == "1.0.0"
    _, metrics, _ = e.request("GET", "/metrics", sock=e.status_sock)
    assert b'edged_artifact_verifications_total{result="refused",reason="DigestMismatch"}' in (
        metrics
    )

    # Unsigned: refused (allowUnsigned is off).
    pub.model("2.0.1", seed=3, sign=False)
    write_manifest(manifests, version="2.0.1", path="mlp-2.0.1.onnx")
    wait_for(lambda: problem(e, "UnsignedArtifact"), 20, "UnsignedArtifact")
    assert serving(e) == "1.0.0"

    # kill -9 in the middle of an ingest: the model arrives through a pipe that stalls.
    real = manifests / "real-2.1.0.onnx"
    build_mlp(real, TINY_MLP, seed=4)
    pub.outputs["2.1.0"] = expected(real)
    fifo = manifests / "mlp-2.1.0.onnx"
    fifo_bytes = real.read_bytes()
    real.rename(fifo)  # sign under the name the manifest uses
    sign_artifact(fifo, name="mlp", version="2.1.0", keys=[pub.key])
    fifo.unlink()
    import os

    os.mkfifo(fifo)
    release = threading.Event()

    def feed() -> None:
        try:
            with open(fifo, "wb") as f:
                f.write(fifo_bytes[: len(fifo_bytes) // 2])
                f.flush()
                release.wait(60)
        except BrokenPipeError:
            pass

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    write_manifest(manifests, version="2.1.0", path="mlp-2.1.0.onnx")
    staging = e.data / "artifacts" / "staging"
    # The store reads 1 MiB at a time, so the staged file exists but the read is still blocked.
    wait_for(lambda: list(staging.iterdir()), 20, "an ingest in progress")
    e.kill9()
    release.set()
    t.join(10)
    fifo.unlink()
    fifo.write_bytes(fifo_bytes)

    e2: Edged = edged_factory(manifests, data=e.data, config=pub.config).start()
    e2.pub = pub  # type: ignore[attr-defined]
    wait_for(lambda: serving(e2) is not None, 60, "edged to serve again")
    assert not list(staging.iterdir()), "the partial ingest was removed at start"
    # Then the complete, verified 2.1.0 replaces 1.0.0.
    wait_for(lambda: serving(e2) == "2.1.0", 60, "2.1.0 to serve")
    assert e2.workload("mlp")["model"]["version"] == "2.1.0"

    # The old 1.0.0 metadata replayed: its metadata version is lower (MetadataRollback).
    write_manifest(manifests, version="1.0.0", path="mlp-1.0.0.onnx")
    wait_for(lambda: problem(e2, "MetadataRollback"), 20, "MetadataRollback")
    # 1.0.0 freshly signed: a validly signed but older model version (ModelVersionRollback).
    sign_artifact(
        manifests / "mlp-1.0.0.onnx",
        name="mlp",
        version="1.0.0",
        keys=[pub.key],
        metadata_version=int(state_version(e.data)) + 1,
    )
    p = wait_for(lambda: problem(e2, "ModelVersionRollback"), 20, "ModelVersionRollback")
    assert "1.0.0" in p["message"]
    assert serving(e2) == "2.1.0"
    state = orjson.loads((e.data / "trust" / "state.json").read_bytes())
    assert state["artifacts"]["mlp"]["modelVersion"] == "2.1.0"

    # kill -9 during the switch to 3.0.0: whatever serves after restart is complete and verified.
    pub.model("3.0.0", seed=5)
    write_manifest(manifests, version="3.0.0", path="mlp-3.0.0.onnx")
    wait_for(lambda: e2.workload("mlp")["model"]["version"] == "3.0.0", 20, "3.0.0 to be accepted")
    e2.kill9()
    store_is_clean(e.data)
    e3: Edged = edged_factory(manifests, data=e.data, config=pub.config).start()
    e3.pub = pub  # type: ignore[attr-defined]
    wait_for(lambda: serving(e3) == "3.0.0", 60, "3.0.0 to serve after restart")
    store_is_clean(e.data)
    assert e3.terminate() == 0


def root_version(e: Edged) -> int | None:
    try:
        trust = e.status()["device"]["trust"]
    except OSError:
        return None
    return trust["rootVersion"]  # type: ignore[no-any-return]


def replace_hub_root(hub_dir: Path, data: bytes) -> None:
    """What an operator does: write beside it, then rename (atomic)."""
    tmp = hub_dir / "trust-root.json.new"
    tmp.write_bytes(data)
    tmp.rename(hub_dir / "trust-root.json")


def test_a_root_rotation_reaches_online_and_offline_devices(tmp_path: Path, edged_factory) -> None:
    """A real hub and two enrolled edged (root pinned at enrollment). The operator rotates the
    root on the hub (new root key, signed by the old and the new): the connected device has it
    at its next sync, the one that was offline when it comes back, and a model signed after
    the rotation serves. Then a root the hub made with a key of its own: the hub refuses to
    carry it, and the devices keep version 2."""
    from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll

    from edgefleet.trust.signing import rotate_root, sign_root

    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init().start()
    try:
        devices = {}
        for name in ("dev-a", "dev-b"):
            out = enroll(hub, tmp_path / name, name, {"site": "lab"})
            assert out.returncode == 0, out.stdout + out.stderr
            config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-image-root.json")
            devices[name] = edged_factory(None, data=tmp_path / name, config=config).start()
        a, b = devices["dev-a"], devices["dev-b"]
        for e in (a, b):
            wait_for(lambda e=e: root_version(e) == 1, 60, "the enrolled root")
        assert b.terminate() == 0  # dev-b is offline during the rotation

        generate_key_pair(tmp_path / "root2")
        v2 = rotate_root(
            hub.data / "trust-root.json",
            root_keys=[tmp_path / "root2.key"],
            artifact_keys=[hub.data / "publisher.pub"],
        )
        replace_hub_root(hub.data, sign_root(v2, [hub.data / "root.key"]).to_bytes())
        wait_for(lambda: root_version(a) == 2, 60, "dev-a to follow the rotation")
        assert (hub.data / "trust-roots" / "1.json").exists()  # the hub keeps the chain
        b.start()
        wait_for(lambda: root_version(b) == 2, 60, "dev-b to follow it when back")
        assert a.status()["hub"]["problems"] == []

        model = tmp_path / "mlp.onnx"
        build_mlp(model, TINY_MLP, seed=1)
        out = hub.edgectl("models", "push", str(model), "--name", "mlp", "--version", "1.0.0")
        assert "pushed" in out.stdout, out.stdout
        deployment = tmp_path / "mlp.yaml"
        deployment.write_text(
            "apiVersion: edgefleet.io/v1\nkind: ModelDeployment\nmetadata: {name: mlp}\n"
            'spec:\n  model: {name: mlp, version: "1.0.0"}\n'
            "  runtime: {executionProviders: [CPUExecutionProvider]}\n"
            "  replicas: {perDevice: 1}\n"
        )
        hub.edgectl("apply", "-f", str(deployment))
        wait_for(lambda: a.infer("mlp", X)[0] == 200, 60, "dev-a to serve the model")

        # A root made with a key of the hub's own (a version 1 that is not the fleet's).
        generate_key_pair(tmp_path / "hubkey")
        forged = create_root(
            root_keys=[tmp_path / "hubkey.key"], artifact_keys=[tmp_path / "hubkey.pub"]
        )
        replace_hub_root(hub.data, forged.to_bytes())
        wait_for(
            lambda: "TrustRootRefused" in hub.edgectl("get", "events").stdout,
            30,
            "the hub to refuse the root it cannot verify",
        )
        assert root_version(a) == 2 and root_version(b) == 2
        assert a.terminate() == 0 and b.terminate() == 0
    finally:
        hub.stop()
