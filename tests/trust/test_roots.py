"""Which trust roots a device accepts: the pure decision (``follow_roots``, a table) and the
gate around it (real files in ``tmp_path``, a fixed clock). The attacker is a hub that signs
roots of its own: it must never become a device's root, on first contact or later."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from trusttesting import DAY, NOW, Device, Key, make_root

from edgefleet.errors import TrustError
from edgefleet.trust.envelopes import Envelope, parse_envelope_bytes
from edgefleet.trust.verifying import (
    TrustState,
    follow_roots,
    lost_trust_state,
    parse_root_pin,
    root_digest,
)


def rotated(keys: dict[str, Key], version: int, *, new: str, old: str, **kw: object) -> Envelope:
    """Version ``version`` with root key ``new``, signed by ``new`` and ``old``."""
    return make_root(keys, root=(new,), version=version, signers=(new, old), **kw)  # type: ignore[arg-type]


def reformatted(env: Envelope) -> Envelope:
    """The same root, other envelope bytes (no indentation, a trailing newline)."""
    data = orjson.dumps(env.to_json()) + b"\n"
    assert data != env.to_bytes()
    return parse_envelope_bytes(data, what="reformatted")


def test_follow_roots_table(keys: dict[str, Key]) -> None:
    v1 = make_root(keys)
    v2 = rotated(keys, 2, new="newroot1", old="root1")
    v3 = rotated(keys, 3, new="newroot2", old="newroot1")
    hub_v1 = make_root(keys, root=("stranger",))  # a hub's own root, self-signed
    hub_v2 = make_root(keys, root=("stranger",), version=2)  # claims to rotate, old keys absent
    expired_v1 = make_root(keys, expires=NOW - DAY)
    r1 = follow_roots(None, {}, [v1], NOW).root
    known = {1: root_digest(v1)}
    d = root_digest
    # (case, current, known, offered, anchor, expected version or refusal reason)
    cases: list[tuple[str, object, dict[int, str], list[Envelope], str | None, int | str]] = [
        ("image root, first", None, {}, [v1], None, 1),
        ("pinned first root", None, {}, [v1], d(v1), 1),
        ("pinned root in a chain", None, {}, [v1, v2, v3], d(v1), 3),
        ("pin of a later root", None, {}, [v1, v2, v3], d(v2), 3),
        ("hub's root against a pin", None, {}, [hub_v1], d(v1), "RootPinMismatch"),
        ("nothing offered", None, {}, [], d(v1), "NoTrustRoot"),
        ("chain", r1, known, [v1, v2, v3], None, 3),
        ("chain out of order", r1, known, [v3, v2], None, 3),
        ("skips a version", r1, known, [v3], None, "RootVersionNotNext"),
        ("hub's root of the same version", r1, known, [hub_v1], None, "RootConflict"),
        ("hub's rotation", r1, known, [hub_v2], None, "UnknownKey"),
        ("same root reformatted", r1, known, [reformatted(v1)], None, 1),
        ("two roots of one version", None, {}, [v1, hub_v1], d(v1), "RootConflict"),
        ("expired last root", None, {}, [expired_v1], None, "RootExpired"),
    ]
    for case, current, known_, offered, anchor, want in cases:
        try:
            got: int | str = follow_roots(
                current,  # type: ignore[arg-type]
                known_,
                offered,
                NOW,
                anchor=anchor,
            ).root.version
        except TrustError as exc:
            got = exc.reason
        assert got == want, case


def test_nothing_newer_is_no_change(keys: dict[str, Key]) -> None:
    v1 = make_root(keys)
    r1 = follow_roots(None, {}, [v1], NOW).root
    update = follow_roots(r1, {1: root_digest(v1)}, [reformatted(v1)], NOW)
    assert (update.changed, update.envelope) == (False, None)


def test_root_pins() -> None:
    assert parse_root_pin("sha256:" + "ab" * 32) == "ab" * 32
    for bad in ("ab" * 32, "sha256:" + "ab" * 31, "sha256:" + "zz" * 32, "md5:00"):
        with pytest.raises(TrustError) as info:
            parse_root_pin(bad)
        assert info.value.reason == "MalformedRootPin"


def test_image_root_conflicting_with_the_accepted_root_blocks_artifacts(
    tmp_path: Path, keys: dict[str, Key], model_bytes: tuple[bytes, bytes]
) -> None:
    """A device that once took a hub's root (before pins existed) finds the image's root of the
    same version: a conflict, reported, and artifacts are refused until it is resolved."""
    device = Device(tmp_path, keys, None)
    hub_root = make_root(keys, root=("stranger",), artifacts=("stranger",))
    device.gate.accept_roots(hub_root.to_bytes(), NOW, origin="hub", anchor=root_digest(hub_root))
    device.root_file.write_bytes(make_root(keys).to_bytes())
    device.reopen()
    device.gate.begin()
    status = device.gate.status()
    assert status["rootProblem"]["reason"] == "RootConflict"
    assert status["blocked"]["reason"] == "RootConflict"
    with pytest.raises(TrustError) as info:
        device.admit(device.publish(model_bytes[0]))
    assert info.value.reason == "RootConflict"
    assert not device.store.digests()


def test_image_root_reformatted_is_no_conflict(
    tmp_path: Path, keys: dict[str, Key], model_bytes: tuple[bytes, bytes]
) -> None:
    v1 = make_root(keys)
    device = Device(tmp_path, keys, v1)
    device.gate.begin()
    device.root_file.write_bytes(orjson.dumps(v1.to_json()) + b"\n")
    device.reopen()
    device.gate.begin()
    assert device.gate.status()["rootProblem"] is None
    device.admit(device.publish(model_bytes[0]))


def test_older_image_root_after_a_rotation_is_fine(
    tmp_path: Path, keys: dict[str, Key], model_bytes: tuple[bytes, bytes]
) -> None:
    v1, v2 = make_root(keys), rotated(keys, 2, new="newroot1", old="root1")
    device = Device(tmp_path, keys, v1)
    device.gate.begin()
    assert device.gate.accept_roots(v2.to_bytes(), NOW, origin="hub") is not None
    device.reopen()
    device.gate.begin()
    assert device.gate.status()["rootVersion"] == 2 and device.gate.blocked is None
    assert device.gate.state.root_digests == {1: root_digest(v1), 2: root_digest(v2)}


def test_lost_trust_state_table() -> None:
    s2 = TrustState(2, {}, {2: "aa"})
    cases = [
        ("fresh device", False, TrustState(), None, None, None),
        ("consistent", True, s2, 2, "aa", None),
        ("state deleted", False, TrustState(), 2, "aa", "TrustStateLost"),
        ("root deleted", True, s2, None, None, "TrustStateLost"),
        ("root replaced by an older one", True, s2, 1, "bb", "TrustStateLost"),
        ("root replaced, same version", True, s2, 2, "bb", "TrustStateLost"),
        ("crash between the two writes", True, TrustState(1, {}, {1: "cc"}), 2, "aa", None),
    ]
    for case, exists, state, version, digest, want in cases:
        got = lost_trust_state(
            state_exists=exists, state=state, root_version=version, root_digest=digest
        )
        assert (got[0] if got else None) == want, case


def test_deleting_the_trust_state_is_detected(
    tmp_path: Path, keys: dict[str, Key], model_bytes: tuple[bytes, bytes]
) -> None:
    """Deleting state.json would reset rollback protection: the gate refuses artifacts."""
    device = Device(tmp_path, keys, make_root(keys))
    device.admit(device.publish(model_bytes[0], version="2.0.0", metadata_version=20))
    device.gate.state_path.unlink()
    device.reopen()
    device.gate.begin()  # the image root does not lift it
    assert device.gate.status()["blocked"]["reason"] == "TrustStateLost"
    with pytest.raises(TrustError) as info:
        device.admit(device.publish(model_bytes[1], version="1.0.0", metadata_version=5))
    assert info.value.reason == "TrustStateLost"


def test_deleting_the_accepted_root_is_detected(
    tmp_path: Path, keys: dict[str, Key], model_bytes: tuple[bytes, bytes]
) -> None:
    v1, v2 = make_root(keys), rotated(keys, 2, new="newroot1", old="root1")
    device = Device(tmp_path, keys, v1)
    device.gate.begin()
    device.gate.accept_roots(v2.to_bytes(), NOW, origin="hub")
    device.gate.root_path.unlink()  # the image's v1 would be taken again
    device.reopen()
    device.gate.begin()
    assert device.gate.status()["blocked"]["reason"] == "TrustStateLost"
    assert device.gate.root is None


def test_edged_status_says_when_every_artifact_is_refused(
    tmp_path: Path, keys: dict[str, Key]
) -> None:
    from edgefleet.devicestatus import render_status

    device = Device(tmp_path, keys, make_root(keys))
    device.gate.begin()
    device.gate.state_path.unlink()
    device.reopen()
    text = render_status({"device": {"trust": device.gate.status()}})
    assert "WARNING: every artifact is refused: TrustStateLost: " in text
