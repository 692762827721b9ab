"""Rollback allowances as custom fields of the publisher's TUF targets, end to end: a real hub
with a TUF repository (``hub init --tuf``) and an enrolled edged over mTLS gRPC.

After det 1.0.0 -> 2.0.0 -> 3.0.0, going back to 1.0.0 needs an allowance (1.0.0 is not the
version the device ran just before). The publisher's targets carry one on 1.0.0's model
target: one naming other bytes (2.0.0's digest) is refused on the device
(``RollbackAllowanceMismatch``; 3.0.0 keeps serving); ``edgectl models push ...
--allow-rollback 7d`` (1.0.0 signed anew, its target allowing its own digest) lets it in.
"""

from __future__ import annotations

import hashlib
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


def rollout_phase(hub: HubProcess) -> str:
    doc = json.loads(hub.edgectl("get", "deployments", "det", "-o", "json").stdout)
    return str(doc.get("status", {}).get("rollout", {}).get("phase", ""))


def problems(e: Edged) -> list[str]:
    hub = e.status().get("hub") or {}
    return [p["reason"] for p in hub.get("problems", [])]


def push_with_allowance_for(hub: HubProcess, model: Path, sha256: str) -> None:
    """Push det 1.0.0 (signed anew) with the publisher's targets allowing a rollback to
    ``sha256``, as a publisher's own tooling could sign it."""
    import time

    from tuf.api.metadata import Targets

    from edgectl.client import load_admin_config
    from edgefleet.trust import signing, tufmeta
    from edgefleet.trust.documents import parse_artifact
    from edgefleet.trust.envelopes import ARTIFACT_TYPE, decode_payload
    from edgefleet.v1 import admin_pb2, admin_pb2_grpc, common_pb2

    _, env = signing.sign_artifact(
        model, name="det", version="1.0.0", keys=[hub.data / "publisher.key"]
    )
    meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="m"))
    cfg = load_admin_config(hub.admin_config, None)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=cfg.ca_certificate.read_bytes(),
        private_key=cfg.key.read_bytes(),
        certificate_chain=cfg.certificate.read_bytes(),
    )
    with grpc.secure_channel(hub.address, credentials) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]
        held = stub.FetchTufMetadata(common_pb2.TufMetadataRequest(name="lab.json")).data
        targets, _ = tufmeta.parse(held, Targets, what="lab")
        targets.version += 1
        targets.targets.update(tufmeta.artifact_targets(meta, rollback_expires=time.time() + 86400))
        custom = targets.targets[f"det/1.0.0/{meta.model_file()[0]}"].unrecognized_fields["custom"]
        custom["edgefleet"]["rollbackAllowance"]["sha256"] = sha256
        header = admin_pb2.ArtifactHeader(
            signed_metadata=env.to_bytes(),
            delegated_role="lab",
            delegated_targets=tufmeta.sign(
                targets, [tufmeta.tuf_signer(hub.data / "publisher.key")]
            ),
        )
        stub.PushArtifact(
            iter(
                [
                    admin_pb2.PushArtifactRequest(header=header),
                    admin_pb2.PushArtifactRequest(chunk=model.read_bytes()),
                ]
            ),
            timeout=60,
        )


def test_an_allowance_in_the_publishers_targets_is_bound_to_the_digest(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    data = tmp_path / "dev"
    out = enroll(hub, data, "dev", {})
    assert out.returncode == 0, out.stdout + out.stderr
    models = {}
    for seed, version in enumerate(("1.0.0", "2.0.0", "3.0.0"), start=1):
        models[version] = tmp_path / f"det-{version}.onnx"
        build_mlp(models[version], TINY_MLP, seed=seed)
        pushed = hub.edgectl(
            "models", "push", str(models[version]), "--name", "det", "--version", version
        )
        assert "pushed" in pushed.stdout, pushed.stdout + pushed.stderr
    doc = tmp_path / "det.yaml"
    e = edged_factory(None, data=data, config=SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "x"))
    e.start()
    try:
        for version in ("1.0.0", "2.0.0", "3.0.0"):
            doc.write_text(DEPLOYMENT.format(version=version))
            hub.edgectl("apply", "-f", str(doc))
            wait_for(lambda v=version: serving(e, v), 120, f"the device to serve det {version}")
            # and the hub to know it: the next rollout starts from this revision
            wait_for(lambda: rollout_phase(hub) == "Complete", 60, f"det {version} complete")

        # an allowance on 1.0.0's target that names other bytes (2.0.0's model): refused
        other = hashlib.sha256(models["2.0.0"].read_bytes()).hexdigest()
        push_with_allowance_for(hub, models["1.0.0"], other)
        doc.write_text(DEPLOYMENT.format(version="1.0.0"))
        hub.edgectl("apply", "-f", str(doc))
        wait_for(
            lambda: (
                "RollbackAllowanceMismatch" in problems(e) or e.refused("RollbackAllowanceMismatch")
            ),
            90,
            "the device to refuse an allowance for another digest",
        )
        # 3.0.0 keeps serving (waited for: under load a readiness probe may miss one period)
        wait_for(lambda: serving(e, "3.0.0"), 30, "det 3.0.0 to keep serving")
        # the refusal reaches the hub, which rolls the rollout back; resume only after that
        # (a resume while it is still Progressing is refused, "nothing to resume", and the
        # rollback that follows would then hold the device on 3.0.0)
        wait_for(lambda: rollout_phase(hub) == "RolledBack", 90, "the hub to roll back")

        # the publisher's own allowance (edgectl): 1.0.0 signed anew, its target allowing it
        again = hub.edgectl(
            "models", "push", str(models["1.0.0"]), "--name", "det", "--version", "1.0.0",
            "--allow-rollback", "7d", check=False,
        )  # fmt: skip
        assert again.returncode == 0, again.stdout + again.stderr
        hub.edgectl("rollout", "resume", "det")  # retries the rolled-back revision
        wait_for(lambda: serving(e, "1.0.0"), 120, "the device to go back to det 1.0.0")
    finally:
        e.terminate()
