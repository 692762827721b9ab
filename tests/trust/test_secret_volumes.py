"""Secret files on the device: opened with the real identity key, written to a real tmpfs
(/dev/shm), swapped atomically on rotation, refused on a directory that is not a tmpfs."""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from edged.trust.identity import load_or_create_identity
from edged.trust.secrets import SecretVolumes, on_tmpfs
from edgefleet.sealing import SealedForDevice, public_key_of, seal_for_device

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(
    not SHM.is_dir() or not on_tmpfs(SHM), reason="/dev/shm is not a tmpfs here"
)


@pytest.fixture
def shm_root() -> Iterator[Path]:
    root = SHM / f"edgefleet-test-{uuid.uuid4().hex[:8]}"
    yield root
    if root.exists():
        for dirpath, dirnames, _ in os.walk(root):
            os.chmod(dirpath, 0o700)
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), 0o700)
        shutil.rmtree(root)


def _sealed(data: Path, device: str, name: str, version: int, **values: bytes) -> SealedForDevice:
    ident = load_or_create_identity(data, tpm="off")
    return seal_for_device(public_key_of(ident.public_key_pem()), device, name, version, values)


def test_written_read_only_and_swapped_atomically_on_rotation(
    tmp_path: Path, shm_root: Path
) -> None:
    vols = SecretVolumes(shm_root, data_dir=tmp_path, device_name="dev-1")
    first = _sealed(tmp_path, "dev-1", "tls", 1, token=b"one", cert=b"c1")
    assert vols.update([first], {"web": ("tls",)}) == {}
    d = shm_root / "web" / "tls"
    assert (d / "token").read_bytes() == b"one" and (d / "cert").read_bytes() == b"c1"
    assert stat.S_IMODE(shm_root.stat().st_mode) == 0o700
    target = d / os.readlink(d / "..data")
    assert stat.S_IMODE(target.stat().st_mode) == 0o500
    assert stat.S_IMODE((target / "token").stat().st_mode) == 0o400
    held = open(d / "token", "rb")  # noqa: SIM115 - a reader holding the old version open

    second = _sealed(tmp_path, "dev-1", "tls", 2, token=b"two")
    assert vols.update([second], {"web": ("tls",)}) == {}
    assert (d / "token").read_bytes() == b"two"
    assert not (d / "cert").exists()  # a key the new version lacks is gone
    assert held.read() == b"one"  # the old file stays whole for whoever holds it
    held.close()
    assert [p.name for p in d.iterdir() if p.name.startswith("..v")] == [os.readlink(d / "..data")]
    # the same version again writes nothing
    link = os.readlink(d / "..data")
    vols.update([second], {"web": ("tls",)})
    assert os.readlink(d / "..data") == link

    # a workload that no longer mounts it: its files go
    vols.update([second], {})
    vols.remove_except({})
    assert not (shm_root / "web").exists()


def test_what_cannot_be_opened_or_was_not_sent_is_a_problem(tmp_path: Path, shm_root: Path) -> None:
    vols = SecretVolumes(shm_root, data_dir=tmp_path, device_name="dev-1")
    for_other = _sealed(tmp_path, "dev-2", "tls", 1, token=b"x")  # sealed for another name
    problems = vols.update([for_other], {"web": ("tls",), "api": ("db",)})
    assert problems["web"].startswith("secret tls version 1: secret tls version 1 does not open")
    assert problems["api"].startswith("secret db has not been received")
    assert not (shm_root / "web" / "tls" / "token").exists()


def test_a_directory_not_on_tmpfs_is_refused_unless_allowed(tmp_path: Path) -> None:
    if on_tmpfs(tmp_path):
        pytest.skip("the test's directory is itself a tmpfs")
    sealed = _sealed(tmp_path, "dev-1", "tls", 1, token=b"x")
    vols = SecretVolumes(tmp_path / "secrets", data_dir=tmp_path, device_name="dev-1")
    problems = vols.update([sealed], {"web": ("tls",)})
    assert "is not on a tmpfs" in problems["web"] and vols.problem
    allowed = SecretVolumes(
        tmp_path / "secrets", data_dir=tmp_path, device_name="dev-1", allow_non_tmpfs=True
    )
    assert allowed.update([sealed], {"web": ("tls",)}) == {}


def test_after_a_reboot_the_files_are_written_again_from_the_sealed_copy(
    tmp_path: Path, shm_root: Path
) -> None:
    vols = SecretVolumes(shm_root, data_dir=tmp_path, device_name="dev-1")
    vols.update([_sealed(tmp_path, "dev-1", "tls", 4, token=b"kept")], {"web": ("tls",)})
    state = (tmp_path / "state" / "secrets.json").read_bytes()
    assert b"kept" not in state  # ciphertext only
    shutil.rmtree(shm_root, ignore_errors=True)
    for dirpath, _, _ in os.walk(shm_root):
        os.chmod(dirpath, 0o700)
    shutil.rmtree(shm_root, ignore_errors=True)
    again = SecretVolumes(shm_root, data_dir=tmp_path, device_name="dev-1")
    assert again.write({"web": ("tls",)}) == {}
    assert (shm_root / "web" / "tls" / "token").read_bytes() == b"kept"
    assert again.versions == {"tls": 4}


def test_a_secret_requiring_a_tpm_is_not_opened_without_an_ek_bound_key(
    tmp_path: Path, shm_root: Path
) -> None:
    """Whatever the hub sends: a sealed secret flagged requireTpm (the flag is bound in the
    seal) is refused by a device with no TPM attestation key (D/identity/ak.json), with the
    reason, and nothing is written; the same device opens one without the flag. Even with an
    attestation key file, it is never opened with the identity file key: only a TPM does
    (tests/trust/test_tpm_attestation.py opens one with swtpm)."""
    from edged.trust.tpmattesting import AK_FILE

    ident = load_or_create_identity(tmp_path, tpm="off")
    key = public_key_of(ident.public_key_pem())
    vault = seal_for_device(key, "dev-1", "vault", 1, {"token": b"tpm-only"}, require_tpm=True)
    plain = seal_for_device(key, "dev-1", "plain", 1, {"token": b"anyone"})
    vols = SecretVolumes(shm_root, data_dir=tmp_path, device_name="dev-1")
    problems = vols.update([vault, plain], {"a": ("vault",), "b": ("plain",)})
    assert list(problems) == ["a"]
    assert problems["a"].startswith(
        "secret vault version 1: requires a TPM (spec.requireTpm) and this device is "
        "software-attested"
    )
    assert not (shm_root / "a").exists()
    assert (shm_root / "b" / "plain" / "token").read_bytes() == b"anyone"
    # the flag survives the device's own copy (after a reboot it is read back, still refused)
    again = SecretVolumes(shm_root, data_dir=tmp_path, device_name="dev-1")
    assert "requires a TPM" in again.write({"a": ("vault",)})["a"]
    # an attestation key file, but no TPM: still not opened (never with the file key)
    (tmp_path / AK_FILE).write_text("{}")
    assert again.write({"a": ("vault",)})["a"] == (
        "secret vault version 1: requires a TPM (spec.requireTpm) and trust.tpm ('off') "
        "selects none on this device: not opened"
    )
    assert not (shm_root / "a").exists()
