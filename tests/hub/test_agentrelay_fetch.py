"""A regional hub's fetch of an edged release from its root, against hostile answers
(hub.controllers.parentlink.agentrelay): a root stub that sends what it wants, a real
MemoryStore, blob store and event writer. What the region refuses is stored nowhere and
reported with its reason; a try that fails for want of the root's TUF metadata is not a
refusal and is tried again after its backoff. (The whole path with real hubs and real TUF:
tests/e2e/test_agent_waves.py.)"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from asynctesting import async_test
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.trust import agentreleases
from edgefleet.trust.agentreleases import Platform
from edgefleet.trust.documents import format_time
from edgefleet.trust.envelopes import ARTIFACT_TYPE, sign_envelope
from edgefleet.v1 import federation_pb2
from hub.controllers.parentlink.agentrelay import AgentReleaseRelay
from hub.state.agentreleases import agent_releases
from hub.state.cache import Cache
from hub.state.heldtuf import HeldTuf
from hub.state.store import MemoryStore
from hub.state.writer import DeviceWriter

PLAT = Platform("x86_64", "cp311")
SHA = "ab" * 32


def envelope(version: str = "0.3.0", payload_type: str | None = None) -> bytes:
    now = time.time()
    doc = {
        "_type": "agent-release",
        "name": "edged",
        "version": version,
        "platform": PLAT.to_json(),
        "file": {
            "name": agentreleases.release_file_name(version, PLAT),
            "sha256": SHA,
            "length": 10,
        },
        "requires": {},
        "created": format_time(now),
        "expires": format_time(now + 3600),
    }
    key = Ed25519PrivateKey.generate()
    return sign_envelope(payload_type or agentreleases.AGENT_RELEASE_TYPE, doc, [key]).to_bytes()


def record(env: bytes, *, sha256: str = SHA, version: str = "0.3.0") -> Any:
    return federation_pb2.FederatedAgentReleasePart(
        release=federation_pb2.FederatedAgentRelease(
            version=version, arch=PLAT.arch, python_abi=PLAT.python_abi, sha256=sha256,
            length=10, envelope=env,
        )
    )  # fmt: skip


def data(b: bytes) -> Any:
    return federation_pb2.FederatedAgentReleasePart(data=b)


class Root:
    """A root that answers each fetch with ``parts``."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self.asked: list[tuple[str, list[str]]] = []

    def FetchFederatedAgentRelease(self, request: Any) -> AsyncIterator[Any]:
        self.asked.append((request.version, list(request.held_sha256)))

        async def gen() -> AsyncIterator[Any]:
            for p in self.parts:
                yield p

        return gen()


async def relay(tmp_path: Path) -> tuple[AgentReleaseRelay, MemoryStore, Cache]:
    store = MemoryStore()
    cache = Cache()
    r = AgentReleaseRelay(
        store=store,
        blobs=ArtifactStore(tmp_path / "blobs"),
        tuf=HeldTuf(cache, None),
        data_dir=tmp_path,
        writer=DeviceWriter(store, cache),
    )
    r.want(["0.3.0"])
    return r, store, cache


def _leftovers(tmp_path: Path) -> list[Path]:
    """Release bytes kept: a blob or a fetch's temporary file."""
    blobs = [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]
    return blobs + [p for p in tmp_path.iterdir() if p.name.startswith(".agent-fetch-")]


async def refused_with(tmp_path: Path, parts: list[Any], reason: str) -> None:
    r, store, _ = await relay(tmp_path)
    assert not await r.fetch_once(Root(parts), "0.3.0")
    assert await agent_releases(store) == []
    assert _leftovers(tmp_path) == []
    why = r.refusals()["0.3.0"]
    assert why.startswith(f"{reason}: "), why
    attempt = r.attempts["0.3.0"]
    assert attempt.refused and attempt.retry_at > time.time()


@async_test
async def test_bytes_before_any_record_are_refused(tmp_path: Path) -> None:
    await refused_with(tmp_path, [data(b"x" * 10)], "NoHeader")


@async_test
async def test_a_models_metadata_is_no_release(tmp_path: Path) -> None:
    await refused_with(tmp_path, [record(envelope(payload_type=ARTIFACT_TYPE))], "WrongPayloadType")


@async_test
async def test_a_record_that_is_not_what_was_signed_is_refused(tmp_path: Path) -> None:
    await refused_with(tmp_path, [record(envelope(), sha256="cd" * 32)], "RecordMismatch")
    await refused_with(tmp_path, [record(envelope("0.4.0"), version="0.4.0")], "RecordMismatch")


@async_test
async def test_an_empty_answer_is_refused(tmp_path: Path) -> None:
    await refused_with(tmp_path, [], "NoRelease")


@async_test
async def test_without_the_roots_tuf_yet_the_try_fails_and_is_not_a_refusal(
    tmp_path: Path,
) -> None:
    r, store, _ = await relay(tmp_path)
    root = Root([record(envelope()), data(b"x" * 10)])
    assert not await r.fetch_once(root, "0.3.0")
    assert r.refusals() == {} and r.attempts["0.3.0"].failures == 1
    assert "NoTufMetadata" in r.attempts["0.3.0"].reason
    assert await agent_releases(store) == []
    # no longer wanted: forgotten
    r.want([])
    assert r.attempts == {}


@async_test
async def test_a_held_version_names_what_it_holds_and_nothing_new_is_no_failure(
    tmp_path: Path,
) -> None:
    r, store, _ = await relay(tmp_path)
    root = Root([])
    assert await r.fetch_once(root, "0.3.0", [SHA])
    assert root.asked == [("0.3.0", [SHA])]
    assert r.attempts == {} and r.refusals() == {} and "0.3.0" in r.checked
    assert await agent_releases(store) == []
