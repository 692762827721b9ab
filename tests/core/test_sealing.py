"""Sealing secrets at rest and to one device: real AES-GCM and ECDH (cryptography)."""

from __future__ import annotations

import dataclasses

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from edgefleet.sealing import (
    SealedForDevice,
    SealError,
    new_key,
    open_at_rest,
    open_from_hub,
    seal_at_rest,
    seal_for_device,
)

VALUES = {"tls.key": b"\x00private\xff", "token": b"hunter2"}


def test_at_rest_opens_only_under_its_name_and_version() -> None:
    key = new_key()
    sealed = seal_at_rest(key, "tls", 3, VALUES)
    assert b"hunter2" not in sealed.ciphertext
    assert open_at_rest(key, "tls", 3, sealed) == VALUES
    for name, version, k in (("other", 3, key), ("tls", 4, key), ("tls", 3, new_key())):
        with pytest.raises(SealError) as info:
            open_at_rest(k, name, version, sealed)
        assert "hunter2" not in str(info.value)
    assert seal_at_rest(key, "tls", 3, VALUES).nonce != sealed.nonce  # a fresh nonce each time


def _device() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _exchange(key: ec.EllipticCurvePrivateKey):  # type: ignore[no-untyped-def]
    return lambda peer: key.exchange(ec.ECDH(), peer)


def test_a_device_opens_what_was_sealed_to_it_and_nothing_else() -> None:
    mine, other = _device(), _device()
    sealed = seal_for_device(mine.public_key(), "dev-1", "tls", 2, VALUES)
    assert len(sealed.ephemeral_public) == 65 and b"hunter2" not in sealed.ciphertext
    assert open_from_hub(_exchange(mine), mine.public_key(), "dev-1", sealed) == VALUES
    # another device's key; the same key under another device name (the certificate's name)
    with pytest.raises(SealError):
        open_from_hub(_exchange(other), other.public_key(), "dev-1", sealed)
    with pytest.raises(SealError):
        open_from_hub(_exchange(mine), mine.public_key(), "dev-2", sealed)
    # replayed as another secret or another version; bytes altered
    for changed in (
        dataclasses.replace(sealed, name="db"),
        dataclasses.replace(sealed, version=1),
        dataclasses.replace(sealed, ciphertext=sealed.ciphertext[:-1] + b"\x00"),
        dataclasses.replace(sealed, ephemeral_public=b"\x04" + b"\x01" * 64),
    ):
        with pytest.raises(SealError):
            open_from_hub(_exchange(mine), mine.public_key(), "dev-1", changed)


def test_each_seal_uses_a_new_ephemeral_key() -> None:
    mine = _device()
    a = seal_for_device(mine.public_key(), "d", "s", 1, VALUES)
    b = seal_for_device(mine.public_key(), "d", "s", 1, VALUES)
    assert a.ephemeral_public != b.ephemeral_public and a.ciphertext != b.ciphertext


def test_a_secrets_require_tpm_flag_is_bound_in_the_seal() -> None:
    """A seal made with requireTpm opens only with the flag set: a flag dropped on the way
    (so that a device without a TPM would open it) makes the seal fail."""
    mine = _device()
    sealed = seal_for_device(mine.public_key(), "dev-1", "tls", 1, VALUES, require_tpm=True)
    assert sealed.require_tpm
    assert SealedForDevice.from_json(sealed.to_json()) == sealed
    assert open_from_hub(_exchange(mine), mine.public_key(), "dev-1", sealed) == VALUES
    with pytest.raises(SealError):
        open_from_hub(
            _exchange(mine),
            mine.public_key(),
            "dev-1",
            dataclasses.replace(sealed, require_tpm=False),
        )
    plain = seal_for_device(mine.public_key(), "dev-1", "tls", 1, VALUES)
    assert "requireTpm" not in plain.to_json()  # seals without the flag are as they were
    with pytest.raises(SealError):
        open_from_hub(
            _exchange(mine),
            mine.public_key(),
            "dev-1",
            dataclasses.replace(plain, require_tpm=True),
        )
