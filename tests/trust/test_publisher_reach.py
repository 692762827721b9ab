"""A delegated publisher key reaches only its delegated model names (issue 29, item 9): the
pure checks, as tables, with real Ed25519 keys and envelopes.

* :func:`check_signed_by_role`: with TUF, the artifact's envelope is signed by a threshold of
  the keys of the TUF role that lists it, not by any key of the trust root's artifacts role.
* :func:`check_model_version` with ``tuf``: only the allowance in the publisher's own targets
  (``grant``) counts; a separate allowance envelope is refused, whoever signed it.

pub1 is the ``vision`` publisher (``vision-*``), pub2 the ``audio`` publisher (``audio-*``);
both are artifacts keys of the fleet root (``make_root``), as in the attack.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from trusttesting import DAY, NOW, Key, make_metadata, make_root

from edgefleet.errors import TrustError
from edgefleet.trust.documents import RollbackAllowance, parse_artifact, parse_root
from edgefleet.trust.envelopes import (
    ARTIFACT_TYPE,
    ROLLBACK_TYPE,
    ROOT_TYPE,
    Envelope,
    decode_payload,
    key_id,
    sign_envelope,
)
from edgefleet.trust.publishers import DelegatedRole, check_signed_by_role
from edgefleet.trust.verifying import Accepted, TrustState, check_model_version


def role(keys: dict[str, Key], name: str, members: tuple[str, ...], threshold: int = 1) -> Any:
    return DelegatedRole(
        name,
        frozenset(key_id(keys[k].raw) for k in members),
        threshold,
        {key_id(keys[k].raw): keys[k].raw for k in members},
    )


def envelope(keys: dict[str, Key], tmp: Path, signers: tuple[str, ...]) -> Envelope:
    model = tmp / "audio-x.onnx"
    model.write_bytes(b"audio's model bytes")
    return make_metadata(keys, model, name="audio-x", version="1.0.0", signers=signers)


ROLE_CASES = [
    # (id, signers of the envelope, the listing role's members, threshold, refused)
    ("by its own publisher", ("pub2",), ("pub2",), 1, False),
    ("by another delegated publisher", ("pub1",), ("pub2",), 1, True),
    ("by the other publisher and its own", ("pub1", "pub2"), ("pub2",), 1, False),
    ("one of the role's two signatures", ("pub2",), ("pub2", "pub3"), 2, True),
    ("both of the role's signatures", ("pub2", "pub3"), ("pub2", "pub3"), 2, False),
    ("by a key in no role", ("stranger",), ("pub2",), 1, True),
]


@pytest.mark.parametrize(
    ("signers", "members", "threshold", "refused"),
    [c[1:] for c in ROLE_CASES],
    ids=[c[0] for c in ROLE_CASES],
)
def test_the_envelope_is_signed_by_the_role_that_lists_it(
    keys: dict[str, Key],
    tmp_path: Path,
    signers: tuple[str, ...],
    members: tuple[str, ...],
    threshold: int,
    refused: bool,
) -> None:
    env = envelope(keys, tmp_path, signers)
    audio = role(keys, "audio", members, threshold)
    if not refused:
        check_signed_by_role(env, audio, what="audio-x 1.0.0")
        return
    with pytest.raises(TrustError) as info:
        check_signed_by_role(env, audio, what="audio-x 1.0.0")
    assert info.value.reason == "SignerNotDelegated"
    assert "'audio'" in str(info.value) and "audio-x 1.0.0" in str(info.value)


def test_a_signature_under_the_roles_key_id_but_by_another_key_does_not_count(
    keys: dict[str, Key], tmp_path: Path
) -> None:
    """pub1 signs and labels its signature with pub2's key id: verified with pub2's key from
    the TUF metadata, it does not count."""
    env = envelope(keys, tmp_path, ("pub1",))
    forged = Envelope(
        env.payload_type, env.payload, ((key_id(keys["pub2"].raw), env.signatures[0][1]),)
    )
    with pytest.raises(TrustError) as info:
        check_signed_by_role(forged, role(keys, "audio", ("pub2",)), what="audio-x 1.0.0")
    assert info.value.reason == "SignerNotDelegated"
    # a role whose key material is not Ed25519 (left out of ``keys``) admits no envelope
    only_ids = DelegatedRole("audio", frozenset({key_id(keys["pub2"].raw)}), 1, {})
    env2 = envelope(keys, tmp_path, ("pub2",))
    with pytest.raises(TrustError):
        check_signed_by_role(env2, only_ids, what="audio-x 1.0.0")


def allowance_envelope(keys: dict[str, Key], signer: str, name: str, sha: str) -> Envelope:
    doc = {
        "_type": "rollback",
        "name": name,
        "version": "1.0.0",
        "sha256": sha,
        "expires": "2030-04-01T00:00:00Z",
    }
    return sign_envelope(ROLLBACK_TYPE, doc, [keys[signer].private])


VERSION_CASES = [
    # (id, tuf, allowance envelope (signer, model name) or None, grant name or None, reason)
    ("no TUF: a separate allowance counts", False, ("pub1", "audio-x"), None, None),
    ("TUF: a separate allowance by another publisher", True, ("pub1", "audio-x"), None,
     "RollbackAllowanceNotInTargets"),
    ("TUF: a separate allowance by its own publisher", True, ("pub2", "audio-x"), None,
     "RollbackAllowanceNotInTargets"),
    ("TUF: nothing", True, None, None, "ModelVersionRollback"),
    ("TUF: the grant in the publisher's targets", True, None, "audio-x", None),
    ("TUF: the grant wins over an envelope", True, ("pub1", "audio-x"), "audio-x", None),
    ("TUF: a grant for another name", True, None, "vision-det", "RollbackAllowanceMismatch"),
    ("no TUF: an allowance for another name", False, ("pub1", "vision-det"), None,
     "RollbackAllowanceMismatch"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("tuf", "separate", "grant_name", "reason"),
    [c[1:] for c in VERSION_CASES],
    ids=[c[0] for c in VERSION_CASES],
)
def test_with_tuf_only_the_allowance_in_the_targets_counts(
    keys: dict[str, Key],
    tmp_path: Path,
    tuf: bool,
    separate: tuple[str, str] | None,
    grant_name: str | None,
    reason: str | None,
) -> None:
    root = parse_root(decode_payload(make_root(keys), expected_type=ROOT_TYPE, what="root"))
    env = envelope(keys, tmp_path, ("pub1",))  # re-signed with a fresh metadata version
    meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="meta"))
    sha = hashlib.sha256(b"audio's model bytes").hexdigest()
    state = TrustState(artifacts={"audio-x": Accepted(1, "2.0.0")})
    allowance = allowance_envelope(keys, *separate, sha) if separate else None
    grant = (
        RollbackAllowance(grant_name, "1.0.0", sha, NOW + DAY) if grant_name is not None else None
    )

    def check() -> None:
        check_model_version(
            meta, state=state, root=root, allowance=allowance, now=NOW, grant=grant, tuf=tuf
        )

    if reason is None:
        check()
        return
    with pytest.raises(TrustError) as info:
        check()
    assert info.value.reason == reason, str(info.value)
    if reason == "RollbackAllowanceNotInTargets":
        assert "--allow-rollback" in str(info.value)
        assert "edgefleet.rollbackAllowance" in str(info.value)
