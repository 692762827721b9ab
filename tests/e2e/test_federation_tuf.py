"""TUF through the hierarchy end to end (docs/federation.md, "Trust through the hierarchy"):
a root hub with its TUF repository (``hub init`` makes one by default), a regional hub
enrolled with it, a real edged enrolled with the region; all real processes with real
certificates on loopback.

* a model pushed at the root (with its publisher's delegated targets) reaches the device
  under the region, which verifies it with python-tuf against the root's metadata: the
  region serves the root's files byte for byte and holds no TUF key;
* a root whose repository serves a timestamp its online key did not sign: the region
  refuses it (an event ``TufMetadataRefused`` with the reason) and keeps the last good one;
* a compromised region (the root away, the region's served TUF files replaced: a forged
  target in the publisher's targets, a snapshot and timestamp signed by a key of its own,
  and a forged artifact and deployment in its store) is refused by its device with a reason,
  and the device keeps serving what it verified.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from federationtesting import SLACK, forge_into_region, served_files, serving
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for

from edgefleet.demo import TINY_MLP, build_mlp

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: det}
spec:
  model: {name: det, version: "1.0.0"}
  runtime: {executionProviders: [CPUExecutionProvider]}
  replicas: {perDevice: 1}
  placement: {regions: [eu]}
  probes:
    readiness: {periodSeconds: 1, timeoutSeconds: 1}
"""


def compromise(region: HubProcess, tmp_path: Path) -> None:
    """Replace the TUF files the (stopped) region serves: its publisher's targets list a
    forged model, signed by a key of the attacker's, with a snapshot and a timestamp signed
    by that key too (the region holds no key the device would accept for them)."""
    from tuf.api.metadata import MetaFile, Snapshot, Targets, Timestamp

    from edgefleet.trust import signing, tufmeta

    d = region.data / "tuf-relay" / "current" / "files"
    signing.generate_key_pair(tmp_path / "region-attacker")
    signer = tufmeta.tuf_signer(tmp_path / "region-attacker.key")
    role = next(p.stem for p in d.iterdir() if p.name not in (
        "root.json", "targets.json", "snapshot.json", "timestamp.json"
    ) and not p.name.endswith(".root.json"))  # fmt: skip
    targets, _ = tufmeta.parse((d / f"{role}.json").read_bytes(), Targets, what=role)
    targets.version += 1
    model = tmp_path / "forged.onnx"
    build_mlp(model, TINY_MLP, seed=7)
    targets.targets.update(tufmeta.artifact_targets(_meta(model)))
    (d / f"{role}.json").write_bytes(tufmeta.sign(targets, [signer]))
    snap, _ = tufmeta.parse((d / "snapshot.json").read_bytes(), Snapshot, what="snapshot")
    snap.version += 1
    snap.meta[f"{role}.json"] = MetaFile(targets.version)
    snap_bytes = tufmeta.sign(snap, [signer])
    (d / "snapshot.json").write_bytes(snap_bytes)
    ts, _ = tufmeta.parse((d / "timestamp.json").read_bytes(), Timestamp, what="timestamp")
    ts.version += 1
    ts.snapshot_meta = MetaFile(
        snap.version, len(snap_bytes), {"sha256": tufmeta.digest(snap_bytes)}
    )
    (d / "timestamp.json").write_bytes(tufmeta.sign(ts, [signer]))


def forge_root_timestamp(root: HubProcess, tmp_path: Path) -> None:
    """Replace the (stopped) root's timestamp with a newer one signed by another key."""
    from tuf.api.metadata import Timestamp

    from edgefleet.trust import signing, tufmeta

    signing.generate_key_pair(tmp_path / "root-damage")
    path = root.data / "tuf" / "timestamp.json"
    ts, _ = tufmeta.parse(path.read_bytes(), Timestamp, what="timestamp")
    ts.version += 1
    path.write_bytes(tufmeta.sign(ts, [tufmeta.tuf_signer(tmp_path / "root-damage.key")]))


def _meta(model: Path) -> Any:
    from edgefleet.trust import signing
    from edgefleet.trust.documents import parse_artifact
    from edgefleet.trust.envelopes import ARTIFACT_TYPE, decode_payload

    key = model.with_suffix(".key")
    if not key.exists():
        signing.generate_key_pair(model.with_suffix(""))
    _, env = signing.sign_artifact(model, name="forged", version="1.0.0", keys=[key])
    return parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="meta"))


@pytest.mark.scenario
def test_a_device_under_a_region_verifies_the_roots_tuf_and_refuses_a_compromised_region(
    tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    root = HubProcess(tmp_path / "root", tmp_path / "root.log").init("--region", "root").start()
    eu: HubProcess | None = None
    device: Edged | None = None
    try:
        assert (root.data / "tuf" / "root.json").exists()  # hub init made a TUF repository
        token, pin = root.token("--for-region", "eu")
        eu = HubProcess(tmp_path / "eu", tmp_path / "eu.log")
        eu.init("--region", "eu", "--parent", root.address, "--token", token,
                "--parent-ca-hash", pin)  # fmt: skip
        assert not (eu.data / "tuf").exists()  # the region holds no TUF key
        eu.start()
        wait_for(lambda: served_files(eu), SLACK, "the region to serve the root's TUF metadata")
        out = enroll(eu, tmp_path / "dev", "dev", {})
        assert out.returncode == 0, out.stdout + out.stderr
        config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
        device = edged_factory(None, data=tmp_path / "dev", config=config).start()

        model = tmp_path / "det.onnx"
        build_mlp(model, TINY_MLP, seed=1)
        out = root.edgectl("models", "push", str(model), "--name", "det", "--version", "1.0.0")
        assert "pushed" in out.stdout, out.stdout + out.stderr
        doc = tmp_path / "det.yaml"
        doc.write_text(DEPLOYMENT)
        root.edgectl("apply", "-f", str(doc))
        wait_for(lambda: serving(device), SLACK, "the device under eu to serve det")

        # the device verified det with python-tuf, from the root's files served unchanged
        status = device.status()["hub"]
        assert status["tufRequired"] is True and status["tufProblem"] is None, status
        held = {p.name: p.read_bytes() for p in (tmp_path / "dev" / "trust" / "tuf").glob("*.json")}
        at_root = {p.name: p.read_bytes() for p in (root.data / "tuf").glob("*.json")}
        at_root.update(
            {p.name: p.read_bytes() for p in (root.data / "tuf" / "delegated").glob("*.json")}
        )
        for name in ("root.json", "targets.json", "lab.json"):
            assert held[name] == at_root[name] == served_files(eu)[name], name
        assert "TufMetadataRelayed" in eu.edgectl("get", "events").stdout
        # a push at the region is refused: its TUF metadata is the root's
        refused = eu.edgectl(
            "models", "push", str(model), "--name", "det", "--version", "9.0.0",
            "--key", str(root.data / "publisher.key"), check=False,
        )  # fmt: skip
        assert refused.returncode != 0 and "TufRelayed" in refused.stderr, refused.stderr

        # the root serves a timestamp its online key did not sign (its repository damaged on
        # disk): the region refuses it, says so, and keeps serving the last good one
        good = served_files(eu)["timestamp.json"]
        root.stop()
        forge_root_timestamp(root, tmp_path)
        root.start()
        wait_for(
            lambda: "TufMetadataRefused" in eu.edgectl("get", "events").stdout,
            SLACK,
            "the region to refuse the root's bad timestamp",
        )
        events = eu.edgectl("get", "events").stdout
        assert "TufSignatureThresholdNotMet" in events, events
        assert served_files(eu)["timestamp.json"] == good

        # a compromised region, the root away: other TUF files, a forged artifact and deployment
        root.stop()
        eu.stop()
        compromise(eu, tmp_path)
        forge_into_region(eu.data, tmp_path)
        eu.start()

        def refused_by_tuf() -> Any:
            problem = (device.status()["hub"] or {}).get("tufProblem")
            return problem if problem and problem["reason"] else None

        problem = wait_for(refused_by_tuf, SLACK, "the device to refuse the region's TUF files")
        assert problem["reason"] == "TufSignatureThresholdNotMet", problem
        assert not serving(device, "forged")
        assert serving(device, "det")  # what it verified before keeps serving
        print("device under the compromised region:", json.dumps(problem))
    finally:
        if device is not None and device.proc is not None and device.proc.poll() is None:
            device.terminate()
        if eu is not None:
            eu.stop()
        root.stop()
