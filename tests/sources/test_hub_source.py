"""The hub source: desired states from the hub, verified before download, resumable.

Real keys, trust root, signed metadata, gate and store on disk; only the network is replaced by
an async generator over the artifact's bytes (the fleet scenarios in tests/e2e use the real
FetchArtifact stream).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import orjson
import pytest

from edged.hublink.downloading import Downloads
from edged.reconcile.model import RevisionPhase
from edged.sources.hub import HubSource
from edged.trust.admitting import ArtifactGate
from edgefleet.api import parse_manifest
from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.errors import TemporaryError
from edgefleet.trust.signing import create_root, generate_key_pair, sign_artifact


def deployment(version: str) -> bytes:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {"model": {"name": "det", "version": version}},
    }
    return orjson.dumps(parse_manifest(doc).to_dict())


class Hub:
    """A publisher key, a trust root, and signed models served by ``fetch``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        generate_key_pair(tmp / "pub")
        generate_key_pair(tmp / "stranger")
        create_root(
            root_keys=[tmp / "pub.key"], artifact_keys=[tmp / "pub.pub"], out=tmp / "root.json"
        )
        self.blobs: dict[str, bytes] = {}
        self.calls: list[tuple[str, int]] = []
        self.break_after: int | None = None
        self.extra = b""
        self.on_first_chunk: Callable[[], None] | None = None

    def model(
        self,
        version: str,
        *,
        key: str = "pub",
        seed: int = 1,
        sizes: tuple[int, ...] = TINY_MLP,
    ) -> tuple[bytes, str]:
        path = self.tmp / f"det-{version}-{key}.onnx"
        build_mlp(path, sizes, seed=seed)
        _, env = sign_artifact(
            path,
            name="det",
            version=version,
            keys=[self.tmp / f"{key}.key"],
            out=path.with_suffix(".meta"),
        )
        data = path.read_bytes()
        import hashlib

        sha = hashlib.sha256(data).hexdigest()
        self.blobs[sha] = data
        return env.to_bytes(), sha

    async def fetch(self, sha: str, offset: int) -> AsyncIterator[tuple[int, bytes]]:
        self.calls.append((sha, offset))
        data = self.blobs[sha] + self.extra
        pos = offset
        while pos < len(data):
            if self.break_after is not None and pos >= self.break_after:
                self.break_after = None
                raise TemporaryError("the stream broke")
            chunk = data[pos : pos + 4096]
            if self.on_first_chunk is not None:
                self.on_first_chunk()
                self.on_first_chunk = None
            yield pos, chunk
            pos += len(chunk)


@pytest.fixture
def env(tmp_path: Path) -> tuple[Hub, HubSource, Path]:
    hub = Hub(tmp_path)
    data = tmp_path / "device"
    gate = ArtifactGate(data, root_file=tmp_path / "root.json", allow_unsigned=False)
    return (
        hub,
        HubSource(data, ArtifactStore(data / "artifacts"), gate, Downloads(data / "downloads")),
        data,
    )


def apply(source: HubSource, hub: Hub, gen: int, manifests: list[bytes], meta: list[bytes]):  # type: ignore[no-untyped-def]
    return asyncio.run(source.apply(gen, manifests, meta, [], hub.fetch))


def test_accepts_persists_and_ignores_stale(env: tuple[Hub, HubSource, Path]) -> None:
    hub, source, data = env
    meta, sha = hub.model("1.0.0")
    r = apply(source, hub, 5, [deployment("1.0.0")], [meta])
    assert r.problems == () and not r.retry and r.generation == 5
    assert r.workloads["det"].sha256 == sha
    stale = apply(source, hub, 4, [], [])
    assert stale.stale and "det" in stale.workloads
    again = HubSource(
        data,
        ArtifactStore(data / "artifacts"),
        ArtifactGate(data, root_file=None, allow_unsigned=False),
        Downloads(data / "downloads"),
    )
    assert again.generation == 5 and again.workloads["det"].sha256 == sha


def test_unknown_key_refused_before_download_and_previous_version_kept(
    env: tuple[Hub, HubSource, Path],
) -> None:
    hub, source, _ = env
    meta1, sha1 = hub.model("1.0.0")
    apply(source, hub, 1, [deployment("1.0.0")], [meta1])
    meta2, _ = hub.model("2.0.0", key="stranger", seed=2)
    hub.calls.clear()
    r = apply(source, hub, 2, [deployment("2.0.0")], [meta2])
    assert [p.reason for p in r.problems] == ["UnknownKey"], r.problems
    assert hub.calls == []  # nothing fetched
    assert r.workloads["det"].sha256 == sha1  # 1.0.0 keeps serving


def test_a_broken_download_is_retried_and_resumes(env: tuple[Hub, HubSource, Path]) -> None:
    hub, source, data = env
    meta, sha = hub.model("1.0.0")
    hub.break_after = 20_000
    r = apply(source, hub, 1, [deployment("1.0.0")], [meta])
    assert r.retry and source.generation == 0  # not accepted yet
    assert (data / "downloads" / f"{sha}.part").stat().st_size >= 20_000
    r = apply(source, hub, 1, [deployment("1.0.0")], [meta])
    assert not r.retry and r.workloads["det"].sha256 == sha
    assert hub.calls[-1][1] >= 20_000  # resumed, not restarted
    assert not (data / "downloads" / f"{sha}.part").exists()


def test_more_bytes_than_signed_stop_at_the_limit(env: tuple[Hub, HubSource, Path]) -> None:
    hub, source, data = env
    meta, sha = hub.model("1.0.0")
    hub.extra = b"\0" * 100_000
    r = apply(source, hub, 1, [deployment("1.0.0")], [meta])
    assert [p.reason for p in r.problems] == ["LengthExceeded"]
    assert "det" not in r.workloads
    assert not ArtifactStore(data / "artifacts").has(sha)


def test_tampered_bytes_are_refused(env: tuple[Hub, HubSource, Path]) -> None:
    hub, source, data = env
    meta, sha = hub.model("1.0.0")
    good = hub.blobs[sha]
    hub.blobs[sha] = good[:-1] + bytes([good[-1] ^ 1])
    r = apply(source, hub, 1, [deployment("1.0.0")], [meta])
    assert [p.reason for p in r.problems] == ["DigestMismatch"]
    assert not ArtifactStore(data / "artifacts").has(sha)


def test_a_missing_artifact_is_fetched_again_on_request(env: tuple[Hub, HubSource, Path]) -> None:
    hub, source, data = env
    meta, sha = hub.model("1.0.0")
    apply(source, hub, 1, [deployment("1.0.0")], [meta])
    store = ArtifactStore(data / "artifacts")
    store.collect_garbage(set())  # the blob is gone (disk trouble, a hand)
    assert apply(source, hub, 1, [deployment("1.0.0")], [meta]).stale  # same state: nothing
    source.refetch_requested = True
    r = apply(source, hub, 1, [deployment("1.0.0")], [meta])
    assert not r.stale and store.has(sha)


def test_roots_from_the_hub_chain_from_the_device_root_or_are_refused(
    env: tuple[Hub, HubSource, Path],
) -> None:
    """After enrollment the hub still cannot make a root: a root of its own (same version,
    or a 'rotation' its key signed alone) is refused and reported, and a model signed with
    its key stays refused. A real rotation (old and new root keys) is followed before the
    state's artifacts are checked, so a model signed by the new publisher key is admitted."""
    from edgefleet.trust.signing import rotate_root, sign_root

    hub, source, data = env
    tmp = hub.tmp
    apply(source, hub, 1, [], [])  # takes the image root (version 1)
    own_v1 = create_root(root_keys=[tmp / "stranger.key"], artifact_keys=[tmp / "stranger.pub"])
    generate_key_pair(tmp / "root2")
    own_v2 = sign_root(
        rotate_root(
            tmp / "root.json",
            root_keys=[tmp / "stranger.key"],
            artifact_keys=[tmp / "stranger.pub"],
        ),
        [tmp / "stranger.key"],
    )
    meta, _ = hub.model("1.0.0", key="stranger")
    for gen, forged, reason in ((2, own_v1, "RootConflict"), (3, own_v2, "UnknownKey")):
        r = asyncio.run(
            source.apply(gen, [deployment("1.0.0")], [meta], [], hub.fetch, [forged.to_bytes()])
        )
        assert [p.reason for p in r.problems] == [reason, "UnknownKey"], r.problems
        assert source._gate.root is not None and source._gate.root.version == 1
    assert orjson.loads((data / "trust" / "state.json").read_bytes())["rootVersion"] == 1

    generate_key_pair(tmp / "pub2")
    v2 = sign_root(
        rotate_root(
            tmp / "root.json", root_keys=[tmp / "root2.key"], artifact_keys=[tmp / "pub2.pub"]
        ),
        [tmp / "pub.key"],  # the old root key (pub.key is root and publisher in this fixture)
    )
    v1 = (tmp / "root.json").read_bytes()
    meta2, sha2 = hub.model("2.0.0", key="pub2", seed=2)
    r = asyncio.run(
        source.apply(4, [deployment("2.0.0")], [meta2], [], hub.fetch, [v1, v2.to_bytes()])
    )
    assert r.problems == () and r.workloads["det"].sha256 == sha2
    assert source._gate.root is not None and source._gate.root.version == 2


def on_small_disk(hub: Hub, small_disk: Path) -> tuple[HubSource, Path]:
    data = small_disk / "device"
    gate = ArtifactGate(data, root_file=hub.tmp / "root.json", allow_unsigned=False)
    return HubSource(
        data, ArtifactStore(data / "artifacts"), gate, Downloads(data / "downloads")
    ), data


def test_a_model_larger_than_the_free_disk_is_refused_before_download(
    env: tuple[Hub, HubSource, Path], small_disk: Path
) -> None:
    hub, _, _ = env
    source, data = on_small_disk(hub, small_disk)
    meta1, sha1 = hub.model("1.0.0")
    assert apply(source, hub, 1, [deployment("1.0.0")], [meta1]).problems == ()
    meta2, sha2 = hub.model("2.0.0", seed=2, sizes=(512, 1024, 1024, 8))  # ~6 MB: x2 + reserve
    hub.calls.clear()
    r = apply(source, hub, 2, [deployment("2.0.0")], [meta2])
    (problem,) = r.problems
    size = len(hub.blobs[sha2])
    assert (problem.workload, problem.reason) == ("det", "InsufficientDisk")
    sizes = f"({size} to download, {size} for the store's copy)"
    assert f"needs {2 * size} bytes on the device's disk {sizes}" in problem.message
    assert hub.calls == []  # nothing fetched
    assert r.workloads["det"].sha256 == sha1  # 1.0.0 keeps serving
    assert list((data / "downloads").iterdir()) == []
    assert r.generation == 2 and not r.retry  # accepted: the link goes on


def test_a_disk_that_fills_during_the_download_leaves_no_part(
    env: tuple[Hub, HubSource, Path], small_disk: Path
) -> None:
    hub, _, _ = env
    source, data = on_small_disk(hub, small_disk)
    meta, sha = hub.model("1.0.0", sizes=(256, 512, 512, 8))  # ~1.5 MB: fits when checked
    filler = small_disk / "filler"

    def fill_the_disk() -> None:  # someone else takes the space after the check
        import shutil

        free = shutil.disk_usage(small_disk).free
        with open(filler, "wb") as f:
            f.write(b"\0" * (free - 64 * 1024))

    hub.on_first_chunk = fill_the_disk
    r = apply(source, hub, 1, [deployment("1.0.0")], [meta])
    (problem,) = r.problems
    assert (problem.workload, problem.reason) == ("det", "InsufficientDisk")
    assert "the disk filled up" in problem.message
    assert list((data / "downloads").iterdir()) == []  # not going to be resumed: removed
    filler.unlink()
    r = apply(source, hub, 2, [deployment("1.0.0")], [meta])  # the next state applies
    assert r.problems == () and r.workloads["det"].sha256 == sha


def test_incoming_revisions_say_how_far_they_got(env: tuple[Hub, HubSource, Path]) -> None:
    """What the hub asks for but the device does not run is kept with its phase and reason:
    a refusal stays Refused (with the gate's reason), a broken download stays Downloading, an
    accepted one leaves ``incoming``."""
    hub, source, _ = env
    meta1, _ = hub.model("1.0.0")
    apply(source, hub, 1, [deployment("1.0.0")], [meta1])
    assert source.incoming == {}
    meta2, _ = hub.model("2.0.0", key="stranger", seed=2)
    apply(source, hub, 2, [deployment("2.0.0")], [meta2])
    refused = source.incoming["det"]
    assert (refused.model_version, refused.phase.value, refused.reason) == (
        "2.0.0",
        "Refused",
        "UnknownKey",
    )
    assert refused.wanted and refused.message
    meta3, sha3 = hub.model("3.0.0", seed=3)
    hub.break_after = 20_000
    apply(source, hub, 3, [deployment("3.0.0")], [meta3])
    fetching = source.incoming["det"]
    assert (fetching.phase.value, fetching.sha256, fetching.reason) == (
        "Downloading",
        sha3,
        "ArtifactFetchFailed",
    )
    r = apply(source, hub, 3, [deployment("3.0.0")], [meta3])
    assert not r.retry and r.workloads["det"].sha256 == sha3
    assert source.incoming == {}
    apply(source, hub, 4, [], [])
    assert source.incoming == {}


def test_a_download_reports_its_progress_every_few_seconds(tmp_path: Path) -> None:
    """While Downloading, ``incoming`` carries the bytes on the device and the signed length,
    moved at most every PROGRESS_EVERY_S (the clock is the test's: one second per look), and
    kept where a broken download stopped (it resumes there)."""
    hub = Hub(tmp_path)
    data = tmp_path / "device"
    gate = ArtifactGate(data, root_file=tmp_path / "root.json", allow_unsigned=False)
    ticks = iter(range(1_000_000))
    source = HubSource(
        data,
        ArtifactStore(data / "artifacts"),
        gate,
        Downloads(data / "downloads"),
        clock=lambda: float(next(ticks)),
    )
    meta, sha = hub.model("1.0.0", sizes=(64, 256, 10))
    total = len(hub.blobs[sha])
    seen: list[tuple[str, int, int]] = []

    async def fetch(digest: str, offset: int) -> AsyncIterator[tuple[int, bytes]]:
        async for pos, chunk in hub.fetch(digest, offset):
            held = source.incoming["det"]
            seen.append((held.phase.value, held.bytes_done, held.bytes_total))
            yield pos, chunk

    hub.break_after = 40_000
    result = asyncio.run(source.apply(1, [deployment("1.0.0")], [meta], [], fetch))
    assert result.retry
    broken = source.incoming["det"]
    assert (broken.phase.value, broken.bytes_done, broken.bytes_total) == (
        "Downloading", 40_960, total,
    )  # fmt: skip
    assert broken.to_json()["download"] == {"bytesDone": 40_960, "bytesTotal": total}
    result = asyncio.run(source.apply(1, [deployment("1.0.0")], [meta], [], fetch))
    assert not result.retry and source.incoming == {}
    assert {phase for phase, _, _ in seen} == {"Downloading"}
    assert {t for _, _, t in seen} == {total}
    done = [d for _, d, _ in seen]
    assert done == sorted(done) and done[0] == 0 and done[-1] < total
    assert 1 < len(set(done)) < len(done)  # it moves, but not with every chunk


def _model_with_extra(hub: Hub, version: str, content: bytes) -> tuple[bytes, str, str]:
    import hashlib

    path = hub.tmp / f"det-{version}.onnx"
    build_mlp(path, TINY_MLP, seed=5)
    extra = hub.tmp / "validation.npz"
    extra.write_bytes(content)
    _, env = sign_artifact(
        path,
        name="det",
        version=version,
        keys=[hub.tmp / "pub.key"],
        extras=[extra],
        out=path.with_suffix(".meta"),
    )
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    extra_sha = hashlib.sha256(content).hexdigest()
    hub.blobs[sha] = path.read_bytes()
    hub.blobs[extra_sha] = content
    return env.to_bytes(), sha, extra_sha


def test_extras_are_fetched_verified_stored_and_persisted(env: tuple[Hub, HubSource, Path]) -> None:
    hub, source, data = env
    meta, sha, extra_sha = _model_with_extra(hub, "1.0.0", b"\x01" * 50_000)
    r = apply(source, hub, 1, [deployment("1.0.0")], [meta])
    assert r.problems == ()
    w = r.workloads["det"]
    assert (w.sha256, dict(w.extras)) == (sha, {"validation.npz": extra_sha})
    store = ArtifactStore(data / "artifacts")
    assert store.has(extra_sha) and store.path_for(extra_sha).read_bytes() == b"\x01" * 50_000
    assert {c[0] for c in hub.calls} == {sha, extra_sha}
    again = HubSource(
        data,
        ArtifactStore(data / "artifacts"),
        ArtifactGate(data, root_file=None, allow_unsigned=False),
        Downloads(data / "downloads"),
    )
    assert again.workloads["det"].extras == {"validation.npz": extra_sha}
    assert w.revision != w.__class__(w.deployment, w.sha256, w.source).revision


def test_a_tampered_extra_is_refused_and_the_model_not_accepted(
    env: tuple[Hub, HubSource, Path],
) -> None:
    hub, source, data = env
    meta, sha, extra_sha = _model_with_extra(hub, "1.0.0", b"\x01" * 50_000)
    hub.blobs[extra_sha] = b"\x02" * 50_000
    r = apply(source, hub, 1, [deployment("1.0.0")], [meta])
    assert [p.reason for p in r.problems] == ["DigestMismatch"]
    assert "validation.npz" in r.problems[0].message
    assert "det" not in r.workloads
    store = ArtifactStore(data / "artifacts")
    assert not store.has(extra_sha) and not store.has(sha)
    assert source.incoming["det"].phase.value == "Refused"


def test_going_back_to_the_previous_version_needs_no_download_and_no_allowance(
    env: tuple[Hub, HubSource, Path],
) -> None:
    """A rollout rolled back sends the device the metadata it accepted before: admitted
    although newer metadata and a newer version were accepted since, without a download.
    Anything older than that stays refused."""
    hub, source, data = env
    meta0, _ = hub.model("0.9.0", seed=9)
    meta1, sha1 = hub.model("1.0.0")
    meta2, sha2 = hub.model("2.0.0", seed=2)
    apply(source, hub, 1, [deployment("0.9.0")], [meta0])
    apply(source, hub, 2, [deployment("1.0.0")], [meta1])
    apply(source, hub, 3, [deployment("2.0.0")], [meta2])
    assert source.held == {sha1}  # kept by the garbage collector
    hub.calls.clear()
    back = apply(source, hub, 4, [deployment("1.0.0")], [meta1])
    assert back.problems == () and back.workloads["det"].sha256 == sha1
    assert hub.calls == []  # still in the store: nothing fetched
    assert source.held == {sha2}  # and forward again needs no download either
    again = HubSource(
        data,
        ArtifactStore(data / "artifacts"),
        ArtifactGate(data, root_file=None, allow_unsigned=False),
        Downloads(data / "downloads"),
    )
    assert again.held == {sha2}  # persisted
    # the same state again (a new generation): the running version stays, although newer
    # metadata was accepted since for 2.0.0
    same = apply(source, hub, 5, [deployment("1.0.0")], [meta1])
    assert same.problems == () and same.workloads["det"].sha256 == sha1
    older = apply(source, hub, 6, [deployment("0.9.0")], [meta0])
    (problem,) = older.problems  # signed in the same second: the model version check says no
    assert problem.reason in ("MetadataRollback", "ModelVersionRollback")


def test_baselines_in_the_hubs_state_are_accepted_and_survive_a_restart(
    env: tuple[Hub, HubSource, Path],
) -> None:
    hub, source, data = env
    meta, _ = hub.model("1.0.0")
    baseline = orjson.dumps(
        {"apiVersion": "edgefleet.io/v1", "kind": "SecurityBaseline",
         "metadata": {"name": "fleet"}, "spec": {"requireSandbox": True}}
    )  # fmt: skip
    r = apply(source, hub, 5, [deployment("1.0.0"), baseline], [meta])
    assert r.problems == ()  # a SecurityBaseline is part of a device's desired state now
    assert [b.name for b in source.baselines] == ["fleet"]
    assert source.baselines[0].spec.require_sandbox
    again = HubSource(
        data,
        ArtifactStore(data / "artifacts"),
        ArtifactGate(data, root_file=None, allow_unsigned=False),
        Downloads(data / "downloads"),
    )
    assert [b.name for b in again.baselines] == ["fleet"]
    apply(source, hub, 6, [deployment("1.0.0")], [meta])
    assert source.baselines == ()


def _baseline(publishers: list[dict[str, object]]) -> bytes:
    return orjson.dumps(
        {"apiVersion": "edgefleet.io/v1", "kind": "SecurityBaseline",
         "metadata": {"name": "pubs"}, "spec": {"publishers": publishers}}
    )  # fmt: skip


def test_a_publisher_not_allowed_for_the_deployment_is_refused_before_download(
    env: tuple[Hub, HubSource, Path],
) -> None:
    """Without TUF: the keys that signed the envelope must be allowed for the deployment by
    the baselines of the same desired state. Both keys here are in the trust root."""
    from edgefleet.trust.envelopes import key_id
    from edgefleet.trust.signing import load_public_key_raw

    hub, source, _ = env
    tmp = hub.tmp
    create_root(  # before the device read it: pub and stranger both sign artifacts
        root_keys=[tmp / "pub.key"],
        artifact_keys=[tmp / "pub.pub", tmp / "stranger.pub"],
        out=tmp / "root.json",
    )
    pub = key_id(load_public_key_raw(tmp / "pub.pub"))
    meta, sha = hub.model("1.0.0")
    others = _baseline([{"keys": [pub], "deployments": ["other-*"]}])
    r = apply(source, hub, 1, [deployment("1.0.0"), others], [meta])
    assert [p.reason for p in r.problems] == ["PublisherNotAllowed"], r.problems
    assert "no rule of SecurityBaseline pubs's spec.publishers covers deployment 'det'" in (
        r.problems[0].message
    )
    assert hub.calls == [] and "det" not in r.workloads  # never fetched, never loaded
    assert source.incoming["det"].reason == "PublisherNotAllowed"
    allowed = _baseline([{"keys": [pub], "deployments": ["det"]}])
    r = apply(source, hub, 2, [deployment("1.0.0"), allowed], [meta])
    assert r.problems == () and r.workloads["det"].sha256 == sha
    # 2.0.0 signed by a key the trust root trusts but the baseline does not allow for det:
    # refused before download, and 1.0.0 (still allowed) keeps serving
    meta2, _ = hub.model("2.0.0", key="stranger", seed=2)
    hub.calls.clear()
    r = apply(source, hub, 3, [deployment("2.0.0"), allowed], [meta2])
    assert [p.reason for p in r.problems] == ["PublisherNotAllowed"], r.problems
    assert "signed by key(s)" in r.problems[0].message and hub.calls == []
    assert r.workloads["det"].sha256 == sha
    # the baseline no longer allows 1.0.0's publisher either: it stops
    r = apply(source, hub, 4, [deployment("1.0.0"), others], [meta])
    assert [p.reason for p in r.problems] == ["PublisherNotAllowed"]
    assert "det" not in r.workloads


def test_a_deployment_requiring_a_tpm_is_not_run_by_a_software_attested_device(
    env: tuple[Hub, HubSource, Path],
) -> None:
    hub, source, data = env
    meta, sha = hub.model("1.0.0")
    doc = orjson.loads(deployment("1.0.0"))
    doc["spec"]["placement"] = {"requireTpm": True}
    tpm = orjson.dumps(doc)
    r = apply(source, hub, 1, [tpm], [meta])
    assert [p.reason for p in r.problems] == ["TpmRequired"]
    assert "software-attested" in r.problems[0].message and "det" not in r.workloads
    assert hub.calls == []
    (data / "identity").mkdir(parents=True, exist_ok=True)
    (data / "identity" / "ak.json").write_text("{}")  # an AK the hub bound at enrollment
    r = apply(source, hub, 2, [tpm], [meta])
    assert r.problems == () and r.workloads["det"].sha256 == sha


def test_an_expiry_judged_by_a_clock_ahead_is_retried_and_passes_once_it_is_corrected(
    tmp_path: Path,
) -> None:
    """A device whose clock is ahead (stepped, not synchronised yet) finds new metadata
    expired: the previous version serves, the revision is Verifying (not Refused, which the
    hub's rollouts count as broken), the state is not accepted but applied again later; once
    the clock is corrected it passes. Before the fix the refusal was accepted for good."""
    hub = Hub(tmp_path)
    data = tmp_path / "device"
    clock = [time.time()]
    gate = ArtifactGate(
        data, root_file=tmp_path / "root.json", allow_unsigned=False, clock=lambda: clock[0]
    )
    source = HubSource(data, ArtifactStore(data / "artifacts"), gate, Downloads(data / "downloads"))
    meta1, sha1 = hub.model("1.0.0")
    assert not apply(source, hub, 1, [deployment("1.0.0")], [meta1]).retry
    path = tmp_path / "det-2.onnx"
    build_mlp(path, TINY_MLP, seed=2)
    _, env2 = sign_artifact(path, name="det", version="2.0.0", keys=[tmp_path / "pub.key"],
                            expires_in_s=3600, out=path.with_suffix(".meta"))  # fmt: skip
    hub.blobs[hashlib.sha256(path.read_bytes()).hexdigest()] = path.read_bytes()
    clock[0] = time.time() + 3 * 3600  # the device's clock three hours ahead
    r = apply(source, hub, 2, [deployment("2.0.0")], [env2.to_bytes()])
    assert [p.reason for p in r.problems] == ["MetadataExpired"]
    assert r.retry and source.generation == 1  # not accepted: applied again later
    assert r.workloads["det"].sha256 == sha1  # 1.0.0 keeps serving
    revision = source.incoming["det"]
    assert (revision.phase, revision.reason) == (RevisionPhase.VERIFYING, "MetadataExpired")
    clock[0] = time.time()  # NTP steps it back
    r = apply(source, hub, 2, [deployment("2.0.0")], [env2.to_bytes()])
    assert not r.retry and r.problems == () and source.generation == 2
    assert r.workloads["det"].sha256 != sha1
