"""TUF roles through python-tuf: the hub's repository (``hub.state.tufrepo``) and the device's
client (``edged.trust.tufclient``: python-tuf's ``Updater`` with the project's fetcher).

Real keys, real files, the real repository code of the hub and python-tuf's real client. A
compromised hub is played by serving other bytes for some files (``Hub.served``), made with
the hub's own online key where a compromised hub would have it. python-tuf checks expiry
against the real clock, so times here are real (``time.time()``). The gRPC path is covered by
``tests/e2e/test_tuf_fleet.py``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from trusttesting import Key, make_root
from tuftesting import DAY, Hub, artifact, refused

from edged.trust.tufclient import TufClient
from edgefleet.errors import TrustError
from edgefleet.trust import tufmeta
from edgefleet.trust.documents import ArtifactMetadata, parse_root
from edgefleet.trust.envelopes import ROOT_TYPE, decode_payload, key_id
from hub.state.tufrepo import TufRepository, create_repository


@pytest.fixture
def hub(tmp_path: Path, keys: dict[str, Key]) -> Hub:
    """A fleet root (root key root1), a TUF repository signed by the same root key, targets
    key newroot1, and two publishers: pub1 for ``vision-*``, pub2 for ``audio-*``."""
    fleet = parse_root(
        decode_payload(
            make_root(keys, expires=time.time() + 365 * DAY), expected_type=ROOT_TYPE, what="r"
        )
    )
    create_repository(
        tmp_path,
        root_keys=[keys["root1"].key_file],
        targets_key=keys["newroot1"].key_file,
        delegations=[
            tufmeta.Delegation("vision", (keys["pub1"].raw,), 1, ("vision-*",)),
            tufmeta.Delegation("audio", (keys["pub2"].raw,), 1, ("audio-*",)),
        ],
        now=time.time(),
        root_lifetime_s=365 * DAY,
        targets_lifetime_s=365 * DAY,
    )
    return Hub(tmp_path, keys, fleet, TufRepository(tmp_path / "tuf"))


def device(tmp: Path, hub: Hub, name: str = "dev") -> tuple[TufClient, Any]:
    client = TufClient(tmp / name)
    return client, client.refresh(hub.fetch, hub.fleet_root)


def test_a_published_artifact_is_admitted_and_a_sync_fetches_only_the_timestamp(
    hub: Hub, tmp_path: Path
) -> None:
    meta = artifact("vision-det", "1.0.0")
    hub.publish("pub1", "vision", meta)
    client, updater = device(tmp_path, hub)
    TufClient.check(updater, meta)
    assert client.active and (client.dir / "root.json").exists()
    # nothing changed: the next sync reads the timestamp (and asks for a newer root) only
    hub.fetched.clear()
    TufClient.check(client.refresh(hub.fetch, hub.fleet_root), meta)
    assert hub.fetched == ["2.root.json", "timestamp.json"]
    # other bytes than signed, or a file the publisher did not list: refused
    refused("TargetMismatch", TufClient.check, updater, artifact("vision-det", "1.0.0", b"evil"))
    refused("NotInTargets", TufClient.check, updater, artifact("vision-det", "9.9.9"))


def test_the_hub_cannot_author_targets(hub: Hub, tmp_path: Path, keys: dict[str, Key]) -> None:
    """A compromised hub holds the online key: it signs top-level targets listing its own
    model, or a publisher's targets with its model added; devices refuse both."""
    from tuf.api.metadata import Targets

    mine = artifact("vision-det", "6.6.6", b"the hub's own model")
    own = Targets(version=2, expires=tufmeta._expiry(time.time() + DAY))
    own.targets.update(tufmeta.artifact_targets(mine))
    hub.served["targets.json"] = tufmeta.sign(own, [hub.online_signer()])
    hub.forge_snapshot({"targets.json": 2})
    refused("TufSignatureThresholdNotMet", device, tmp_path, hub)

    # the publisher's role, re-signed by the hub with its model added
    hub.served.clear()
    hub.publish("pub1", "vision", artifact("vision-det", "1.0.0"))
    deleg, _ = tufmeta.parse(hub.repo.read("vision.json") or b"", Targets, what="v")
    deleg.version += 1
    deleg.targets.update(tufmeta.artifact_targets(mine))
    hub.served["vision.json"] = tufmeta.sign(deleg, [hub.online_signer()])
    hub.forge_snapshot({"targets.json": 1, "vision.json": deleg.version})
    _, updater = device(tmp_path, hub, "dev2")
    refused("TufSignatureThresholdNotMet", TufClient.check, updater, mine)
    # and the hub's own check refuses such targets at push
    refused(
        "SignatureThresholdNotMet",
        hub.repo.check_delegated,
        "vision",
        hub.served["vision.json"],
        mine,
        now=time.time(),
    )


def test_a_publisher_signs_only_the_model_names_delegated_to_it(hub: Hub, tmp_path: Path) -> None:
    audio = artifact("audio-x", "1.0.0")
    # pub1 (vision-*) lists audio-x in its own role: the hub refuses it at push
    data = tufmeta.add_artifact(
        None, audio, [tufmeta.tuf_signer(hub.keys["pub1"].key_file)], expires=time.time() + DAY
    )
    refused("PathNotDelegated", hub.repo.check_delegated, "vision", data, audio, now=time.time())
    # ... or signs the audio role: not its key
    refused(
        "SignatureThresholdNotMet", hub.repo.check_delegated, "audio", data, audio, now=time.time()
    )
    refused(
        "NoDelegation",
        tufmeta.find_role,
        hub.repo.read("targets.json"),
        hub.keys["pub1"].raw,
        "audio-x",
    )
    assert (
        tufmeta.find_role(hub.repo.read("targets.json") or b"", hub.keys["pub1"].raw, "vision-a")
        == "vision"
    )
    # a compromised hub serves it anyway: python-tuf looks audio-x up in the audio role only
    hub.publish("pub2", "audio", artifact("audio-y", "1.0.0"))
    hub.served["vision.json"] = data
    hub.forge_snapshot({"targets.json": 1, "vision.json": 1, "audio.json": 1})
    _, updater = device(tmp_path, hub)
    refused("NotInTargets", TufClient.check, updater, audio)
    # a role delegated but never published (not in the snapshot) admits nothing either
    hub.served.clear()
    del hub.repo._delegated["audio"], hub.repo._versions["audio"]
    hub.repo._refresh(force=True)
    _, updater = device(tmp_path, hub, "dev3")
    refused("TufRefused", TufClient.check, updater, audio)
    # pub2 may
    hub.publish("pub2", "audio", audio)
    _, updater = device(tmp_path, hub, "dev2")
    TufClient.check(updater, audio)


def test_rollback_of_timestamp_and_snapshot_is_refused(hub: Hub, tmp_path: Path) -> None:
    old_ts = hub.repo.read("timestamp.json")
    old_snap = hub.repo.read("snapshot.json")
    hub.publish("pub1", "vision", artifact("vision-det", "1.0.0"))
    client, _ = device(tmp_path, hub)
    hub.served["timestamp.json"] = old_ts
    refused("TufRollback", client.refresh, hub.fetch, hub.fleet_root)
    assert client.problem is not None and client.problem[0] == "TufRollback"
    hub.served["snapshot.json"] = old_snap
    refused("TufRollback", client.refresh, hub.fetch, hub.fleet_root)


def test_a_frozen_timestamp_is_refused_within_its_short_lifetime(hub: Hub, tmp_path: Path) -> None:
    """The hub signs timestamps valid for minutes; one signed two hours ago is stale."""
    hub.reload(clock=lambda: time.time() - 7200, timestamp_lifetime_s=600)
    hub.repo._refresh(force=True)
    refused("TufMetadataExpired", device, tmp_path, hub)
    hub.reload()  # the hub signs a fresh one when half its lifetime has passed
    device(tmp_path, hub)


def test_mix_and_match_is_refused(hub: Hub, tmp_path: Path) -> None:
    """A hub that serves the publisher's older targets (withholding a newer version, or
    bringing back a revoked one) needs a snapshot listing the older version: refused."""
    first = hub.publish("pub1", "vision", artifact("vision-det", "1.0.0"))
    hub.publish("pub1", "vision", artifact("vision-det", "2.0.0"))
    client, updater = device(tmp_path, hub)
    TufClient.check(updater, artifact("vision-det", "2.0.0"))
    hub.served["vision.json"] = first
    hub.forge_snapshot({"targets.json": 1, "vision.json": 1})
    refused("TufRollback", client.refresh, hub.fetch, hub.fleet_root)
    # the old file under the current snapshot: its version is not the one the snapshot names
    hub.served.clear()
    hub.served["vision.json"] = first
    _, updater = device(tmp_path, hub, "dev2")
    refused("TufRollback", TufClient.check, updater, artifact("vision-det", "1.0.0"))


def test_a_revoked_version_is_refused(hub: Hub, tmp_path: Path) -> None:
    """The snapshot is the signed current set: a version the publisher dropped from its
    targets is refused although its own metadata is still valid."""
    from tuf.api.metadata import Targets

    bad = artifact("vision-det", "1.0.0")
    hub.publish("pub1", "vision", bad)
    client, updater = device(tmp_path, hub)
    TufClient.check(updater, bad)
    current, _ = tufmeta.parse(hub.repo.read("vision.json") or b"", Targets, what="v")
    current.version += 1
    current.targets.clear()
    current.targets.update(tufmeta.artifact_targets(artifact("vision-det", "1.0.1")))
    data = tufmeta.sign(current, [tufmeta.tuf_signer(hub.keys["pub1"].key_file)])
    hub.repo.store_delegated("vision", data, current.version)
    updater = client.refresh(hub.fetch, hub.fleet_root)
    refused("NotInTargets", TufClient.check, updater, bad)


def test_endless_data_stops_at_the_bound(hub: Hub, tmp_path: Path) -> None:
    hub.served["timestamp.json"] = b"{" * (tufmeta.TIMESTAMP_MAX_BYTES + 1)
    refused("LengthExceeded", device, tmp_path, hub)


def test_key_rotation_through_a_new_tuf_root(
    hub: Hub, tmp_path: Path, keys: dict[str, Key]
) -> None:
    """Root v2 (signed by the old and the new root keys) replaces the targets key; devices
    follow it, and targets signed by the old targets key are refused from then on."""
    from tuf.api.metadata import Root as TufRoot
    from tuf.api.metadata import Targets

    meta = artifact("vision-det", "1.0.0")
    hub.publish("pub1", "vision", meta)
    client, _ = device(tmp_path, hub)
    d = hub.data / "tuf"
    root, _ = tufmeta.parse(hub.repo.read("root.json") or b"", TufRoot, what="r")
    root.version = 2
    root.revoke_key(keys["newroot1"].raw and tufmeta.tuf_key(keys["newroot1"].raw).keyid, "targets")
    root.add_key(tufmeta.tuf_key(keys["newroot2"].raw), "targets")
    signed_root = tufmeta.sign(root, [tufmeta.tuf_signer(keys["root1"].key_file)])
    (d / "2.root.json").write_bytes(signed_root)
    (d / "root.json").write_bytes(signed_root)
    targets, _ = tufmeta.parse(hub.repo.read("targets.json") or b"", Targets, what="t")
    targets.version = 2
    old_signed = tufmeta.sign(targets, [tufmeta.tuf_signer(keys["newroot1"].key_file)])
    (d / "targets.json").write_bytes(
        tufmeta.sign(targets, [tufmeta.tuf_signer(keys["newroot2"].key_file)])
    )
    hub.reload()
    updater = client.refresh(hub.fetch, hub.fleet_root)
    TufClient.check(updater, meta)
    assert "2.root.json" in hub.fetched
    # a hub that keeps serving targets signed by the old targets key: refused
    fresh = TufClient(tmp_path / "dev-old")
    fresh.refresh(hub.fetch, hub.fleet_root)
    hub.served["targets.json"] = old_signed
    hub.forge_snapshot({"targets.json": 2, "vision.json": 1})
    refused("TufSignatureThresholdNotMet", device, tmp_path, hub, "dev3")


def test_the_first_tuf_root_needs_the_fleet_roots_keys(
    hub: Hub, tmp_path: Path, keys: dict[str, Key]
) -> None:
    from tuf.api.metadata import Root as TufRoot

    root, _ = tufmeta.parse(hub.repo.read("root.json") or b"", TufRoot, what="r")
    hub.served["root.json"] = tufmeta.sign(root, [tufmeta.tuf_signer(keys["stranger"].key_file)])
    with pytest.raises(TrustError) as info:
        device(tmp_path, hub)
    assert info.value.reason in ("UnknownKey", "SignatureThresholdNotMet")
    assert not (tmp_path / "dev" / "trust" / "tuf" / "root.json").exists()


def test_tuf_is_required_once_held_or_configured(hub: Hub, tmp_path: Path) -> None:
    hub.served["root.json"] = None  # a hub without a repository
    assert TufClient(tmp_path / "a").refresh(hub.fetch, hub.fleet_root) is None
    required = TufClient(tmp_path / "b", required=True)
    refused("NoTufRepository", required.refresh, hub.fetch, hub.fleet_root)
    hub.served.clear()
    client, _ = device(tmp_path, hub, "c")
    assert client.active  # held a TUF root: TUF stays required


def test_the_hub_refuses_older_or_expired_delegated_targets(hub: Hub) -> None:
    meta = artifact("vision-det", "1.0.0")
    first = hub.publish("pub1", "vision", meta)
    assert hub.repo.check_delegated("vision", first, meta, now=time.time()) == 0  # same again
    from tuf.api.metadata import Targets

    hub.publish("pub1", "vision", artifact("vision-det", "2.0.0"))
    refused("MetadataRollback", hub.repo.check_delegated, "vision", first, meta, now=time.time())
    signed, _ = tufmeta.parse(first, Targets, what="v")
    signed.version += 5
    signed.expires = tufmeta._expiry(time.time() - 10)
    expired = tufmeta.sign(signed, [tufmeta.tuf_signer(hub.keys["pub1"].key_file)])
    refused("MetadataExpired", hub.repo.check_delegated, "vision", expired, meta, now=time.time())
    refused("UnknownRole", hub.repo.check_delegated, "nobody", expired, meta, now=time.time())


def test_tuf_metadata_that_went_missing_is_detected(hub: Hub, tmp_path: Path) -> None:
    """The trust state records the TUF root version held: deleting ``D/trust/tuf/`` (which
    would reset the timestamp and snapshot rollback protection) is TrustStateLost."""
    import shutil

    from edgefleet.trust.verifying import TrustState

    client, _ = device(tmp_path, hub)
    version = client.root_version()
    assert version == 1
    state = TrustState(root_version=1, tuf_root_version=version)
    assert TrustState.from_json(state.to_json()) == state
    assert "tufRootVersion" not in TrustState().to_json()
    shutil.rmtree(client.dir)
    refused("TrustStateLost", client.refresh, hub.fetch, hub.fleet_root, floor=version)
    assert not client.dir.exists()


def test_the_publisher_role_that_lists_an_artifact_is_found(hub: Hub, tmp_path: Path) -> None:
    """Publishers per deployment check the keys of the role python-tuf took a target from."""
    vision, audio = artifact("vision-det", "1.0.0"), artifact("audio-asr", "1.0.0", b"asr")
    hub.publish("pub1", "vision", vision)
    hub.publish("pub2", "audio", audio)
    client, updater = device(tmp_path, hub)
    for meta, role, key in ((vision, "vision", "pub1"), (audio, "audio", "pub2")):
        TufClient.check(updater, meta)
        found = client.publisher_role(meta)
        assert (found.name, found.keyids, found.threshold) == (
            role,
            frozenset({key_id(hub.keys[key].raw)}),
            1,
        )
    refused("PublisherNotAllowed", client.publisher_role, artifact("vision-det", "9.0.0"))


def test_a_rollback_allowance_in_the_targets_is_bound_to_the_digest(
    hub: Hub, tmp_path: Path
) -> None:
    """An allowance as a custom field of the publisher's model target lets exactly those
    bytes in again after a higher version; one naming another digest, an expired one, or
    none at all is refused."""
    from tuf.api.metadata import Targets

    from edgefleet.trust.verifying import Accepted, TrustState, check_model_version

    old = artifact("vision-det", "1.0.0", b"v1")
    hub.publish("pub1", "vision", old, rollback=time.time() + DAY)
    client, updater = device(tmp_path, hub)
    path = "vision-det/1.0.0/model.onnx"
    grant = tufmeta.rollback_grant(updater.get_targetinfo(path), what=path)
    assert grant is not None and grant.sha256 == old.files["model.onnx"].sha256
    state = TrustState(artifacts={"vision-det": Accepted(1, "2.0.0")})
    root, now = hub.fleet_root, time.time()

    def check(meta: ArtifactMetadata, g: Any) -> None:
        check_model_version(meta, state=state, root=root, allowance=None, now=now, grant=g)

    check(old, grant)
    refused("RollbackAllowanceMismatch", check, artifact("vision-det", "1.0.0", b"other"), grant)
    refused("RollbackAllowanceExpired", lambda: check_model_version(
        old, state=state, root=root, allowance=None, now=grant.expires, grant=grant))  # fmt: skip
    refused("ModelVersionRollback", check, old, None)

    # the publisher's targets carry an allowance naming other bytes than the target lists
    held, _ = tufmeta.parse(hub.repo.read("vision.json") or b"", Targets, what="vision")
    custom = held.targets[path].unrecognized_fields["custom"]["edgefleet"]
    custom["rollbackAllowance"]["sha256"] = "0" * 64
    held.version += 1
    data = tufmeta.sign(held, [tufmeta.tuf_signer(hub.keys["pub1"].key_file)])
    hub.repo.store_delegated("vision", data, hub.repo.check_delegated("vision", data, old, now=now))
    updater = client.refresh(hub.fetch, hub.fleet_root)
    other = tufmeta.rollback_grant(updater.get_targetinfo(path), what=path)
    assert other is not None and other.sha256 == "0" * 64
    refused("RollbackAllowanceMismatch", check, old, other)
    # a custom field that is not an allowance
    bad = dict(custom, rollbackAllowance={"sha256": "0" * 64})
    target = held.targets[path]
    target.unrecognized_fields["custom"]["edgefleet"] = bad
    refused("MalformedMetadata", tufmeta.rollback_grant, target, what=path)


def test_a_publisher_cannot_re_sign_another_publishers_model(
    hub: Hub, tmp_path: Path, keys: dict[str, Key]
) -> None:
    """Issue 29, item 9: pub1 (``vision-*``) re-signs audio-x 1.0.0, audio's bytes that audio's
    targets list. Both keys are artifacts keys of the fleet root, and python-tuf finds the
    target, but the role that lists it is audio: the hub refuses the push (audio's own held
    targets given as the push's) and the device refuses the envelope."""
    from trusttesting import make_metadata

    from edgefleet.trust.documents import parse_artifact
    from edgefleet.trust.envelopes import ARTIFACT_TYPE
    from edgefleet.trust.publishers import check_signed_by_role

    model = tmp_path / "audio-x.onnx"
    model.write_bytes(b"audio's model")
    by_audio = make_metadata(keys, model, name="audio-x", version="1.0.0", signers=("pub2",))
    by_vision = make_metadata(keys, model, name="audio-x", version="1.0.0", signers=("pub1",))
    meta = parse_artifact(decode_payload(by_audio, expected_type=ARTIFACT_TYPE, what="m"))
    held = hub.publish("pub2", "audio", meta)
    now = time.time()
    refused(
        "SignerNotDelegated",
        hub.repo.check_delegated, "audio", held, meta, now=now, envelope=by_vision,
    )  # fmt: skip
    assert hub.repo.check_delegated("audio", held, meta, now=now, envelope=by_audio) == 0
    # held targets pushed again must list what is pushed
    other = artifact("audio-y", "1.0.0")
    refused("NotInTargets", hub.repo.check_delegated, "audio", held, other, now=now)

    client, updater = device(tmp_path, hub)
    TufClient.check(updater, meta)  # the bytes are listed: TUF alone lets it through
    role = client.publisher_role(meta)
    assert role.name == "audio" and set(role.keys) == {key_id(keys["pub2"].raw)}
    check_signed_by_role(by_audio, role, what="audio-x 1.0.0")
    error = refused("SignerNotDelegated", check_signed_by_role, by_vision, role, what="audio-x")
    assert "'audio'" in str(error)


def test_a_grant_for_a_name_outside_the_delegation_is_never_found(hub: Hub, tmp_path: Path) -> None:
    """pub1 lists audio-x with a rollback allowance in its own (vision) targets: the hub
    refuses it, and a compromised hub serving it gets no grant to the device (python-tuf
    looks audio-x up in the audio role only)."""
    from tuf.api.metadata import Targets

    audio = artifact("audio-x", "1.0.0")
    hub.publish("pub2", "audio", audio)
    mine = Targets(version=1, expires=tufmeta._expiry(time.time() + DAY))
    mine.targets.update(tufmeta.artifact_targets(audio, rollback_expires=time.time() + DAY))
    data = tufmeta.sign(mine, [tufmeta.tuf_signer(hub.keys["pub1"].key_file)])
    refused("PathNotDelegated", hub.repo.check_delegated, "vision", data, audio, now=time.time())
    hub.served["vision.json"] = data
    hub.forge_snapshot({"targets.json": 1, "vision.json": 1, "audio.json": 1})
    _, updater = device(tmp_path, hub)
    path = tufmeta.target_path("audio-x", "1.0.0", "model.onnx")
    assert tufmeta.rollback_grant(updater.get_targetinfo(path), what=path) is None


class Killed(BaseException):
    """A kill -9 at that instant: nothing after it runs (no except, no finally that could
    mend what was half done)."""


def test_a_refresh_killed_while_it_links_the_root_leaves_root_json(
    hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """python-tuf removes ``root.json`` and then links it again at every refresh; edged
    killed between the two held no TUF root and refused every artifact (TrustStateLost) until
    an operator reset its trust: seed 62's 1-hour soak run, dev-1 (docs/soak.md). The link
    is now renamed over it: killed at the link, the old one stays."""
    import os

    client, _ = device(tmp_path, hub)
    assert (client.dir / "root.json").is_symlink()

    def killed(*args: Any, **kwargs: Any) -> None:
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(os, "symlink", killed)
        with pytest.raises(Killed):
            client.refresh(hub.fetch, hub.fleet_root, floor=1)
    assert (client.dir / "root.json").exists()
    assert client.root_version() == 1
    meta = publish(hub)
    TufClient.check(client.refresh(hub.fetch, hub.fleet_root, floor=1), meta)


def test_a_cache_left_without_root_json_gets_its_newest_verified_root_back(
    hub: Hub, tmp_path: Path
) -> None:
    """A device that an earlier release left without ``root.json`` (the gap above) links
    it again to the newest root python-tuf verified and kept in ``root_history/``; with
    neither, its rollback protection is gone: TrustStateLost, as before."""
    client, _ = device(tmp_path, hub)
    link = client.dir / "root.json"
    link.unlink()
    meta = publish(hub)
    TufClient.check(client.refresh(hub.fetch, hub.fleet_root, floor=1), meta)
    assert link.is_symlink() and client.root_version() == 1
    # dangling (pointing at a root the cache does not hold), or a torn newer file beside it
    link.unlink()
    link.symlink_to("root_history/7.root.json")
    (client.dir / "root_history" / "9.root.json").write_bytes(b'{"payload": "')
    # a root filed under another version's name (copied there, by hand or by an attacker
    # who can write the cache) is not taken for that version
    history = client.dir / "root_history"
    (history / "5.root.json").write_bytes((history / "1.root.json").read_bytes())
    client.refresh(hub.fetch, hub.fleet_root, floor=1)
    assert link.resolve().name == "1.root.json"
    # nothing to restore from
    link.unlink()
    for p in (client.dir / "root_history").iterdir():
        p.unlink()
    refused("TrustStateLost", client.refresh, hub.fetch, hub.fleet_root, floor=1)


def test_the_tuf_cache_is_written_with_fsync_and_rename(
    hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """python-tuf writes its cache without fsync (a power cut may leave a renamed file
    empty); every file goes through write_atomic (temp file, fsync, rename, fsync of the
    directory) instead."""
    from edgefleet.trust import tufcache

    written: list[str] = []
    real = tufcache.write_atomic

    def spy(path: Path, data: bytes, *, mode: int = 0o600) -> None:
        written.append(str(path.relative_to(tmp_path / "dev" / "trust" / "tuf")))
        real(path, data, mode=mode)

    monkeypatch.setattr(tufcache, "write_atomic", spy)
    device(tmp_path, hub)
    assert {"root_history/1.root.json", "timestamp.json", "snapshot.json", "targets.json"} <= set(
        written
    )


def publish(hub: Hub) -> Any:
    meta = artifact("vision-det", "1.0.0")
    hub.publish("pub1", "vision", meta)
    return meta
