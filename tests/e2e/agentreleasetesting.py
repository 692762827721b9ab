"""Helpers of the edged release tests: releases built by the real ``packaging/agent/build-release``
(and hostile ones built by hand), metadata signed with the hub's real quickstart keys, and the
agent role's TUF targets made as ``edgectl agent push`` makes them, for pushes sent straight to
a real hub over mutual TLS (:func:`push_raw`) when a test must get past edgectl's own checks."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from fleet import HubProcess

from edgefleet.trust import agentreleases, signing, tufmeta
from edgefleet.trust.agentreleases import AgentReleaseMetadata, Platform
from edgefleet.trust.documents import format_time
from edgefleet.trust.envelopes import sign_envelope
from edgefleet.v1 import admin_pb2, admin_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
BUILD_RELEASE = REPO / "packaging" / "agent" / "build-release"


def build_release(out: Path, version: str, *extra: str, epoch: int = 0) -> Path:
    """``packaging/agent/build-release`` run as a program (``epoch``: SOURCE_DATE_EPOCH)."""
    import os

    done = subprocess.run(
        [sys.executable, str(BUILD_RELEASE), "--version", version, "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def handmade_release(
    out: Path, entries: dict[str, bytes], *, links: dict[str, str] | None = None
) -> Path:
    """A gzip'd tar with exactly ``entries`` (and symbolic ``links``), nothing checked."""
    with tarfile.open(out, "w:gz") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return out


def minimal_entries(version: str, plat: Platform | None = None) -> dict[str, bytes]:
    """The entries of a small well-formed release (no code: enough for the checks)."""
    import orjson

    plat = plat or agentreleases.this_platform()
    return {
        "release.json": orjson.dumps(agentreleases.ReleaseManifest(version, plat).to_json()),
        f"lib/edgefleet-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: edgefleet\nVersion: {version}\n"
        ).encode(),
        "lib/edged/__init__.py": b"",
    }


def metadata_doc(
    path: Path,
    version: str,
    *,
    plat: Platform | None = None,
    length: int | None = None,
    sha256: str | None = None,
    requires: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Release metadata for ``path`` claiming what the arguments say (no checks)."""
    sha, size = agentreleases.file_digest(path)
    plat = plat or agentreleases.this_platform()
    now = time.time()
    return {
        "_type": "agent-release",
        "name": "edged",
        "version": version,
        "platform": plat.to_json(),
        "file": {
            "name": agentreleases.release_file_name(version, plat),
            "sha256": sha256 or sha,
            "length": size if length is None else length,
        },
        "requires": _requires_of(path) if requires is None else requires,
        "created": format_time(now),
        "expires": format_time(now + 86400),
    }


def _requires_of(path: Path) -> dict[str, str]:
    """What the release's release.json requires ({} when it is no valid release)."""
    from edgefleet.errors import ArtifactError

    try:
        return dict(agentreleases.inspect_release(path).requires)
    except ArtifactError:
        return {}


def signed_metadata(doc: dict[str, Any], key: Path, payload_type: str | None = None) -> bytes:
    return sign_envelope(
        payload_type or agentreleases.AGENT_RELEASE_TYPE, doc, [signing.load_private_key(key)]
    ).to_bytes()


def role_targets(hub: HubProcess, role: str, meta: AgentReleaseMetadata, key: Path) -> bytes:
    """The role's delegated targets as the hub holds them with the release file added, the
    next version, signed by ``key`` (what edgectl agent push sends)."""
    held = hub.data / "tuf" / "delegated" / f"{role}.json"
    current = held.read_bytes() if held.exists() else None
    return agentreleases.add_release(
        current, meta, [tufmeta.tuf_signer(key)], expires=time.time() + 86400
    )


@contextmanager
def admin_stub(hub: HubProcess, *, cert_dir: Path | None = None) -> Iterator[Any]:
    """AdminService over mutual TLS with the admin credentials of admin.toml, or a device's
    (``cert_dir``: an enrolled device's data directory)."""
    from edgectl.client import load_admin_config

    if cert_dir is None:
        cfg = load_admin_config(hub.admin_config, None)
        ca, key, cert = cfg.ca_certificate, cfg.key, cfg.certificate
    else:
        ca = cert_dir / "hub" / "ca.crt"
        key = cert_dir / "identity" / "key.pem"
        cert = cert_dir / "hub" / "device.crt"
    creds = grpc.ssl_channel_credentials(ca.read_bytes(), key.read_bytes(), cert.read_bytes())
    with grpc.secure_channel(hub.address, creds) as channel:
        yield admin_pb2_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]


def push_raw(
    stub: Any,
    envelope: bytes,
    data: bytes,
    *,
    role: str = "",
    targets: bytes = b"",
) -> admin_pb2.PushAgentReleaseResponse:
    header = admin_pb2.ArtifactHeader(
        signed_metadata=envelope, delegated_role=role, delegated_targets=targets
    )
    messages = [admin_pb2.PushArtifactRequest(header=header)]
    messages += [
        admin_pb2.PushArtifactRequest(chunk=data[i : i + 65536]) for i in range(0, len(data), 65536)
    ]
    response: admin_pb2.PushAgentReleaseResponse = stub.PushAgentRelease(iter(messages), timeout=60)
    return response


def refused(call: Any, code: grpc.StatusCode, reason: str) -> str:
    """Run ``call``; assert it failed with ``code`` and ``reason`` in its details."""
    try:
        call()
    except grpc.RpcError as exc:
        details = exc.details() or ""
        assert exc.code() == code, (exc.code(), details)
        assert reason in details, details
        return details
    raise AssertionError(f"not refused (expected {reason})")
