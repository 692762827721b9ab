"""TUF metadata through the hierarchy (``hub.state.tufrelay``): a regional hub checks the root
hub's TUF files as a device would, serves them byte for byte, refuses a set that does not
check out and keeps the last good one; a device under the region verifies what the region
serves as it would the root's.

Real keys, a real root repository (``hub.state.tufrepo``), python-tuf's real client on the region
and on the device (``edged.trust.tufclient``). The gRPC path (root -> region -> edged) is
``tests/e2e/test_federation_tuf.py``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from trusttesting import Key, make_root
from tuftesting import DAY, Hub, artifact, refused

from edged.trust.tufclient import TufClient
from edgefleet.errors import TrustError
from edgefleet.trust import tufmeta
from hub.state import tufrelay
from hub.state.tufrelay import RelayedTuf, adopt, check_set, digest_files, set_message
from hub.state.tufrepo import TufRepository, create_repository


@pytest.fixture(name="hub")
def root_repository(tmp_path: Path, keys: dict[str, Key]) -> Hub:
    """The root hub's repository, as in test_tuf.py: a fleet root (root key root1), a TUF
    root signed by the same key, targets key newroot1, publisher pub1 for ``vision-*``."""
    from edgefleet.trust.documents import parse_root
    from edgefleet.trust.envelopes import ROOT_TYPE, decode_payload

    fleet = parse_root(
        decode_payload(
            make_root(keys, expires=time.time() + 365 * DAY), expected_type=ROOT_TYPE, what="r"
        )
    )
    create_repository(
        tmp_path,
        root_keys=[keys["root1"].key_file],
        targets_key=keys["newroot1"].key_file,
        delegations=[tufmeta.Delegation("vision", (keys["pub1"].raw,), 1, ("vision-*",))],
        now=time.time(),
        root_lifetime_s=365 * DAY,
        targets_lifetime_s=365 * DAY,
    )
    return Hub(tmp_path, keys, fleet, TufRepository(tmp_path / "tuf"))


def region_adopts(region: Path, hub: Hub, files: dict[str, bytes] | None = None) -> RelayedTuf:
    if files is None:
        files, _ = hub.repo.files()
    return adopt(region, files, digest_files(files), hub.fleet_root)


def device_refresh(tmp: Path, relayed: RelayedTuf, hub: Hub, name: str = "dev") -> Any:
    def fetch(fname: str, max_length: int) -> bytes | None:
        return relayed.read(fname)

    return TufClient(tmp / name).refresh(fetch, hub.fleet_root)


def signed_by(data: bytes, kind: Any, key: Key, change: Any = None) -> bytes:
    signed, _ = tufmeta.parse(data, kind, what="x")
    if change is not None:
        change(signed)
    return tufmeta.sign(signed, [tufmeta.tuf_signer(key.key_file)])


def test_a_device_under_a_region_verifies_the_roots_metadata_served_unchanged(
    hub: Hub, tmp_path: Path
) -> None:
    meta = artifact("vision-det", "1.0.0")
    hub.publish("pub1", "vision", meta)
    region = tmp_path / "region"
    relayed = region_adopts(region, hub)
    files, digest = hub.repo.files()
    assert relayed.digest == digest
    for name, data in files.items():  # byte for byte: the region signs nothing
        assert relayed.read(name) == data
        assert (region / "tuf-relay" / "current" / "files" / name).read_bytes() == data
    assert RelayedTuf.load(region) == relayed  # what a restarted region serves
    updater = device_refresh(tmp_path, relayed, hub)
    TufClient.check(updater, meta)
    refused("NotInTargets", TufClient.check, updater, artifact("vision-det", "9.9.9"))

    # a push at the root: a new delegated targets, snapshot and timestamp reach the region
    meta2 = artifact("vision-det", "2.0.0", b"v2")
    hub.publish("pub1", "vision", meta2)
    relayed2 = region_adopts(region, hub)
    assert relayed2.digest != relayed.digest
    assert relayed2.versions()["snapshot"] == relayed.versions()["snapshot"] + 1
    TufClient.check(device_refresh(tmp_path, relayed2, hub), meta2)
    # the same set again changes nothing; only one set is kept on disk
    assert region_adopts(region, hub) == relayed2
    assert len(list((region / "tuf-relay").glob("set-*"))) == 1


def test_the_root_signs_its_timestamp_again_for_its_regions(hub: Hub, tmp_path: Path) -> None:
    now = [time.time()]
    hub.reload(clock=lambda: now[0], timestamp_lifetime_s=60.0)
    files, digest = hub.repo.files()
    assert hub.repo.files()[1] == digest  # nothing due: the same set
    now[0] += 3600.0 - 29.0  # the one signed at start (an hour's life) is due again
    files2, digest2 = hub.repo.files()
    assert digest2 != digest and files2["snapshot.json"] == files["snapshot.json"]
    region_adopts(tmp_path / "region", hub, files)
    assert region_adopts(tmp_path / "region", hub, files2).versions()["timestamp"] == 2


def refused_by_region(
    reason: str | tuple[str, ...], region: Path, hub: Hub, files: dict[str, bytes]
) -> None:
    held = RelayedTuf.load(region)
    with pytest.raises(TrustError) as info:
        region_adopts(region, hub, files)
    reasons = (reason,) if isinstance(reason, str) else reason
    assert info.value.reason in reasons, str(info.value)
    assert RelayedTuf.load(region) == held  # the last good set is still served
    assert not list((region / "tuf-relay").glob(".*.new"))


def test_a_region_refuses_metadata_that_does_not_verify_and_keeps_the_last_good(
    hub: Hub, tmp_path: Path, keys: dict[str, Key]
) -> None:
    from tuf.api.metadata import Root as TufRoot
    from tuf.api.metadata import Targets, Timestamp

    meta = artifact("vision-det", "1.0.0")
    hub.publish("pub1", "vision", meta)
    old, _ = hub.repo.files()
    old = dict(old)
    hub.publish("pub1", "vision", artifact("vision-det", "2.0.0", b"v2"))
    region = tmp_path / "region"
    good, _ = hub.repo.files()
    region_adopts(region, hub)

    # a forged target in the publisher's targets, signed with a key of the attacker's
    forged = artifact("vision-det", "6.6.6", b"evil")

    def add_forged(t: Any) -> None:
        t.targets.update(tufmeta.artifact_targets(forged))

    refused_by_region(
        "SignatureThresholdNotMet",
        region,
        hub,
        {
            **good,
            "vision.json": signed_by(good["vision.json"], Targets, keys["stranger"], add_forged),
        },
    )
    # a timestamp signed by another key; an older set (rollback); a root the fleet root did not
    # sign, to a region holding none yet; a delegated role the snapshot does not list
    refused_by_region(
        "TufSignatureThresholdNotMet",
        region,
        hub,
        {**good, "timestamp.json": signed_by(good["timestamp.json"], Timestamp, keys["stranger"])},
    )
    refused_by_region("TufRollback", region, hub, old)
    fresh = tmp_path / "fresh"
    refused_by_region(
        ("UnknownKey", "SignatureThresholdNotMet"),
        fresh,
        hub,
        {**good, "root.json": signed_by(good["root.json"], TufRoot, keys["stranger"])},
    )
    assert RelayedTuf.load(fresh) is None
    refused_by_region(
        "TufMetadataMismatch", region, hub, {**good, "audio.json": good["vision.json"]}
    )
    # the same timestamp version with other bytes (re-signed by the online key: a
    # compromised root's only power) is not served in place of the one checked
    refused_by_region(
        "TufRollback",
        region,
        hub,
        {**good, "timestamp.json": tufmeta.sign(
            tufmeta.parse(good["timestamp.json"], Timestamp, what="t")[0],
            [hub.online_signer()],
        ) + b" "},
    )  # fmt: skip
    # after all that, the region still serves the good set, and a device verifies it
    relayed = RelayedTuf.load(region)
    assert relayed is not None and relayed.read("vision.json") == good["vision.json"]
    TufClient.check(device_refresh(tmp_path, relayed, hub), meta)


def test_a_device_refuses_a_compromised_region_that_changes_the_metadata(
    hub: Hub, tmp_path: Path, keys: dict[str, Key]
) -> None:
    """What the region's own check cannot stop, its devices do: a region that serves other
    bytes than the root's (here a snapshot and timestamp of its own, listing forged targets)."""
    from tuf.api.metadata import MetaFile, Snapshot, Targets, Timestamp

    hub.publish("pub1", "vision", artifact("vision-det", "1.0.0"))
    relayed = region_adopts(tmp_path / "region", hub)
    device_refresh(tmp_path, relayed, hub)  # the device holds the root's metadata
    forged = artifact("vision-det", "6.6.6", b"evil")
    files = dict(relayed.files_by_name)

    def bump(t: Any) -> None:
        t.version += 1
        t.targets.update(tufmeta.artifact_targets(forged))

    files["vision.json"] = signed_by(files["vision.json"], Targets, keys["stranger"], bump)
    snap, _ = tufmeta.parse(files["snapshot.json"], Snapshot, what="s")
    snap.version += 1
    snap.meta["vision.json"] = MetaFile(snap.meta["vision.json"].version + 1)
    files["snapshot.json"] = tufmeta.sign(snap, [tufmeta.tuf_signer(keys["stranger"].key_file)])
    ts, _ = tufmeta.parse(files["timestamp.json"], Timestamp, what="t")
    ts.version += 1
    ts.snapshot_meta = MetaFile(snap.version)
    files["timestamp.json"] = tufmeta.sign(ts, [tufmeta.tuf_signer(keys["stranger"].key_file)])
    compromised = RelayedTuf(files, digest_files(files))
    refused("TufSignatureThresholdNotMet", device_refresh, tmp_path, compromised, hub)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda f: f.update({"../x.json": b"{}"}), "is not a TUF metadata file"),
        (lambda f: f.update({"notes.txt": b""}), "is not a TUF metadata file"),
        (lambda f: f.pop("snapshot.json"), "snapshot.json missing"),
        (lambda f: f.update({"timestamp.json": b"x" * (16 * 1024 + 1)}), "at most 16384"),
    ],
)
def test_the_shape_of_a_set_is_checked_before_its_signatures(
    hub: Hub, change: Any, problem: str
) -> None:
    files, _ = hub.repo.files()
    files = dict(files)
    change(files)
    problems = check_set(set_message(files, digest_files(files)))
    assert any(problem in p for p in problems), problems
    good, digest = hub.repo.files()
    assert check_set(set_message(good, digest)) == []
    assert check_set(set_message(good, "0" * 64)) == ["tuf.digest: not the digest of the files"]
    message = set_message(good, digest)
    message.files.append(message.files[0])
    assert any("twice" in p for p in check_set(message))
    assert tufrelay.MAX_SET_BYTES < 4 * 1024 * 1024


def test_a_regional_hub_cannot_add_targets(hub: Hub, tmp_path: Path) -> None:
    relayed = region_adopts(tmp_path / "region", hub)
    meta = artifact("vision-det", "1.0.0")
    refused("TufRelayed", relayed.check_delegated, "vision", b"", meta, now=time.time() + DAY)


def test_a_regional_hub_keeps_no_repository_of_its_own(hub: Hub, tmp_path: Path) -> None:
    from edgefleet.errors import HubDirError
    from hub.wiring import _tuf_of

    region = tmp_path / "region"
    region.mkdir()
    (region / "parent.json").write_text("{}")
    assert _tuf_of(region, signing=True) is None  # nothing relayed yet
    relayed = region_adopts(region, hub)
    assert _tuf_of(region, signing=True) == relayed  # the last set, after a restart
    # a region's own [tuf] lifetimes would change nothing its devices see: refused
    from hub.config import parse_config

    assert _tuf_of(region, signing=True, config=parse_config({})) == relayed
    with pytest.raises(HubDirError, match="tuf: a regional hub serves its root hub's"):
        _tuf_of(region, signing=True, config=parse_config({"tuf": {"timestampLifetime": "24h"}}))
    shutil.copytree(hub.data / "tuf", region / "tuf")
    with pytest.raises(HubDirError, match="keeps no repository of its own"):
        _tuf_of(region, signing=True)


@pytest.mark.parametrize(("lifetime", "outcome"), [(3600.0, "TufMetadataExpired"), (DAY, None)])
def test_a_region_cut_off_from_its_root_lasts_as_long_as_the_roots_timestamp(
    hub: Hub, tmp_path: Path, lifetime: float, outcome: str | None
) -> None:
    """The root signs its last timestamp, then is unreachable for two hours (its clock put
    back: python-tuf on the region and the device reads the real time). With the default
    hour the relayed set has expired and a device under the region refuses a new artifact;
    with ``[tuf] timestampLifetime = "24h"`` at the root the region still checks and serves
    the same bytes and its device verifies the artifact (to heal or reschedule onto it)."""
    cut_off_at = time.time() - 2 * 3600.0
    hub.reload(clock=lambda: cut_off_at, timestamp_lifetime_s=lifetime)
    meta = artifact("vision-det", "1.0.0")
    hub.publish("pub1", "vision", meta)  # the last push before the link went down
    files, digest = hub.repo.files()
    if outcome is None:
        relayed = region_adopts(tmp_path / "region", hub, files)
        assert relayed.digest == digest  # relayed unchanged: the root's lifetime is the one
        TufClient.check(device_refresh(tmp_path, relayed, hub), meta)
    else:
        refused_by_region(outcome, tmp_path / "region", hub, files)
        refused(outcome, device_refresh, tmp_path, RelayedTuf(files, digest), hub)


def test_the_tuf_lifetimes_are_the_hubs_tuf_settings(hub: Hub, tmp_path: Path) -> None:
    from tuf.api.metadata import Snapshot, Timestamp

    from hub.config import parse_config
    from hub.wiring import _tuf_of

    config = parse_config({"tuf": {"timestampLifetime": "24h", "snapshotLifetime": "720h"}})
    repo = _tuf_of(hub.data, signing=True, config=config)
    assert isinstance(repo, TufRepository)
    meta = artifact("vision-det", "1.0.0")
    hub.repo = repo
    hub.publish("pub1", "vision", meta)  # signs a new snapshot and timestamp
    now = time.time()
    ts, _ = tufmeta.parse(repo.read("timestamp.json") or b"", Timestamp, what="t")
    snap, _ = tufmeta.parse(repo.read("snapshot.json") or b"", Snapshot, what="s")
    assert abs(ts.expires.timestamp() - (now + DAY)) < 60
    assert abs(snap.expires.timestamp() - (now + 30 * DAY)) < 60
