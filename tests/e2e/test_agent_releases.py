"""edged releases as signed artifacts (docs/agent-updates.md, "Releases"), pushed to a real hub.

Real parts: ``hub init`` (quickstart keys, TUF repository with the ``agent`` delegation) and
``hub serve`` as processes, ``edgectl agent push|list`` as a process, releases built by
``packaging/agent/build-release``, pushes over mutual TLS. The attacks go straight to
AdminService ``PushAgentRelease`` (past edgectl's own checks) with metadata and TUF targets
signed by the hub's real keys; each must be refused with its reason and leave nothing stored.

One hub serves the whole module (each test uses versions of its own).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from agentreleasetesting import (
    admin_stub,
    build_release,
    handmade_release,
    metadata_doc,
    minimal_entries,
    push_raw,
    refused,
    role_targets,
    signed_metadata,
)
from fleet import HubProcess, enroll

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.trust import agentreleases, signing
from edgefleet.trust.agentreleases import Platform
from edgefleet.trust.documents import parse_artifact
from edgefleet.trust.envelopes import ARTIFACT_TYPE, decode_payload

pytestmark = pytest.mark.scenario

PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    d = tmp_path_factory.mktemp("agent-hub")
    h = HubProcess(d / "hub", d / "hub.log").init().start()
    yield h
    h.stop()


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkout built as release 0.2.1 (real build-release)."""
    return build_release(tmp_path_factory.mktemp("rel") / "edged-0.2.1.tar.gz", "0.2.1")


def agent_key(hub: HubProcess) -> Path:
    return hub.data / "agent-publisher.key"


def model_key(hub: HubProcess) -> Path:
    return hub.data / "publisher.key"


def stored_blobs(hub: HubProcess) -> set[str]:
    return {p.name for p in (hub.data / "artifacts" / "blobs").glob("*")}


def test_push_then_list(hub: HubProcess, release: Path) -> None:
    sha, size = agentreleases.file_digest(release)
    plat = agentreleases.this_platform()
    out = hub.edgectl("agent", "push", str(release), "--version", "0.2.1")
    assert out.stdout == f"edged 0.2.1 ({plat}) pushed (sha256 {sha}, {size} bytes)\n", out
    again = hub.edgectl("agent", "push", str(release), "--version", "0.2.1")
    assert again.stdout == f"edged 0.2.1 ({plat}) unchanged (sha256 {sha}, {size} bytes)\n"
    # the agent role's targets list it: devices find it in TUF
    assert (hub.data / "tuf" / "delegated" / "agent.json").exists()
    listed = hub.edgectl("agent", "list")
    assert listed.stdout.splitlines()[0].split() == [
        "VERSION", "ARCH", "PYTHON-ABI", "BYTES", "SHA256", "AGE"
    ]  # fmt: skip
    assert listed.stdout.splitlines()[1].split()[:5] == [
        "0.2.1", plat.arch, plat.python_abi, str(size), sha[:12]
    ]  # fmt: skip
    doc = json.loads(hub.edgectl("agent", "list", "-o", "json").stdout)
    (r,) = [r for r in doc["releases"] if r["version"] == "0.2.1"]
    pub = signing.load_public_key_raw(hub.data / "agent-publisher.pub")
    from edgefleet.trust.envelopes import key_id

    assert (r["sha256"], r["length"], r["signers"]) == (sha, size, [key_id(pub)])

    # one event, for the push that stored it
    events = json.loads(hub.edgectl("get", "events", "-o", "json").stdout)
    items = events["items"] if isinstance(events, dict) else events
    pushed = [e for e in items if e.get("object", {}).get("kind") == "AgentRelease"]
    assert [(e["object"]["name"], e["reason"]) for e in pushed] == [
        (f"0.2.1-{plat.arch}-{plat.python_abi}", "Pushed")
    ], pushed

    # immutable: other bytes under the same version and platform are refused
    other = build_release(release.with_name("other.tar.gz"), "0.2.1", epoch=1)
    assert agentreleases.file_digest(other)[0] != sha
    out = hub.edgectl("agent", "push", str(other), "--version", "0.2.1", check=False)
    assert out.returncode != 0
    assert "ALREADY_EXISTS" in out.stderr and "VersionExists" in out.stderr, out.stderr


def test_edgectl_refuses_a_version_its_release_json_does_not_say(
    hub: HubProcess, release: Path
) -> None:
    out = hub.edgectl("agent", "push", str(release), "--version", "0.2.2", check=False)
    assert out.returncode != 0
    assert "VersionMismatch" in out.stderr and "0.2.1" in out.stderr, out.stderr


def test_the_hub_refuses_what_a_device_would(hub: HubProcess, tmp_path: Path) -> None:
    path = handmade_release(tmp_path / "r.tar.gz", minimal_entries("0.3.0"))
    data = path.read_bytes()
    doc = metadata_doc(path, "0.3.0")
    meta = agentreleases.parse_release_metadata(doc)
    good_env = signed_metadata(doc, agent_key(hub))
    good_targets = role_targets(hub, "agent", meta, agent_key(hub))
    before = stored_blobs(hub)
    with admin_stub(hub) as stub:
        # a model publisher signs a release: its role is no agent role, and its key is no
        # key of the agent role
        lab_targets = role_targets(hub, "lab", meta, model_key(hub))
        by_model_key = signed_metadata(doc, model_key(hub))
        refused(
            lambda: push_raw(stub, by_model_key, data, role="lab", targets=lab_targets),
            PERMISSION_DENIED,
            "NotAnAgentRole",
        )
        refused(
            lambda: push_raw(stub, by_model_key, data, role="agent", targets=good_targets),
            PERMISSION_DENIED,
            "SignerNotDelegated",
        )
        # targets signed by a model publisher's key for the agent role
        refused(
            lambda: push_raw(
                stub,
                good_env,
                data,
                role="agent",
                targets=role_targets(hub, "agent", meta, model_key(hub)),
            ),
            PERMISSION_DENIED,
            "SignatureThresholdNotMet",
        )
        # a model's metadata passed off as a release (same keys, the model payload type)
        refused(
            lambda: push_raw(
                stub,
                signed_metadata(doc, agent_key(hub), ARTIFACT_TYPE),
                data,
                role="agent",
                targets=good_targets,
            ),
            INVALID,
            "WrongPayloadType",
        )
        # no TUF targets at all
        refused(
            lambda: push_raw(stub, good_env, data),
            grpc.StatusCode.FAILED_PRECONDITION,
            "TargetsMissing",
        )
        # tampered bytes: same length, one byte changed
        tampered = bytearray(data)
        tampered[len(tampered) // 2] ^= 0xFF
        refused(
            lambda: push_raw(stub, good_env, bytes(tampered), role="agent", targets=good_targets),
            INVALID,
            "DigestMismatch",
        )
        # longer than signed
        refused(
            lambda: push_raw(stub, good_env, data + b"x" * 10, role="agent", targets=good_targets),
            INVALID,
            "LengthExceeded",
        )
    assert stored_blobs(hub) == before
    assert not (hub.data / "tuf" / "delegated" / "lab.json").exists()


def _signed_push(hub: HubProcess, stub: object, path: Path, doc: dict[str, object]) -> None:
    meta = agentreleases.parse_release_metadata(doc)
    push_raw(
        stub,
        signed_metadata(doc, agent_key(hub)),
        path.read_bytes(),
        role="agent",
        targets=role_targets(hub, "agent", meta, agent_key(hub)),
    )


def test_the_tarball_must_be_what_its_metadata_says(hub: HubProcess, tmp_path: Path) -> None:
    before = stored_blobs(hub)
    aarch64 = Platform("aarch64", "cp311")
    cases = [
        # release.json of another version than signed
        ("VersionMismatch", minimal_entries("0.4.0"), "0.4.1", None, {}),
        # release.json for another platform than signed
        ("PlatformMismatch", minimal_entries("0.4.2", aarch64), "0.4.2", None, {}),
        # other requirements than signed
        ("RequirementsMismatch", minimal_entries("0.4.3"), "0.4.3", None, {"grpcio": "1.0"}),
        # path traversal, absolute paths, links, entries outside lib/
        (
            "UnsafeReleasePath",
            {**minimal_entries("0.4.4"), "lib/../../etc/x": b"x"},
            "0.4.4",
            None,
            {},
        ),
        (
            "UnsafeReleasePath",
            {**minimal_entries("0.4.5"), "/etc/cron.d/x": b"x"},
            "0.4.5",
            None,
            {},
        ),
        ("UnsafeReleasePath", {**minimal_entries("0.4.6"), "bin/x": b"x"}, "0.4.6", None, {}),
        ("UnsafeReleasePath", minimal_entries("0.4.7"), "0.4.7", {"lib/x": "/etc/shadow"}, {}),
    ]
    with admin_stub(hub) as stub:
        for reason, entries, version, links, requires in cases:
            path = handmade_release(tmp_path / f"{version}.tar.gz", entries, links=links)
            doc = metadata_doc(path, version, requires=requires)
            details = refused(lambda p=path, d=doc: _signed_push(hub, stub, p, d), INVALID, reason)
            assert version in details
        # oversized: refused from the signed length, before any byte is read
        path = handmade_release(tmp_path / "big.tar.gz", minimal_entries("0.4.8"))
        doc = metadata_doc(path, "0.4.8")
        doc["file"]["length"] = agentreleases.MAX_RELEASE_BYTES + 1  # type: ignore[index]
        refused(
            lambda: push_raw(stub, signed_metadata(doc, agent_key(hub)), b"", role="agent"),
            INVALID,
            "ReleaseTooLarge",
        )
    assert stored_blobs(hub) == before
    # edgectl refuses a release with a traversal before signing anything
    bad = handmade_release(tmp_path / "bad.tar.gz", {**minimal_entries("0.4.9"), "../x": b""})
    out = hub.edgectl("agent", "push", str(bad), "--version", "0.4.9", check=False)
    assert out.returncode != 0 and "UnsafeReleasePath" in out.stderr, out.stderr


def test_the_agent_key_cannot_sign_a_model(hub: HubProcess, tmp_path: Path) -> None:
    from edgefleet.trust import tufmeta
    from edgefleet.v1 import admin_pb2

    model = build_mlp(tmp_path / "m.onnx", TINY_MLP, seed=3)
    out = hub.edgectl(
        "models", "push", str(model), "--name", "m", "--version", "1.0.0",
        "--key", str(agent_key(hub)), check=False,
    )  # fmt: skip
    assert out.returncode != 0
    assert "its roles: agent" in out.stderr, out.stderr
    # straight to the hub: the model signed by the agent key, listed by the agent role's
    # targets (signed by the agent key too)
    _, env = signing.sign_artifact(model, name="m", version="1.0.0", keys=[agent_key(hub)])
    meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="m"))
    held = hub.data / "tuf" / "delegated" / "agent.json"
    targets = tufmeta.add_artifact(
        held.read_bytes() if held.exists() else None,
        meta,
        [tufmeta.tuf_signer(agent_key(hub))],
        expires=meta.expires,
    )
    header = admin_pb2.ArtifactHeader(
        signed_metadata=env.to_bytes(), delegated_role="agent", delegated_targets=targets
    )
    messages = [
        admin_pb2.PushArtifactRequest(header=header),
        admin_pb2.PushArtifactRequest(chunk=model.read_bytes()),
    ]
    with admin_stub(hub) as stub:
        refused(
            lambda: stub.PushArtifact(iter(messages), timeout=60), PERMISSION_DENIED, "UnknownKey"
        )
    assert "model/m" not in hub.edgectl("get", "models", "-o", "name").stdout.split()


def test_an_operator_without_admin_rights_cannot_push_or_list(
    hub: HubProcess, release: Path, tmp_path: Path
) -> None:
    data = tmp_path / "dev"
    out = enroll(hub, data, "dev-x", {})
    assert out.returncode == 0, out.stdout + out.stderr
    doc = metadata_doc(release, "0.2.1")
    from edgefleet.v1 import admin_pb2

    with admin_stub(hub, cert_dir=data) as stub:
        refused(
            lambda: push_raw(stub, signed_metadata(doc, agent_key(hub)), release.read_bytes()),
            PERMISSION_DENIED,
            "",
        )
        refused(
            lambda: stub.ListAgentReleases(admin_pb2.ListAgentReleasesRequest(), timeout=30),
            PERMISSION_DENIED,
            "",
        )


def test_the_record_names_only_the_agent_role_signers(hub: HubProcess, tmp_path: Path) -> None:
    from edgefleet.trust.envelopes import key_id, sign_envelope

    path = handmade_release(tmp_path / "r.tar.gz", minimal_entries("0.7.0"))
    doc = metadata_doc(path, "0.7.0")
    meta = agentreleases.parse_release_metadata(doc)
    both = sign_envelope(
        agentreleases.AGENT_RELEASE_TYPE,
        doc,
        [signing.load_private_key(agent_key(hub)), signing.load_private_key(model_key(hub))],
    )
    with admin_stub(hub) as stub:
        got = push_raw(
            stub,
            both.to_bytes(),
            path.read_bytes(),
            role="agent",
            targets=role_targets(hub, "agent", meta, agent_key(hub)),
        )
    assert got.stored and got.version == "0.7.0"
    listed = json.loads(hub.edgectl("agent", "list", "-o", "json").stdout)["releases"]
    (r,) = [r for r in listed if r["version"] == "0.7.0"]
    assert r["signers"] == [key_id(signing.load_public_key_raw(hub.data / "agent-publisher.pub"))]
