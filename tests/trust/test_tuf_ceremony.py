"""The offline TUF ceremony with the real commands: ``hub tuf online-key``, ``edgectl trust
tuf root|targets`` with keys that never touch the hub, ``hub tuf install``; a device's TUF
client (python-tuf) against the installed repository, and a rotation of the targets key."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edgectl.cli import main as edgectl
from edged.trust.tufclient import TufClient
from edgefleet.trust import tufmeta
from edgefleet.trust.documents import ArtifactMetadata, FileInfo, parse_root
from edgefleet.trust.envelopes import ROOT_TYPE, decode_payload, parse_envelope_bytes
from hub.cli import main as hub
from hub.state.tufrepo import TufRepository


def test_offline_root_and_targets_installed_then_rotated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "hub"
    # quickstart root key: the fleet root's; no quickstart TUF repository (the ceremony's)
    assert hub(["init", "--data-dir", str(d), "--no-tuf"]) == 0
    assert hub(["tuf", "online-key", "--data-dir", str(d)]) == 0
    online = d / "tuf" / "online.pub"
    assert online.exists() and "online key" in capsys.readouterr().out
    off = tmp_path / "offline"
    for name in ("targets", "targets2", "vision"):
        assert edgectl(["keys", "generate", "--out", str(off / name)]) == 0
    root1, targets1 = off / "root.json", off / "targets.json"
    assert edgectl(["trust", "tuf", "root", "--root-key", str(d / "root.key"),
                    "--targets-key", str(off / "targets.pub"), "--online-key", str(online),
                    "--out", str(root1)]) == 0  # fmt: skip
    assert edgectl(["trust", "tuf", "targets", "--key", str(off / "targets.key"),
                    "--delegate", f"vision={off / 'vision.pub'}:vision-*", "--version", "1",
                    "--out", str(targets1)]) == 0  # fmt: skip
    assert hub(["tuf", "install", "--data-dir", str(d), "--root", str(root1),
                "--targets", str(targets1)]) == 0  # fmt: skip
    repo = TufRepository.load(d)
    assert repo is not None
    data = b"model"
    import hashlib

    meta = ArtifactMetadata(
        "vision-a", "1.0.0", None, 1, time.time(), time.time() + 86400,
        {"m.onnx": FileInfo(hashlib.sha256(data).hexdigest(), len(data), "model")},
    )  # fmt: skip
    signed = tufmeta.add_artifact(
        None, meta, [tufmeta.tuf_signer(off / "vision.key")], expires=time.time() + 86400
    )
    repo.store_delegated(
        "vision", signed, repo.check_delegated("vision", signed, meta, now=time.time())
    )
    fleet = parse_root(
        decode_payload(
            parse_envelope_bytes((d / "trust-root.json").read_bytes(), what="r"),
            expected_type=ROOT_TYPE,
            what="r",
        )
    )
    client = TufClient(tmp_path / "dev")
    TufClient.check(client.refresh(lambda n, m: repo.read(n), fleet), meta)

    # rotation: root 2 (signed by the old and new root keys) with another targets key, and
    # targets 2 signed by it; a device follows
    root2, targets2 = off / "root2.json", off / "targets2.json"
    assert edgectl(["trust", "tuf", "root", "--current", str(root1),
                    "--old-root-key", str(d / "root.key"), "--root-key", str(d / "root.key"),
                    "--targets-key", str(off / "targets2.pub"), "--online-key", str(online),
                    "--out", str(root2)]) == 0  # fmt: skip
    assert edgectl(["trust", "tuf", "targets", "--key", str(off / "targets2.key"),
                    "--delegate", f"vision={off / 'vision.pub'}:vision-*", "--version", "2",
                    "--out", str(targets2)]) == 0  # fmt: skip
    # targets of a version not above the installed one are refused, nothing changes
    assert edgectl(["trust", "tuf", "targets", "--key", str(off / "targets.key"),
                    "--version", "1", "--out", str(off / "t1b.json")]) == 0  # fmt: skip
    assert hub(["tuf", "install", "--data-dir", str(d), "--root", str(root1),
                "--targets", str(off / "t1b.json")]) == 1  # fmt: skip
    assert "not higher than" in capsys.readouterr().err
    assert (d / "tuf" / "targets.json").read_bytes() == targets1.read_bytes()
    assert hub(["tuf", "install", "--data-dir", str(d), "--root", str(root2),
                "--targets", str(targets2)]) == 0  # fmt: skip
    assert (d / "tuf" / "2.root.json").exists() and (d / "tuf" / "1.root.json").exists()
    repo = TufRepository.load(d)
    assert repo is not None
    TufClient.check(client.refresh(lambda n, m: repo.read(n), fleet), meta)
    assert client.root_version() == 2
    # a targets file signed with the old targets key does not install any more
    assert edgectl(["trust", "tuf", "targets", "--key", str(off / "targets.key"),
                    "--version", "3", "--out", str(off / "t3.json")]) == 0  # fmt: skip
    assert hub(["tuf", "install", "--data-dir", str(d), "--root", str(root2),
                "--targets", str(off / "t3.json")]) == 1  # fmt: skip
    assert "hub tuf install" in capsys.readouterr().err
