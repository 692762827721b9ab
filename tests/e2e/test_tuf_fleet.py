"""TUF end to end: ``hub init --tuf``, a real hub and an enrolled edged over mTLS gRPC.

The device's first TUF root comes over the hub link (``FetchTufMetadata``), checked against
the fleet root it pinned at enrollment; python-tuf's Updater then reads timestamp, snapshot,
targets and the publisher's delegated targets through the project's fetcher, and the model
is admitted only because the publisher's targets list it. A push without delegated targets
is refused by the hub; a publisher's targets that list other bytes are refused by the device.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from deploymenttesting import DET as DEPLOYMENT
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for

from edgefleet.demo import TINY_MLP, build_mlp

pytestmark = pytest.mark.scenario


@pytest.fixture
def hub_init_args() -> tuple[str, ...]:
    return ("--tuf",)


def serving(e: Edged, version: str) -> bool:
    try:
        w = e.workload("det")
    except (KeyError, StopIteration):
        return False
    return w.get("model", {}).get("version") == version and w.get("readyReplicas") == 1


def problems(e: Edged) -> list[str]:
    hub = e.status().get("hub") or {}
    return [p["reason"] for p in hub.get("problems", [])]


def test_a_device_admits_what_a_delegated_publisher_signed(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    data = tmp_path / "dev"
    out = enroll(hub, data, "dev", {})
    assert out.returncode == 0, out.stdout + out.stderr
    e = edged_factory(None, data=data, config=SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "x"))
    e.start()
    try:
        check_fleet(hub, tmp_path, e, data)
    finally:
        e.terminate()


def test_a_device_a_kill_left_without_its_tuf_root_takes_artifacts_again(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    """Seed 62's 1-hour soak run (docs/soak.md): edged killed -9 while python-tuf relinked
    ``trust/tuf/root.json`` came back with none, and refused every artifact for the rest of
    the run (``TrustStateLost``: its trust state says it accepted TUF root 1). The cache now
    keeps the link whole (tests/trust/test_tuf.py); a device an earlier release left so links
    it again to the newest root python-tuf verified (``root_history/``) and takes the next
    version."""
    data = tmp_path / "dev"
    out = enroll(hub, data, "dev", {})
    assert out.returncode == 0, out.stdout + out.stderr
    config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "x")
    e = edged_factory(None, data=data, config=config)
    e.start()
    doc = tmp_path / "det.yaml"
    for version, seed in (("1.0.0", 1), ("1.1.0", 2)):
        model = tmp_path / f"det-{version}.onnx"
        build_mlp(model, TINY_MLP, seed=seed)
        pushed = hub.edgectl("models", "push", str(model), "--name", "det", "--version", version)
        assert "pushed" in pushed.stdout, pushed.stdout + pushed.stderr
    try:
        doc.write_text(DEPLOYMENT.format(version="1.0.0"))
        hub.edgectl("apply", "-f", str(doc))
        wait_for(lambda: serving(e, "1.0.0"), 90, "the device to serve det 1.0.0")
        root = data / "trust" / "tuf" / "root.json"
        assert root.is_symlink() and (root.parent / "root_history" / "1.root.json").exists()
        e.kill9()
        root.unlink()  # what the kill left in that run
        e = edged_factory(None, data=data, config=config)
        e.start()
        wait_for(lambda: serving(e, "1.0.0"), 90, "det 1.0.0 served again after the restart")
        doc.write_text(DEPLOYMENT.format(version="1.1.0"))
        hub.edgectl("apply", "-f", str(doc))
        wait_for(lambda: serving(e, "1.1.0"), 90, "the device to take det 1.1.0")
        assert "TrustStateLost" not in problems(e)
        assert not e.refused("TrustStateLost"), e.refusals()
        assert root.is_symlink() and root.exists()
        restored = e.log_records("tuf root restored")
        assert restored and restored[0].get("version") == 1, restored
    finally:
        e.terminate()


def check_fleet(hub: HubProcess, tmp_path: Path, e: Edged, data: Path) -> None:
    from edgectl.client import load_admin_config
    from edgefleet.trust import signing
    from edgefleet.v1 import admin_pb2, admin_pb2_grpc

    model = tmp_path / "det.onnx"
    build_mlp(model, TINY_MLP, seed=1)
    pushed = hub.edgectl("models", "push", str(model), "--name", "det", "--version", "1.0.0")
    assert "pushed" in pushed.stdout, pushed.stdout + pushed.stderr
    assert (hub.data / "tuf" / "delegated" / "lab.json").exists()
    doc = tmp_path / "det.yaml"
    doc.write_text(DEPLOYMENT.format(version="1.0.0"))
    hub.edgectl("apply", "-f", str(doc))
    wait_for(lambda: serving(e, "1.0.0"), 90, "the device to serve det 1.0.0")
    tuf = data / "trust" / "tuf"
    assert {"root.json", "timestamp.json", "snapshot.json", "targets.json", "lab.json"} <= {
        p.name for p in tuf.iterdir()
    }
    assert e.status()["hub"]["tufRequired"] is True
    state = json.loads((data / "trust" / "state.json").read_text())
    assert state["tufRootVersion"] == 1  # deleting trust/tuf/ would be TrustStateLost

    # A push without the publisher's delegated targets (an older edgectl, or a hub operator
    # with only the artifact key): refused by the hub, nothing stored.
    model2 = tmp_path / "det2.onnx"
    build_mlp(model2, TINY_MLP, seed=2)
    _, env = signing.sign_artifact(
        model2, name="det", version="2.0.0", keys=[hub.data / "publisher.key"]
    )
    cfg = load_admin_config(hub.admin_config, None)
    channel = grpc.secure_channel(
        hub.address,
        grpc.ssl_channel_credentials(
            root_certificates=cfg.ca_certificate.read_bytes(),
            private_key=cfg.key.read_bytes(),
            certificate_chain=cfg.certificate.read_bytes(),
        ),
    )
    with channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]
        header = admin_pb2.PushArtifactRequest(
            header=admin_pb2.ArtifactHeader(signed_metadata=env.to_bytes())
        )
        chunk = admin_pb2.PushArtifactRequest(chunk=model2.read_bytes())
        with pytest.raises(grpc.RpcError) as info:
            stub.PushArtifact(iter([header, chunk]), timeout=60)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "TargetsMissing" in (info.value.details() or "")

        # The publisher pushes 2.0.0, then 3.0.0 with targets that no longer list 2.0.0
        # (revoked). The device asked for 2.0.0 refuses it: its metadata is still valid and
        # signed, but the signed current set does not list it. 1.0.0 keeps serving.
        def push(version: str, path: Path, keep: bool) -> None:
            from tuf.api.metadata import Targets

            from edgefleet.trust import tufmeta
            from edgefleet.trust.documents import parse_artifact
            from edgefleet.trust.envelopes import ARTIFACT_TYPE, decode_payload
            from edgefleet.v1 import common_pb2

            _, env = signing.sign_artifact(
                path, name="det", version=version, keys=[hub.data / "publisher.key"]
            )
            meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="m"))
            held = stub.FetchTufMetadata(common_pb2.TufMetadataRequest(name="lab.json")).data
            targets, _ = tufmeta.parse(held, Targets, what="lab")
            targets.version += 1
            if not keep:
                targets.targets = {
                    p: t for p, t in targets.targets.items() if not p.startswith("det/2.0.0/")
                }
            targets.targets.update(tufmeta.artifact_targets(meta))
            signer = tufmeta.tuf_signer(hub.data / "publisher.key")
            header = admin_pb2.ArtifactHeader(
                signed_metadata=env.to_bytes(),
                delegated_role="lab",
                delegated_targets=tufmeta.sign(targets, [signer]),
            )
            stub.PushArtifact(
                iter(
                    [
                        admin_pb2.PushArtifactRequest(header=header),
                        admin_pb2.PushArtifactRequest(chunk=path.read_bytes()),
                    ]
                ),
                timeout=60,
            )

        push("2.0.0", model2, keep=True)
        model3 = tmp_path / "det3.onnx"
        build_mlp(model3, TINY_MLP, seed=3)
        push("3.0.0", model3, keep=False)
    doc.write_text(DEPLOYMENT.format(version="2.0.0"))
    hub.edgectl("apply", "-f", str(doc))
    wait_for(
        lambda: "NotInTargets" in problems(e) or e.refused("NotInTargets"),
        60,
        "the device to refuse det 2.0.0",
    )
    assert serving(e, "1.0.0")
    doc.write_text(DEPLOYMENT.format(version="3.0.0"))
    hub.edgectl("apply", "-f", str(doc))
    wait_for(lambda: serving(e, "3.0.0"), 90, "the device to serve det 3.0.0")
