"""The pure checks of edgefleet.trust.verifying, as tables: documents + state + now -> verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trusttesting import DAY, NOW, Key, make_metadata, make_root

from edgefleet.errors import TrustError
from edgefleet.trust.documents import parse_root
from edgefleet.trust.envelopes import (
    ROLLBACK_TYPE,
    ROOT_TYPE,
    Envelope,
    decode_payload,
    key_id,
    sign_envelope,
)
from edgefleet.trust.signing import build_artifact_metadata
from edgefleet.trust.verifying import (
    Accepted,
    TrustState,
    check_model_version,
    update_root,
    verify_artifact_metadata,
    verify_initial_root,
    verify_root_update,
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("m") / "model.onnx"
    p.write_bytes(b"\x08\x07 model bytes")
    return p


def root_of(env: Envelope) -> Any:
    return parse_root(decode_payload(env, expected_type=ROOT_TYPE, what="root"))


# (case, root kwargs or None, metadata kwargs, state, now offset, expected reason or None)
CASES: list[tuple[str, dict[str, Any] | None, dict[str, Any], TrustState, float, str | None]] = [
    ("valid", {}, {}, TrustState(), 0, None),
    ("no root", None, {}, TrustState(), 0, "NoTrustRoot"),
    ("root expired", {"expires": NOW - 1}, {}, TrustState(), 0, "RootExpired"),
    ("unknown key", {}, {"signers": ("stranger",)}, TrustState(), 0, "UnknownKey"),
    (
        "root key is not an artifacts key",
        {},
        {"signers": ("root1",)},
        TrustState(),
        0,
        "UnknownKey",
    ),
    (
        "below threshold",
        {"threshold": 2},
        {"signers": ("pub1",)},
        TrustState(),
        0,
        "SignatureThresholdNotMet",
    ),
    (
        "one key twice is one signature",
        {"threshold": 2},
        {"signers": ("pub1", "pub1")},
        TrustState(),
        0,
        "SignatureThresholdNotMet",
    ),
    (
        "stranger does not count toward threshold",
        {"threshold": 2},
        {"signers": ("pub1", "stranger")},
        TrustState(),
        0,
        "SignatureThresholdNotMet",
    ),
    ("threshold met", {"threshold": 2}, {"signers": ("pub1", "pub3")}, TrustState(), 0, None),
    ("expired", {}, {"expires": NOW - 1}, TrustState(), 0, "MetadataExpired"),
    ("expires exactly now", {}, {"expires": NOW}, TrustState(), 0, "MetadataExpired"),
    ("not yet expired", {}, {"expires": NOW + 1}, TrustState(), 0, None),
    (
        "metadata rollback",
        {},
        {"metadata_version": 9},
        TrustState(1, {"mlp": Accepted(10, "1.0.0")}),
        0,
        "MetadataRollback",
    ),
    (
        "same metadata version again",
        {},
        {"metadata_version": 10},
        TrustState(1, {"mlp": Accepted(10, "1.0.0")}),
        0,
        None,
    ),
    (
        "other name's version does not count",
        {},
        {"metadata_version": 1},
        TrustState(1, {"other": Accepted(10, "1.0.0")}),
        0,
        None,
    ),
]


@pytest.mark.parametrize(
    ("case", "root_kw", "meta_kw", "state", "offset", "reason"), CASES, ids=[c[0] for c in CASES]
)
def test_verify_artifact_metadata(
    keys: dict[str, Key],
    model: Path,
    case: str,
    root_kw: dict[str, Any] | None,
    meta_kw: dict[str, Any],
    state: TrustState,
    offset: float,
    reason: str | None,
) -> None:
    root = root_of(make_root(keys, **root_kw)) if root_kw is not None else None
    env = make_metadata(keys, model, **meta_kw)
    if reason is None:
        meta = verify_artifact_metadata(root, env, now=NOW + offset, state=state)
        assert (meta.name, meta.version) == ("mlp", "1.0.0")
    else:
        with pytest.raises(TrustError) as info:
            verify_artifact_metadata(root, env, now=NOW + offset, state=state)
        assert info.value.reason == reason, str(info.value)


def test_tampered_payload_fails_signature(keys: dict[str, Key], model: Path) -> None:
    env = make_metadata(keys, model)
    forged = Envelope(env.payload_type, env.payload.replace(b"1.0.0", b"9.0.0"), env.signatures)
    with pytest.raises(TrustError) as info:
        verify_artifact_metadata(root_of(make_root(keys)), forged, now=NOW, state=TrustState())
    assert info.value.reason == "SignatureThresholdNotMet"


def allowance(
    keys: dict[str, Key],
    sha256: str | None,
    signer: str = "pub1",
    version: str = "1.0.0",
    expires: float = NOW + DAY,
) -> Envelope:
    from edgefleet.trust.documents import format_time

    doc = {"_type": "rollback", "name": "mlp", "version": version, "expires": format_time(expires)}
    if sha256 is not None:
        doc["sha256"] = sha256
    return sign_envelope(ROLLBACK_TYPE, doc, [keys[signer].private])


ROLLBACK_CASES = [
    ("first version", None, None, None),
    ("newer version", "0.9.0", None, None),
    ("same version", "1.0.0", None, None),
    ("older without allowance", "2.0.0", None, "ModelVersionRollback"),
    ("older with allowance", "2.0.0", {}, None),
    ("allowance expired", "2.0.0", {"expires": NOW - 1}, "RollbackAllowanceExpired"),
    ("allowance for another version", "2.0.0", {"version": "1.5.0"}, "RollbackAllowanceMismatch"),
    ("allowance by unknown key", "2.0.0", {"signer": "stranger"}, "UnknownKey"),
    ("allowance by a root key only", "2.0.0", {"signer": "root1"}, "UnknownKey"),
    ("allowance for other bytes", "2.0.0", {"sha256": "ab" * 32}, "RollbackAllowanceMismatch"),
    ("allowance bound to no bytes", "2.0.0", {"sha256": None}, "MalformedMetadata"),
    ("recorded version not comparable", "dev", None, None),
]


@pytest.mark.parametrize(
    ("case", "highest", "allow_kw", "reason"), ROLLBACK_CASES, ids=[c[0] for c in ROLLBACK_CASES]
)
def test_model_version_rollback(
    keys: dict[str, Key],
    model: Path,
    case: str,
    highest: str | None,
    allow_kw: dict[str, Any] | None,
    reason: str | None,
) -> None:
    root = root_of(make_root(keys))
    state = TrustState(1, {"mlp": Accepted(1, highest)} if highest else {})
    meta = verify_artifact_metadata(root, make_metadata(keys, model), now=NOW, state=state)
    kw = {"sha256": meta.model_file()[1].sha256, **(allow_kw or {})}
    allow = allowance(keys, **kw) if allow_kw is not None else None
    if reason is None:
        check_model_version(meta, state=state, root=root, allowance=allow, now=NOW)
    else:
        with pytest.raises(TrustError) as info:
            check_model_version(meta, state=state, root=root, allowance=allow, now=NOW)
        assert info.value.reason == reason, str(info.value)


def test_a_version_that_cannot_be_compared_never_locks_a_name(
    keys: dict[str, Key], model: Path
) -> None:
    """A signed "dev" is refused on the device (and at signing and at push), so it is never
    recorded; one recorded before is replaced by the next comparable version."""
    root = root_of(make_root(keys))
    with pytest.raises(TrustError) as info:
        verify_artifact_metadata(
            root, make_metadata(keys, model, version="dev"), now=NOW, state=TrustState()
        )
    assert info.value.reason == "VersionNotComparable"
    locked = TrustState(1, {"mlp": Accepted(1, "dev")})
    meta = verify_artifact_metadata(root, make_metadata(keys, model), now=NOW, state=locked)
    check_model_version(meta, state=locked, root=root, allowance=None, now=NOW)
    assert locked.accept(meta).artifacts["mlp"].model_version == "1.0.0"
    with pytest.raises(TrustError) as info:
        build_artifact_metadata(model, name="mlp", version="dev")
    assert info.value.reason == "VersionNotComparable"


def test_state_only_goes_up(keys: dict[str, Key], model: Path) -> None:
    root = root_of(make_root(keys))
    state = TrustState(1, {"mlp": Accepted(20, "2.0.0")})
    meta = verify_artifact_metadata(
        root, make_metadata(keys, model, metadata_version=30), now=NOW, state=state
    )
    assert state.accept(meta).artifacts["mlp"] == Accepted(30, "2.0.0")
    assert TrustState.from_json(state.accept(meta).to_json()) == state.accept(meta)


# -- roots ------------------------------------------------------------------------------------


def test_initial_root_needs_its_own_threshold(keys: dict[str, Key]) -> None:
    ok = make_root(keys, root=("root1", "root2"), root_threshold=2)
    assert verify_initial_root(ok, NOW).version == 1
    half = make_root(keys, root=("root1", "root2"), root_threshold=2, signers=("root1",))
    with pytest.raises(TrustError) as info:
        verify_initial_root(half, NOW)
    assert info.value.reason == "SignatureThresholdNotMet"


def test_rotation_signed_only_by_new_keys_is_refused(keys: dict[str, Key]) -> None:
    current = root_of(make_root(keys))
    new = make_root(keys, root=("newroot1",), version=2, signers=("newroot1",))
    with pytest.raises(TrustError) as info:
        verify_root_update(current, new)
    assert info.value.reason == "UnknownKey"
    assert "old root keys" in str(info.value)


def test_rotation_signed_only_by_old_keys_is_refused(keys: dict[str, Key]) -> None:
    current = root_of(make_root(keys))
    new = make_root(keys, root=("newroot1",), version=2, signers=("root1",))
    with pytest.raises(TrustError) as info:
        verify_root_update(current, new)
    assert "its own root keys" in str(info.value)


def test_rotation_signed_by_old_and_new_is_accepted(keys: dict[str, Key]) -> None:
    current = root_of(make_root(keys))
    new = make_root(
        keys, root=("newroot1",), artifacts=("pub2",), version=2, signers=("root1", "newroot1")
    )
    rotated = update_root(current, [new], NOW)
    assert rotated.version == 2
    assert set(rotated.role("artifacts").keyids) == {key_id(keys["pub2"].raw)}


@pytest.mark.parametrize("version", [1, 3])
def test_rotation_must_be_the_next_version(keys: dict[str, Key], version: int) -> None:
    current = root_of(make_root(keys))
    new = make_root(keys, version=version, signers=("root1",))
    with pytest.raises(TrustError) as info:
        verify_root_update(current, new)
    assert info.value.reason == "RootVersionNotNext"


def test_rotation_chains_through_intermediates(keys: dict[str, Key]) -> None:
    current = root_of(make_root(keys))
    v2 = make_root(keys, root=("root2",), version=2, signers=("root1", "root2"))
    v3 = make_root(keys, root=("newroot2",), version=3, signers=("root2", "newroot2"))
    assert update_root(current, [v2, v3], NOW).version == 3
    with pytest.raises(TrustError):
        update_root(current, [v3], NOW)


def test_rotated_root_that_is_expired_is_refused(keys: dict[str, Key]) -> None:
    current = root_of(make_root(keys))
    v2 = make_root(keys, version=2, expires=NOW - 1, signers=("root1",))
    with pytest.raises(TrustError) as info:
        update_root(current, [v2], NOW)
    assert info.value.reason == "RootExpired"
