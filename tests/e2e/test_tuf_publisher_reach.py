"""A delegated publisher key reaches only its delegated model names (issue 29, item 9), end to
end: a real hub with a TUF repository and an enrolled edged over mTLS gRPC.

The fleet has two publishers, both artifact keys of the fleet trust root: ``vision`` (the
quickstart's publisher key) is delegated ``vision-*``, ``audio`` (a second key) ``audio-*``.
audio pushes ``audio-x`` 1.0.0 and 2.0.0; the device runs 2.0.0. Then vision, compromised,
tries to send the device back to 1.0.0 — audio's bytes, still listed in audio's targets:

* through the hub: it re-signs audio-x 1.0.0 with a fresh metadata version and pushes it with
  audio's held targets, and pushes a separate rollback allowance it signed. The hub refuses
  both (``SignerNotDelegated``; ``RollbackAllowanceNotInTargets``, naming where an allowance
  goes with TUF), and the device never leaves 2.0.0;
* through a compromised hub (its store written directly, as a hub that ignores its own
  checks would send it): the device refuses the separate allowance
  (``RollbackAllowanceNotInTargets``) and vision's re-signed audio-x 2.0.0
  (``SignerNotDelegated``), and keeps serving audio's 2.0.0.

Before the fix, every step of the attack was accepted and the device ran audio-x 1.0.0.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.launching import program_command

pytestmark = pytest.mark.scenario

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: asr}}
spec:
  model: {{name: audio-x, version: "{version}"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  probes:
    readiness: {{periodSeconds: 1, timeoutSeconds: 1}}
"""


def run(*cmd: str | Path) -> str:
    out = subprocess.run(
        program_command(*(str(c) for c in cmd)),  # type: ignore[arg-type]
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, f"{cmd}: {out.stdout}{out.stderr}"
    return out.stdout


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    """``hub init --tuf``, then, before the first start, the fleet's offline steps for a second
    publisher: its key pair, a fleet root listing both artifact keys, and top-level targets
    delegating ``vision-*`` to the quickstart key and ``audio-*`` to the new one."""
    h = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init("--tuf")
    d = h.data
    run("edgectl", "keys", "generate", "--out", d / "audio")
    run("edgectl", "trust", "root", "create", "--root-key", d / "root.key",
        "--artifact-key", d / "publisher.pub", "--artifact-key", d / "audio.pub",
        "--out", d / "trust-root.json")  # fmt: skip
    targets = tmp_path / "targets-2.json"
    run("edgectl", "trust", "tuf", "targets", "--key", d / "targets.key",
        "--delegate", f"vision={d / 'publisher.pub'}:vision-*",
        "--delegate", f"audio={d / 'audio.pub'}:audio-*",
        "--version", "2", "--out", targets)  # fmt: skip
    run("hub", "tuf", "install", "--data-dir", d, "--root", d / "tuf" / "root.json",
        "--targets", targets)  # fmt: skip
    h.start()
    yield h
    h.stop()


def serving(e: Edged, version: str) -> bool:
    try:
        w = e.workload("asr")
    except (KeyError, StopIteration):
        return False
    return w.get("model", {}).get("version") == version and w.get("readyReplicas") == 1


def problem(e: Edged) -> tuple[str, str] | None:
    hub = e.status().get("hub") or {}
    for p in hub.get("problems", []):
        if p.get("workload") == "asr":
            return str(p["reason"]), str(p["message"])
    return None


def admin_stub(hub: HubProcess) -> tuple[grpc.Channel, object]:
    from edgectl.client import load_admin_config
    from edgefleet.v1 import admin_pb2_grpc

    cfg = load_admin_config(hub.admin_config, None)
    channel = grpc.secure_channel(
        hub.address,
        grpc.ssl_channel_credentials(
            root_certificates=cfg.ca_certificate.read_bytes(),
            private_key=cfg.key.read_bytes(),
            certificate_chain=cfg.certificate.read_bytes(),
        ),
    )
    return channel, admin_pb2_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]


def resign_as_vision(hub: HubProcess, model: Path, version: str) -> bytes:
    """audio's model re-signed by the vision key, with a fresh metadata version."""
    from edgefleet.trust import signing

    _, env = signing.sign_artifact(
        model, name="audio-x", version=version, keys=[hub.data / "publisher.key"]
    )
    return env.to_bytes()


def allowance_by_vision(hub: HubProcess, model: Path, out: Path) -> Path:
    run("edgectl", "rollback", "allow", "--name", "audio-x", "--version", "1.0.0",
        "--model", model, "--key", hub.data / "publisher.key", "--out", out)  # fmt: skip
    return out


def start_on_2(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> tuple[Edged, dict[str, Path]]:
    """A device serving audio-x 2.0.0, pushed (with 1.0.0) by the audio publisher."""
    data = tmp_path / "dev"
    out = enroll(hub, data, "dev", {})
    assert out.returncode == 0, out.stdout + out.stderr
    models = {}
    for seed, version in enumerate(("1.0.0", "2.0.0"), start=1):
        models[version] = tmp_path / f"audio-x-{version}.onnx"
        build_mlp(models[version], TINY_MLP, seed=seed)
        pushed = hub.edgectl("models", "push", str(models[version]), "--name", "audio-x",
                             "--version", version,
                             "--key", str(hub.data / "audio.key"))  # fmt: skip
        assert "pushed" in pushed.stdout, pushed.stdout + pushed.stderr
    doc = tmp_path / "asr.yaml"
    doc.write_text(DEPLOYMENT.format(version="2.0.0"))
    hub.edgectl("apply", "-f", str(doc))
    e = edged_factory(None, data=data, config=SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "x"))
    e.start()
    wait_for(lambda: serving(e, "2.0.0"), 120, "the device to serve audio-x 2.0.0")
    assert e.status()["hub"]["tufRequired"] is True
    return e, models


def test_the_hub_refuses_a_publisher_reaching_beyond_its_delegation(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    from edgefleet.v1 import admin_pb2, common_pb2

    e, models = start_on_2(hub, tmp_path, edged_factory)
    try:
        channel, stub = admin_stub(hub)
        with channel:
            held = stub.FetchTufMetadata(  # type: ignore[attr-defined]
                common_pb2.TufMetadataRequest(name="audio.json")
            ).data
            header = admin_pb2.ArtifactHeader(
                signed_metadata=resign_as_vision(hub, models["1.0.0"], "1.0.0"),
                delegated_role="audio",
                delegated_targets=held,  # audio's own targets, which list these bytes
            )
            with pytest.raises(grpc.RpcError) as info:
                stub.PushArtifact(  # type: ignore[attr-defined]
                    iter(
                        [
                            admin_pb2.PushArtifactRequest(header=header),
                            admin_pb2.PushArtifactRequest(chunk=models["1.0.0"].read_bytes()),
                        ]
                    ),
                    timeout=60,
                )
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "SignerNotDelegated" in (info.value.details() or ""), info.value.details()
            assert "'audio'" in (info.value.details() or "")

        allow = allowance_by_vision(hub, models["1.0.0"], tmp_path / "allow.json")
        pushed = hub.edgectl("rollback", "push", str(allow), check=False)
        assert pushed.returncode != 0, pushed.stdout
        said = pushed.stdout + pushed.stderr
        assert "RollbackAllowanceNotInTargets" in said and "--allow-rollback" in said, said

        # the operator asks for 1.0.0: only audio's own 1.0.0 is there, and the device refuses
        # to go back without audio's allowance
        doc = tmp_path / "asr.yaml"
        doc.write_text(DEPLOYMENT.format(version="1.0.0"))
        hub.edgectl("apply", "-f", str(doc))
        wait_for(lambda: problem(e) is not None, 90, "the device to refuse audio-x 1.0.0")
        reason, message = problem(e) or ("", "")
        assert reason in ("MetadataRollback", "ModelVersionRollback"), message
        wait_for(lambda: serving(e, "2.0.0"), 30, "audio-x 2.0.0 to keep serving")
    finally:
        e.terminate()


def plant(hub: HubProcess, version: str, envelope: bytes, allowance: bytes = b"") -> None:
    """What a compromised hub sends: the model record's envelope (and allowance) replaced,
    written into the stopped hub's store."""
    from dataclasses import replace

    import orjson

    from hub.state import storekeys
    from hub.state.store.sqlite import SqliteStore

    async def write() -> None:
        store = await SqliteStore.open(hub.data / "hub.db")
        try:
            key = storekeys.model_key("audio-x", version)
            kv = await store.get(key)
            assert kv is not None
            record = storekeys.ModelRecord.from_json(orjson.loads(kv.value))
            record = replace(record, envelope=envelope, rollback_allowance=allowance)
            await store.put(key, storekeys.dumps(record.to_json()))
        finally:
            await store.close()

    asyncio.run(write())


def test_a_device_refuses_a_publisher_reaching_beyond_its_delegation(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    e, models = start_on_2(hub, tmp_path, edged_factory)
    try:
        allow = allowance_by_vision(hub, models["1.0.0"], tmp_path / "allow.json").read_bytes()
        hub.stop()
        plant(hub, "1.0.0", resign_as_vision(hub, models["1.0.0"], "1.0.0"), allow)
        hub.start()
        doc = tmp_path / "asr.yaml"
        doc.write_text(DEPLOYMENT.format(version="1.0.0"))
        hub.edgectl("apply", "-f", str(doc))
        wait_for(lambda: problem(e) is not None, 90, "the device to refuse audio-x 1.0.0")
        reason, message = problem(e) or ("", "")
        assert reason == "RollbackAllowanceNotInTargets", message
        assert "--allow-rollback" in message
        wait_for(lambda: serving(e, "2.0.0"), 30, "audio-x 2.0.0 to keep serving")

        # vision's re-signed audio-x 2.0.0 (the very bytes the device runs, a higher
        # metadata version that would lock audio's own metadata out): refused
        hub.stop()
        plant(hub, "2.0.0", resign_as_vision(hub, models["2.0.0"], "2.0.0"))
        hub.start()
        doc.write_text(DEPLOYMENT.format(version="2.0.0"))
        hub.edgectl("apply", "-f", str(doc))
        wait_for(
            lambda: (problem(e) or ("",))[0] == "SignerNotDelegated",
            90,
            "the device to refuse vision's signature on audio-x 2.0.0",
        )
        reason, message = problem(e) or ("", "")
        assert "'audio'" in message, message
        wait_for(lambda: serving(e, "2.0.0"), 30, "audio's audio-x 2.0.0 to keep serving")
    finally:
        e.terminate()
