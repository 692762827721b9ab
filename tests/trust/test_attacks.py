"""Each attack on the artifact path, its own test (as python-tuf and the Uptane test plan do):
a real gate, a real store, real signed files on disk, a fixed clock."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from trusttesting import DAY, NOW, Device, Key, make_root

from edged.runtime.worker import LoadError, _read_verified
from edged.trust.admitting import ArtifactRequest
from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.errors import ArtifactError, TrustError
from edgefleet.trust.documents import FileInfo, format_time
from edgefleet.trust.envelopes import ROLLBACK_TYPE, sign_envelope
from edgefleet.trust.verifying import SignedFile


def refused(device: Device, req: ArtifactRequest, **kw: int) -> TrustError:
    with pytest.raises(TrustError) as info:
        device.admit(req, **kw)
    assert device.results[-1] == ("refused", info.value.reason)
    assert not device.store.digests(), "nothing may reach the store"
    return info.value


def test_signed_artifact_is_accepted(device: Device, model_bytes: tuple[bytes, bytes]) -> None:
    sha = device.admit(device.publish(model_bytes[0]))
    assert device.store.path_for(sha).read_bytes() == model_bytes[0]
    assert device.results == [("accepted", "Verified")]


def test_tampered_model_bytes(device: Device, model_bytes: tuple[bytes, bytes]) -> None:
    req = device.publish(model_bytes[0])
    req.model_path.write_bytes(model_bytes[0][:-1] + b"\x00")  # same length, other bytes
    assert refused(device, req).reason == "DigestMismatch"


def test_missing_extra_file(device: Device, model_bytes: tuple[bytes, bytes]) -> None:
    labels = device.incoming / "labels.txt"
    labels.write_text("cat\ndog\n")
    req = device.publish(model_bytes[0], extras=(labels,))
    labels.unlink()
    err = refused(device, req)
    assert err.reason == "FileMissing" and "labels.txt" in str(err)


def test_altered_extra_file(device: Device, model_bytes: tuple[bytes, bytes]) -> None:
    labels = device.incoming / "labels.txt"
    labels.write_text("cat\ndog\n")
    req = device.publish(model_bytes[0], extras=(labels,))
    labels.write_text("cat\ndog\nwolf\n")
    assert refused(device, req).reason == "LengthExceeded"


def test_extra_model_file_not_in_the_metadata(
    device: Device, model_bytes: tuple[bytes, bytes]
) -> None:
    """A file the publisher did not sign, offered as the model with valid metadata."""
    req = device.publish(model_bytes[0])
    other = device.incoming / "other.onnx"
    other.write_bytes(model_bytes[1])
    err = refused(device, ArtifactRequest("mlp", "1.0.0", other, req.metadata_path))
    assert err.reason == "FileNotSigned"


def test_metadata_for_another_model(device: Device, model_bytes: tuple[bytes, bytes]) -> None:
    req = device.publish(model_bytes[0], name="other")
    err = refused(device, ArtifactRequest("mlp", "1.0.0", req.model_path, req.metadata_path))
    assert err.reason == "MetadataMismatch"


def test_file_longer_than_signed(device: Device, model_bytes: tuple[bytes, bytes]) -> None:
    req = device.publish(model_bytes[0])
    with open(req.model_path, "ab") as f:
        f.write(b"\x00" * 10)
    assert refused(device, req).reason == "LengthExceeded"


def test_endless_stream_stops_at_the_signed_length(tmp_path: Path) -> None:
    """A generator that never ends: ingest reads at most the signed length plus one chunk."""
    read = 0

    class Endless:
        def read(self, n: int) -> bytes:
            nonlocal read
            read += n
            return b"\x08" * n

    info = FileInfo("0" * 64, 3 << 20, "model")
    store = ArtifactStore(tmp_path / "artifacts")
    with pytest.raises(ArtifactError) as exc:
        store.ingest_stream(
            Endless(),  # type: ignore[arg-type]
            origin="endless",
            name="m",
            version="1",
            verifiers=[SignedFile(info, "m 1")],
            max_bytes=info.length,
        )
    assert exc.value.reason == "ArtifactTooLarge"
    assert read <= info.length + (1 << 20)
    assert not store.digests() and not list((tmp_path / "artifacts" / "staging").iterdir())


@pytest.fixture
def endless_pipe(tmp_path: Path) -> Iterator[Path]:
    """A named pipe that a thread fills with zeros until the reader goes away."""
    fifo = tmp_path / "incoming" / "pipe.onnx"
    fifo.parent.mkdir(exist_ok=True)
    os.mkfifo(fifo)
    written = [0]

    def feed() -> None:
        try:
            with open(fifo, "wb") as f:
                while True:
                    f.write(b"\x08" * 65536)
                    written[0] += 65536
        except (BrokenPipeError, ValueError):
            pass

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    yield fifo
    t.join(10)
    assert not t.is_alive()


def test_endless_pipe_as_the_model_file(
    device: Device, model_bytes: tuple[bytes, bytes], endless_pipe: Path
) -> None:
    req = device.publish(model_bytes[0], file="pipe-src.onnx")
    env_path = endless_pipe.with_name("pipe.onnx.metadata.json")
    # Metadata that signs the pipe's name with the small model's digest and length.
    import orjson

    from edgefleet.trust.envelopes import ARTIFACT_TYPE
    from edgefleet.trust.signing import build_artifact_metadata

    doc = build_artifact_metadata(req.model_path, name="mlp", version="1.0.0", now=NOW - DAY)
    doc["files"] = {"pipe.onnx": doc["files"]["pipe-src.onnx"]}
    env_path.write_bytes(
        sign_envelope(ARTIFACT_TYPE, doc, [device.keys["pub1"].private]).to_bytes()
    )
    assert orjson.loads(env_path.read_bytes())["payloadType"] == ARTIFACT_TYPE
    err = refused(device, ArtifactRequest("mlp", "1.0.0", endless_pipe, env_path))
    assert err.reason == "LengthExceeded"


def test_signature_by_unknown_key(device: Device, model_bytes: tuple[bytes, bytes]) -> None:
    assert refused(device, device.publish(model_bytes[0], signers=("stranger",))).reason == (
        "UnknownKey"
    )


def test_below_threshold(
    tmp_path: Path, keys: dict[str, Key], model_bytes: tuple[bytes, bytes]
) -> None:
    device = Device(tmp_path, keys, make_root(keys, threshold=2))
    assert refused(device, device.publish(model_bytes[0])).reason == "SignatureThresholdNotMet"
    assert device.admit(device.publish(model_bytes[0], signers=("pub1", "pub2")))


def test_expired_metadata_freeze(device: Device, model_bytes: tuple[bytes, bytes]) -> None:
    req = device.publish(model_bytes[0], expires=NOW - 60)
    assert refused(device, req).reason == "MetadataExpired"


def test_replay_of_older_metadata(device: Device, model_bytes: tuple[bytes, bytes]) -> None:
    old = device.publish(model_bytes[0], metadata_version=5, file="old.onnx")
    new = device.publish(model_bytes[0], metadata_version=6)
    device.admit(new)
    with pytest.raises(TrustError) as info:
        device.admit(old)
    assert info.value.reason == "MetadataRollback"


def rollback_allowance(device: Device, version: str, sha256: str) -> Path:
    doc = {
        "_type": "rollback",
        "name": "mlp",
        "version": version,
        "sha256": sha256,
        "expires": format_time(NOW + DAY),
    }
    path = device.incoming / "allow.json"
    path.write_bytes(sign_envelope(ROLLBACK_TYPE, doc, [device.keys["pub1"].private]).to_bytes())
    return path


def test_older_model_version_without_and_with_allowance(
    device: Device, model_bytes: tuple[bytes, bytes]
) -> None:
    device.admit(
        device.publish(model_bytes[1], version="2.0.0", metadata_version=20, file="v2.onnx")
    )
    old = device.publish(model_bytes[0], version="1.0.0", metadata_version=30, file="v1.onnx")
    with pytest.raises(TrustError) as info:
        device.admit(old)
    assert info.value.reason == "ModelVersionRollback"
    allowed = ArtifactRequest(
        old.name,
        old.version,
        old.model_path,
        old.metadata_path,
        allowance_path=rollback_allowance(device, "1.0.0", "ab" * 32),
    )
    with pytest.raises(TrustError) as info:
        device.admit(allowed)  # an allowance for other bytes of that version
    assert info.value.reason == "RollbackAllowanceMismatch"
    allowed = ArtifactRequest(
        old.name,
        old.version,
        old.model_path,
        old.metadata_path,
        allowance_path=rollback_allowance(
            device, "1.0.0", hashlib.sha256(model_bytes[0]).hexdigest()
        ),
    )
    sha = device.admit(allowed)
    assert device.store.path_for(sha).read_bytes() == model_bytes[0]
    assert device.gate.state.artifacts["mlp"].model_version == "2.0.0"  # highest stays


def test_root_rotation_through_the_root_file(
    device: Device, keys: dict[str, Key], model_bytes: tuple[bytes, bytes]
) -> None:
    device.admit(device.publish(model_bytes[0]))
    assert device.gate.root is not None and device.gate.root.version == 1
    # Signed only by the new root key: refused, the old root stays.
    bad = make_root(keys, root=("newroot1",), artifacts=("pub2",), version=2, signers=("newroot1",))
    device.root_file.write_bytes(bad.to_bytes())
    device.gate.refresh_root(NOW)
    assert device.gate.root.version == 1
    assert device.gate.root_problem is not None and device.gate.root_problem[0] == "UnknownKey"
    # Properly signed: accepted; pub1 is no longer an artifacts key.
    good = make_root(
        keys, root=("newroot1",), artifacts=("pub2",), version=2, signers=("root1", "newroot1")
    )
    device.root_file.write_bytes(good.to_bytes() + b"\n")
    device.gate.refresh_root(NOW)
    assert device.gate.root.version == 2 and device.gate.root_problem is None
    with pytest.raises(TrustError) as info:
        device.admit(device.publish(model_bytes[1], metadata_version=11, file="n.onnx"))
    assert info.value.reason == "UnknownKey"
    assert device.admit(
        device.publish(model_bytes[1], metadata_version=11, signers=("pub2",), file="n.onnx")
    )
    # An older root in the image after that changes nothing.
    device.root_file.write_bytes(make_root(keys).to_bytes() + b"\n\n")
    device.gate.refresh_root(NOW)
    assert device.gate.root.version == 2


def test_trust_state_survives_restart(device: Device, model_bytes: tuple[bytes, bytes]) -> None:
    device.admit(device.publish(model_bytes[1], version="2.0.0", metadata_version=20))
    device.root_file.unlink()  # the root now comes from D/trust/root.json alone
    device.reopen()
    assert device.gate.root is not None and device.gate.root.version == 1
    assert device.gate.state.artifacts["mlp"].metadata_version == 20
    with pytest.raises(TrustError) as info:
        device.admit(device.publish(model_bytes[0], version="1.0.0", metadata_version=19))
    assert info.value.reason == "MetadataRollback"
    assert (device.tmp / "data" / "trust" / "state.json").stat().st_mode & 0o077 == 0


def test_no_trust_root(
    tmp_path: Path, keys: dict[str, Key], model_bytes: tuple[bytes, bytes]
) -> None:
    device = Device(tmp_path, keys, None)
    assert refused(device, device.publish(model_bytes[0])).reason == "NoTrustRoot"


def test_unsigned_refused_unless_allowed(device: Device, model_bytes: tuple[bytes, bytes]) -> None:
    req = device.publish(model_bytes[0])
    req.metadata_path.unlink()
    assert refused(device, req).reason == "UnsignedArtifact"
    device.reopen(allow_unsigned=True)
    assert device.admit(req)
    assert device.results[-1] == ("unsigned", "UnsignedArtifact")
    assert device.gate.status()["unsignedArtifacts"] == ["mlp"]


def test_file_swapped_in_the_store_after_verification_is_never_loaded(
    device: Device, model_bytes: tuple[bytes, bytes]
) -> None:
    sha = device.admit(device.publish(model_bytes[0]))
    blob = device.store.path_for(sha)
    assert blob.stat().st_mode & 0o777 == 0o444
    os.chmod(blob, 0o644)
    blob.write_bytes(model_bytes[1])  # an attacker with write access swaps the bytes
    with pytest.raises(LoadError) as info:
        _read_verified(str(blob), sha)
    assert info.value.reason == "ArtifactDigestMismatch"


def test_file_swapped_at_the_source_after_verification(
    device: Device, model_bytes: tuple[bytes, bytes]
) -> None:
    """What is loaded is the store's copy, made while hashing: swapping the source afterwards
    changes nothing that is used."""
    req = device.publish(model_bytes[0])
    sha = device.admit(req)
    req.model_path.write_bytes(model_bytes[1])
    assert device.store.path_for(sha).read_bytes() == model_bytes[0]
    assert _read_verified(str(device.store.path_for(sha)), sha) == model_bytes[0]
