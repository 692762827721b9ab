"""edgectl's trust commands, end to end on files: what they write verifies on a device."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgectl.cli import main
from edged.trust.admitting import ArtifactGate, ArtifactRequest
from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.errors import TrustError
from edgefleet.trust.signing import read_envelope
from edgefleet.trust.verifying import root_digest


def test_keys_sign_root_rotate_and_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("pub", "root", "root2"):
        assert main(["keys", "generate", "--out", str(tmp_path / name)]) == 0
    out = capsys.readouterr().out
    assert out.count("key id ") == 3
    assert (tmp_path / "pub.key").stat().st_mode & 0o777 == 0o600
    model = tmp_path / "m.onnx"
    model.write_bytes(b"\x08\x07 not really a model")
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\n")
    assert (
        main(
            [
                "models",
                "sign",
                str(model),
                "--name",
                "m",
                "--version",
                "1.0.0",
                "--key",
                str(tmp_path / "pub.key"),
                "--extra",
                str(labels),
            ]
        )
        == 0
    )
    root = tmp_path / "root.json"
    assert (
        main(
            [
                "trust",
                "root",
                "create",
                "--root-key",
                str(tmp_path / "root.key"),
                "--artifact-key",
                str(tmp_path / "pub.pub"),
                "--out",
                str(root),
            ]
        )
        == 0
    )
    pin = f"sha256:{root_digest(read_envelope(root))}"
    assert f"--root-hash): {pin}" in capsys.readouterr().out  # what edged enroll pins
    gate = ArtifactGate(tmp_path / "data", root_file=root, allow_unsigned=False)
    store = ArtifactStore(tmp_path / "data" / "artifacts")
    req = ArtifactRequest("m", "1.0.0", model, tmp_path / "m.onnx.metadata.json")
    assert gate.admit(req, store, now=gate.begin(), max_bytes=1 << 20)

    # Rotation: without the old key's signature devices refuse it; signed, they accept it.
    new = tmp_path / "root-v2.json"
    assert (
        main(
            [
                "trust",
                "root",
                "rotate",
                str(root),
                "--root-key",
                str(tmp_path / "root2.key"),
                "--artifact-key",
                str(tmp_path / "pub.pub"),
                "--out",
                str(new),
            ]
        )
        == 0
    )
    with pytest.raises(TrustError):
        gate.accept_roots(new.read_bytes(), gate.begin(), origin="v2")
    assert main(["trust", "root", "sign", str(new), "--key", str(tmp_path / "root.key")]) == 0
    accepted = gate.accept_roots(new.read_bytes(), gate.begin(), origin="v2")
    assert accepted is not None and accepted.version == 2

    allow = tmp_path / "allow.rollback.json"
    assert (
        main(
            [
                "rollback",
                "allow",
                "--name",
                "m",
                "--version",
                "0.9.0",
                "--model",
                str(model),
                "--key",
                str(tmp_path / "pub.key"),
                "--out",
                str(allow),
            ]
        )
        == 0
    )
    assert allow.exists()


def test_bad_key_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "k.key").write_text("not a key")
    (tmp_path / "m.onnx").write_bytes(b"x")
    code = main(
        [
            "models",
            "sign",
            str(tmp_path / "m.onnx"),
            "--name",
            "m",
            "--version",
            "1",
            "--key",
            str(tmp_path / "k.key"),
        ]
    )
    assert code == 1
    assert "not a readable PEM private key" in capsys.readouterr().err
