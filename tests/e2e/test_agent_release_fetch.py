"""A device fetches an edged release (docs/agent-updates.md, "Releases"): the hub's
DesiredAgent verified against the device's own TUF trust, then downloaded.

Real parts: ``hub init`` and ``hub serve`` as processes, releases built by
``packaging/agent/build-release`` and pushed with ``edgectl agent push``, a device enrolled with
``edged enroll`` (its certificate, its fleet root pinned); the fetch runs here with that
device's data directory, its ArtifactGate and TufClient, over a real gRPC channel with the
device's certificate (FetchTufMetadata and FetchArtifact of the real hub). The attacks are
DesiredAgents a hostile hub could send, and streams it could cut or alter: each refused with
its reason, nothing left in ``D/agent/downloads`` that could pass for the release.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from agentreleasetesting import build_release, metadata_doc, signed_metadata
from fleet import HubProcess, enroll

from edged.hublink.agentreleases import VerifiedRelease, make_fetch
from edged.hublink.linking import Fetcher
from edged.trust.admitting import ArtifactGate
from edged.trust.tufclient import TufClient
from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.errors import ArtifactError, TemporaryError
from edgefleet.trust import agentreleases, signing
from edgefleet.v1 import device_pb2, device_pb2_grpc

pytestmark = pytest.mark.scenario
T = TypeVar("T")


@dataclass(frozen=True)
class Desired:
    version: str
    signed_metadata: bytes


@dataclass
class World:
    hub: HubProcess
    device: Path  # the enrolled device's data directory
    release: Path  # 0.5.0, pushed
    aarch64: Path  # 0.5.0 for aarch64/cp311, pushed


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    d = tmp_path_factory.mktemp("agent-fetch")
    hub = HubProcess(d / "hub", d / "hub.log").init().start()
    try:
        release = build_release(d / "edged-0.5.0.tar.gz", "0.5.0")
        aarch64 = build_release(
            d / "edged-0.5.0-arm.tar.gz", "0.5.0", "--arch", "aarch64", "--python-abi", "cp311"
        )
        for path in (release, aarch64):
            assert "pushed" in hub.edgectl("agent", "push", str(path), "--version", "0.5.0").stdout
        out = enroll(hub, d / "dev", "dev-f", {})
        assert out.returncode == 0, out.stdout + out.stderr
        yield World(hub, d / "dev", release, aarch64)
    finally:
        hub.stop()


def agent_key(w: World) -> Path:
    return w.hub.data / "agent-publisher.key"


def envelope(w: World, path: Path, version: str = "0.5.0", **kw: Any) -> bytes:
    return signed_metadata(metadata_doc(path, version, **kw), agent_key(w))


def run_fetch(
    w: World,
    desired: Desired,
    wrap: Callable[[Fetcher], Any] | None = None,
    progress: list[tuple[int, int]] | None = None,
) -> VerifiedRelease:
    """The device's fetch, as the daemon makes it, over a channel with its certificate."""

    async def go() -> VerifiedRelease:
        creds = grpc.ssl_channel_credentials(
            (w.device / "hub" / "ca.crt").read_bytes(),
            (w.device / "identity" / "key.pem").read_bytes(),
            (w.device / "hub" / "device.crt").read_bytes(),
        )
        async with grpc.aio.secure_channel(w.hub.address, creds) as channel:
            fetcher = Fetcher(device_pb2_grpc.DeviceServiceStub(channel))  # type: ignore[no-untyped-call]
            link = wrap(fetcher) if wrap is not None else fetcher
            fetch = make_fetch(
                w.device,
                link=lambda: link,
                tuf=TufClient(w.device),
                gate=ArtifactGate(w.device, root_file=None, allow_unsigned=False),
                progress=(lambda done, total: progress.append((done, total)))
                if progress is not None
                else None,
            )
            return await fetch(desired)  # type: ignore[arg-type]

    return asyncio.run(go())


def refused(reason: str, call: Callable[[], T]) -> ArtifactError:
    with pytest.raises(ArtifactError) as info:
        call()
    assert info.value.reason == reason, (info.value.reason, str(info.value))
    return info.value


def downloads(w: World) -> set[str]:
    folder = w.device / "agent" / "downloads"
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


def test_a_device_fetches_a_verified_release(world: World) -> None:
    sha, size = agentreleases.file_digest(world.release)
    seen: list[tuple[int, int]] = []
    got = run_fetch(world, Desired("0.5.0", envelope(world, world.release)), progress=seen)
    plat = agentreleases.this_platform()
    assert (got.version, got.arch, got.python_abi, got.sha256, got.length) == (
        "0.5.0", plat.arch, plat.python_abi, sha, size
    )  # fmt: skip
    assert got.path == world.device / "agent" / "downloads" / f"{sha}.tar.gz"
    assert got.path.read_bytes() == world.release.read_bytes()
    assert got.requires == agentreleases.inspect_release(world.release).requires
    assert seen and seen[-1] == (size, size)
    assert downloads(world) == {f"{sha}.tar.gz"}
    # the device's TUF cache now holds the agent role's targets, checked by python-tuf
    assert (world.device / "trust" / "tuf" / "agent.json").exists()
    # again: already there, checked again, not downloaded again
    assert run_fetch(world, Desired("0.5.0", envelope(world, world.release))) == got


def test_what_a_hostile_hub_may_send_is_refused_before_a_byte(world: World, tmp_path: Path) -> None:
    before = downloads(world)
    good = envelope(world, world.release)
    # another platform's release (pushed and signed: valid, but not for this device)
    refused(
        "WrongPlatform",
        lambda: run_fetch(
            world,
            Desired(
                "0.5.0",
                envelope(world, world.aarch64, plat=agentreleases.Platform("aarch64", "cp311")),
            ),
        ),
    )
    # the hub asks for another version than the metadata it sends
    refused("MetadataMismatch", lambda: run_fetch(world, Desired("0.5.1", good)))
    # signed by a model publisher's key: listed by the agent role, not signed by it
    by_model_key = signed_metadata(
        metadata_doc(world.release, "0.5.0"), world.hub.data / "publisher.key"
    )
    refused("SignerNotDelegated", lambda: run_fetch(world, Desired("0.5.0", by_model_key)))
    # a model's signed metadata where a release's goes
    model = build_mlp(tmp_path / "m.onnx", TINY_MLP, seed=4)
    _, model_env = signing.sign_artifact(
        model, name="m", version="0.5.0", keys=[world.hub.data / "publisher.key"]
    )
    refused("WrongPayloadType", lambda: run_fetch(world, Desired("0.5.0", model_env.to_bytes())))
    # signed by the agent key but never pushed: no agent role's targets list it
    other = build_release(tmp_path / "other.tar.gz", "0.6.0")
    refused(
        "NotInTargets",
        lambda: run_fetch(world, Desired("0.6.0", envelope(world, other, "0.6.0"))),
    )
    # other bytes than the targets list for this version and platform
    again = build_release(tmp_path / "again.tar.gz", "0.5.0", epoch=7)
    refused("TargetMismatch", lambda: run_fetch(world, Desired("0.5.0", envelope(world, again))))
    # expired metadata
    doc = metadata_doc(world.release, "0.5.0")
    doc["expires"] = "2020-01-01T00:00:00Z"
    expired = signed_metadata(doc, agent_key(world))
    refused("MetadataExpired", lambda: run_fetch(world, Desired("0.5.0", expired)))
    assert downloads(world) == before


def _altered(fetcher: Fetcher, *, flip: bool = False, stop_at: int | None = None) -> Any:
    class Altered:
        async def metadata(self, name: str, max_length: int) -> bytes | None:
            return await fetcher.metadata(name, max_length)

        async def __call__(self, sha: str, offset: int) -> AsyncIterator[tuple[int, bytes]]:
            async for at, data in fetcher(sha, offset):
                if stop_at is not None and at + len(data) > stop_at:
                    yield at, data[: stop_at - at]
                    return
                yield at, (bytes([data[0] ^ 1]) + data[1:]) if flip else data

    return Altered()


def test_a_partial_or_altered_download_never_passes(world: World) -> None:
    sha, size = agentreleases.file_digest(world.release)
    final = world.device / "agent" / "downloads" / f"{sha}.tar.gz"
    final.unlink(missing_ok=True)
    good = Desired("0.5.0", envelope(world, world.release))
    # the stream breaks halfway: a retry later, the part kept to resume from, no release
    with pytest.raises(TemporaryError):
        run_fetch(world, good, wrap=lambda f: _altered(f, stop_at=size // 2))
    assert not final.exists()
    assert downloads(world) == {f"{sha}.part"}
    # the rest arrives altered: refused, the part removed
    refused("DigestMismatch", lambda: run_fetch(world, good, wrap=lambda f: _altered(f, flip=True)))
    assert not final.exists() and downloads(world) == set()
    # a release file altered on disk after it was fetched is fetched again
    got = run_fetch(world, good)
    got.path.write_bytes(b"x" * size)
    again = run_fetch(world, good)
    assert again.path.read_bytes() == world.release.read_bytes()


def test_a_device_may_fetch_only_what_the_hub_holds(world: World) -> None:
    """FetchArtifact gives any enrolled device a held release's bytes, and nothing else."""

    async def go() -> None:
        creds = grpc.ssl_channel_credentials(
            (world.device / "hub" / "ca.crt").read_bytes(),
            (world.device / "identity" / "key.pem").read_bytes(),
            (world.device / "hub" / "device.crt").read_bytes(),
        )
        async with grpc.aio.secure_channel(world.hub.address, creds) as channel:
            stub = device_pb2_grpc.DeviceServiceStub(channel)  # type: ignore[no-untyped-call]
            call = stub.FetchArtifact(device_pb2.FetchArtifactRequest(sha256="1" * 64, offset=0))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in call:
                    pass
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED

    asyncio.run(go())
