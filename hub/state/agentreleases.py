"""The edged releases the hub holds, in the store (issue 32, docs/agent-updates.md "Releases").

One key per release and platform (:func:`hub.decide.agentreleases.agent_release_key`), its
value the JSON of :class:`~hub.decide.agentreleases.AgentReleaseRecord`; the bytes are in the
blob store, like a model's. Written only by the push (:mod:`hub.api.agentpush`) and, at a
regional hub, by the fetch from its root (:mod:`hub.controllers.parentlink.agentrelay`), after
the release was checked as a device would check it (:class:`ReleaseContent`: the tarball says
what its signed metadata says) and its bytes were stored; read by the push,
``ListAgentReleases`` and the AgentUpgrade controller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from edgefleet.artifacts.storing import StagedArtifact
from edgefleet.errors import ArtifactError, CompareFailed, StoreError
from edgefleet.trust import agentreleases
from edgefleet.trust.agentreleases import AgentReleaseMetadata
from hub.decide.agentreleases import AGENT_RELEASES, AgentReleaseRecord, agent_release_key
from hub.state import storekeys
from hub.state.store import Compare, Put, Store

MAX_AGENT_RELEASES = 10_000
"""Records read at most by a listing (a fleet keeps a few dozen releases)."""


def _record(value: bytes, key: str) -> AgentReleaseRecord:
    try:
        return AgentReleaseRecord.from_json(storekeys.loads(value))
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{key}: not an agent release record: {exc}") from None


async def agent_release(
    store: Store, version: str, arch: str, python_abi: str
) -> AgentReleaseRecord | None:
    """The release of ``version`` for the platform (``x86_64``, ``cp311``), or None."""
    key = agent_release_key(version, arch, python_abi)
    kv = await store.get(key)
    return None if kv is None else _record(kv.value, key)


async def agent_releases(store: Store) -> list[AgentReleaseRecord]:
    """Every release the hub holds, newest push first (at most :data:`MAX_AGENT_RELEASES`)."""
    result = await store.range(AGENT_RELEASES)
    records = [_record(kv.value, kv.key) for kv in result.kvs[:MAX_AGENT_RELEASES]]
    return sorted(records, key=lambda r: (-r.pushed_at, r.key))


async def holds_agent_release(
    store: Store, sha256: str, cached: Mapping[str, AgentReleaseRecord] | None = None
) -> bool:
    """Whether ``sha256`` is the file of a release the hub holds: in ``cached`` (the cache's,
    which the AgentUpgrade controller refreshes), else in the store (one bounded range read:
    a release pushed since). Any enrolled device may fetch a release's bytes (FetchArtifact):
    releases are not secret, and a device verifies one against the TUF agent delegation
    before it fetches a byte."""
    if cached is not None and any(r.sha256 == sha256 for r in cached.values()):
        return True
    return any(r.sha256 == sha256 for r in await agent_releases(store))


async def put_agent_release(
    store: Store, record: AgentReleaseRecord, *, with_ops: Sequence[Put] = ()
) -> bool:
    """Write ``record`` (and ``with_ops``, its event, in the same transaction) unless its
    release and platform are held already: True when written; False when the same bytes are
    held (nothing written). ``CompareFailed`` when other bytes are held or another push wrote
    it meanwhile: releases are immutable."""
    kv = await store.get(record.key)
    if kv is not None:
        held = _record(kv.value, record.key)
        if held.sha256 == record.sha256 and held.length == record.length:
            return False
        raise CompareFailed(record.key, 0, kv.mod_revision)
    put = Put(record.key, storekeys.dumps(record.to_json()))
    await store.txn([Compare(record.key, 0)], [put, *with_ops])
    return True


class ReleaseContent:
    """A blob-store verifier: the staged tarball is a safe release whose ``release.json``
    says what the signed metadata says (version, platform, requirements)."""

    def __init__(self, meta: AgentReleaseMetadata) -> None:
        self._meta = meta

    def verify(self, staged: StagedArtifact) -> None:
        meta = self._meta
        manifest = agentreleases.inspect_release(staged.path, what=f"{meta.what}: the pushed file")
        if manifest.version != meta.version:
            raise ArtifactError(
                "VersionMismatch",
                f"{meta.what}: the pushed file's release.json says version {manifest.version}",
            )
        if manifest.platform != meta.platform:
            raise ArtifactError(
                "PlatformMismatch",
                f"{meta.what}: the pushed file's release.json is for {manifest.platform}",
            )
        if dict(manifest.requires) != dict(meta.requires):
            raise ArtifactError(
                "RequirementsMismatch",
                f"{meta.what}: the pushed file's release.json requires other versions than "
                "its signed metadata",
            )
