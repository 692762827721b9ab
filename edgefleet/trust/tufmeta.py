"""The fleet's TUF repository metadata, through python-tuf's Metadata API (DSSE envelopes).

TUF adds what the per-artifact envelopes lack (docs/trust.md, "TUF roles"):

* **root** (``root.json``): the keys of the other roles; signed offline by the same root keys
  as the fleet trust root, so a device takes its first TUF root only when a threshold of the
  fleet root's root keys signed it (:func:`verify_by_fleet_root`), then follows TUF root
  rotations with python-tuf's client.
* **targets** (``targets.json``): signed offline by the fleet's targets keys; it lists no
  artifact itself, only **delegations**: a publisher role, its keys and threshold, and the
  model names it may sign (``vision-*``), as TUF path patterns ``vision-*/*/*``.
* **delegated targets** (``<publisher>.json``): signed offline by a publisher; every file of
  every artifact it publishes, as target ``NAME/VERSION/FILE`` with length and sha256.
* **snapshot** and **timestamp**: signed online by the hub (the only keys it holds): the
  signed current set of targets metadata versions, and a short freeze bound.

The hub cannot author targets: a device admits an artifact the hub assigns only when the
publisher's delegated targets list every file of it with the signed length and sha256
(:func:`check_assigned`). Envelopes are DSSE (payload type ``application/vnd.tuf+json``),
the same envelope format as the rest of the trust layer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefleet.errors import TrustError
from edgefleet.trust.documents import (
    ArtifactMetadata,
    RollbackAllowance,
    format_time,
    parse_rollback,
)
from edgefleet.trust.envelopes import key_id

if TYPE_CHECKING:
    from securesystemslib.signer import Signer, SSlibKey
    from tuf.api.metadata import Root, Snapshot, TargetFile, Targets, Timestamp

ROOT = "root"
TARGETS = "targets"
SNAPSHOT = "snapshot"
TIMESTAMP = "timestamp"
TOP_ROLES = (ROOT, TARGETS, SNAPSHOT, TIMESTAMP)
SPEC_VERSION = "1.0.31"

# Bounds on what a device reads (python-tuf's UpdaterConfig) and the hub accepts.
ROOT_MAX_BYTES = 512 * 1024
TIMESTAMP_MAX_BYTES = 16 * 1024
SNAPSHOT_MAX_BYTES = 1024 * 1024
TARGETS_MAX_BYTES = 3 * 1024 * 1024  # within the device channel's 4 MiB message limit
MAX_DELEGATIONS = 1000
CUSTOM_FIELD = "edgefleet"
ROLLBACK_FIELD = "rollbackAllowance"  # in the custom field of an artifact's model target


def role_file(role: str) -> str:
    """A metadata file name (``timestamp.json``, ``vision.json``)."""
    return f"{role}.json"


def valid_role_name(role: str) -> bool:
    """A delegated role name usable as a file name: letters, digits, ``-``, ``_``, ``.``."""
    return (
        0 < len(role) <= 64
        and role not in TOP_ROLES
        and not role.startswith(".")
        and all(c.isalnum() or c in "-_." for c in role)
        and role.isascii()
    )


# -- keys ---------------------------------------------------------------------------------------


def tuf_key(public_raw: bytes) -> SSlibKey:
    """A TUF key for a raw Ed25519 public key, with the fleet's key id (sha256 of the key)."""
    from securesystemslib.signer import SSlibKey

    return SSlibKey(key_id(public_raw), "ed25519", "ed25519", {"public": public_raw.hex()})


def raw_keys(keys: Mapping[str, Any], keyids: Iterable[str]) -> dict[str, bytes]:
    """The raw Ed25519 public keys of ``keyids`` among TUF ``keys`` (key id -> python-tuf
    ``Key``), as the fleet's envelopes verify them; a key of another type is left out (it
    cannot sign the fleet's envelopes)."""
    out: dict[str, bytes] = {}
    for kid in keyids:
        key = keys.get(kid)
        if key is None or getattr(key, "keytype", None) != "ed25519":
            continue
        public = key.keyval.get("public") if isinstance(key.keyval, dict) else None
        try:
            raw = bytes.fromhex(public) if isinstance(public, str) else b""
        except ValueError:
            continue
        if len(raw) == 32:
            out[kid] = raw
    return out


def tuf_signer(private_key_path: Path) -> Signer:
    """A python-tuf signer for an Ed25519 PEM private key (``edgectl keys generate``)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    from securesystemslib.signer import CryptoSigner

    from edgefleet.trust.signing import load_private_key

    priv = load_private_key(private_key_path)
    raw = priv.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return CryptoSigner(priv, tuf_key(raw))


def _expiry(epoch: float) -> datetime:
    return datetime.fromtimestamp(int(epoch), tz=UTC)


# -- targets of an artifact ---------------------------------------------------------------------


def target_path(name: str, version: str, fname: str) -> str:
    """The TUF target path of one file of an artifact: ``NAME/VERSION/FILE``."""
    return f"{name}/{version}/{fname}"


def name_pattern_paths(patterns: Iterable[str]) -> list[str]:
    """Model-name patterns (``vision-*``) as TUF delegation paths (``vision-*/*/*``): in TUF
    a ``*`` does not cross a ``/``, so a pattern limits the model name only."""
    out = []
    for p in patterns:
        if not p or "/" in p or len(p) > 128:
            raise TrustError(
                "MalformedMetadata", f"a model-name pattern is 1-128 characters without '/': {p!r}"
            )
        out.append(f"{p}/*/*")
    return out


def artifact_targets(
    meta: ArtifactMetadata, *, rollback_expires: float | None = None
) -> dict[str, TargetFile]:
    """The target of every file of ``meta``, with length, sha256 and a custom field naming
    the artifact and the file's role. ``rollback_expires``: the model's target also carries
    a **rollback allowance** until then, bound to the model's sha256 (a device that accepted
    a higher version admits exactly these bytes again: :func:`rollback_grant`)."""
    from tuf.api.metadata import TargetFile

    out = {}
    for fname, info in sorted(meta.files.items()):
        path = target_path(meta.name, meta.version, fname)
        custom: dict[str, Any] = {"name": meta.name, "version": meta.version, "role": info.role}
        if rollback_expires is not None and info.role == "model":
            custom[ROLLBACK_FIELD] = {
                "sha256": info.sha256,
                "expires": format_time(rollback_expires),
            }
        out[path] = TargetFile(
            info.length,
            {"sha256": info.sha256},
            path,
            unrecognized_fields={"custom": {CUSTOM_FIELD: custom}},
        )
    return out


def rollback_grant(target: TargetFile | None, *, what: str) -> RollbackAllowance | None:
    """The rollback allowance a publisher's targets carry on a model's target (custom field
    ``edgefleet.rollbackAllowance``: ``{"sha256": HEX, "expires": TIME}``), or None. Signed by
    the delegated publisher (python-tuf verified the role) and bound to the digest it names;
    the device checks name, version, digest and expiry (``check_model_version``)."""
    if target is None:
        return None
    custom = target.unrecognized_fields.get("custom")
    ours = custom.get(CUSTOM_FIELD) if isinstance(custom, dict) else None
    raw = ours.get(ROLLBACK_FIELD) if isinstance(ours, dict) else None
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"sha256", "expires"}:
        raise TrustError(
            "MalformedMetadata",
            f"{what}: custom.{CUSTOM_FIELD}.{ROLLBACK_FIELD} must be "
            '{"sha256": HEX, "expires": TIME}',
        )
    assert isinstance(ours, dict)
    doc = {"_type": "rollback", "name": ours.get("name"), "version": ours.get("version"), **raw}
    return parse_rollback(doc, what=what)


def check_assigned(lookup: Callable[[str], TargetFile | None], meta: ArtifactMetadata) -> None:
    """Every file of ``meta`` is a target of a publisher's (delegated) targets with the same
    length and sha256 (``lookup``: python-tuf's ``Updater.get_targetinfo``, which walks the
    delegations from the top-level targets). ``NotInTargets`` or ``TargetMismatch``."""
    for fname, info in sorted(meta.files.items()):
        path = target_path(meta.name, meta.version, fname)
        target = lookup(path)
        if target is None:
            raise TrustError(
                "NotInTargets",
                f"{meta.name} {meta.version}: {fname} is in no publisher's signed targets "
                f"(TUF target {path}): the hub assigned an artifact no delegated publisher "
                "signed, or one its snapshot no longer lists",
            )
        if target.length != info.length or target.hashes.get("sha256") != info.sha256:
            raise TrustError(
                "TargetMismatch",
                f"{meta.name} {meta.version}: {fname} is signed in the TUF targets with "
                f"length {target.length} and sha256 {target.hashes.get('sha256')}, the "
                f"artifact metadata says {info.length} and {info.sha256}",
            )


# -- building and signing -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Delegation:
    """A publisher role in the top-level targets: its keys, threshold and model names; or,
    with ``agent``, the role of agent releases (its only path ``agent/edged/*/*``,
    edgefleet.trust.agentreleases), with no model names."""

    role: str
    keys: tuple[bytes, ...]  # raw Ed25519 public keys
    threshold: int
    name_patterns: tuple[str, ...]
    agent: bool = False

    @property
    def paths(self) -> list[str]:
        from edgefleet.trust.agentreleases import AGENT_PATH_PATTERN

        if self.agent:
            if self.name_patterns:
                raise TrustError(
                    "MalformedMetadata",
                    f"delegation {self.role}: an agent-release role signs no model names",
                )
            return [AGENT_PATH_PATTERN]
        return name_pattern_paths(self.name_patterns)


def build_root(
    *,
    root_keys: Sequence[bytes],
    root_threshold: int,
    targets_keys: Sequence[bytes],
    targets_threshold: int,
    online_keys: Sequence[bytes],
    version: int,
    expires: float,
) -> Root:
    """A TUF root: root and targets keys offline, snapshot and timestamp keys online (the
    hub's). Not consistent snapshots: the hub serves each role's newest file by name."""
    from tuf.api.metadata import Role, Root

    root = Root(version=version, expires=_expiry(expires), consistent_snapshot=False)
    for role, keys, threshold in (
        (ROOT, root_keys, root_threshold),
        (TARGETS, targets_keys, targets_threshold),
        (SNAPSHOT, online_keys, 1),
        (TIMESTAMP, online_keys, 1),
    ):
        if not keys or threshold < 1 or threshold > len(set(keys)):
            raise TrustError(
                "MalformedMetadata", f"TUF root: role {role} needs 1..{len(keys)} keys"
            )
        root.roles[role] = Role([], threshold)
        for raw in keys:
            root.add_key(tuf_key(raw), role)
    return root


def build_targets(delegations: Sequence[Delegation], *, version: int, expires: float) -> Targets:
    """The top-level targets: no targets of its own, one delegation per publisher."""
    from tuf.api.metadata import DelegatedRole, Delegations, Key, Targets

    if len(delegations) > MAX_DELEGATIONS:
        raise TrustError("MalformedMetadata", f"more than {MAX_DELEGATIONS} delegations")
    keys: dict[str, Key] = {}
    roles = {}
    for d in delegations:
        if not valid_role_name(d.role):
            raise TrustError("MalformedMetadata", f"delegated role name {d.role!r} is not usable")
        if not d.keys or d.threshold < 1 or d.threshold > len(set(d.keys)):
            raise TrustError(
                "MalformedMetadata", f"delegation {d.role}: threshold 1..{len(set(d.keys))}"
            )
        for raw in d.keys:
            k = tuf_key(raw)
            keys[k.keyid] = k
        roles[d.role] = DelegatedRole(
            d.role,
            sorted({key_id(raw) for raw in d.keys}),
            d.threshold,
            True,  # terminating: a path matched here is decided here
            paths=d.paths,
        )
    return Targets(
        version=version,
        expires=_expiry(expires),
        delegations=Delegations(keys, roles) if roles else None,
    )


def sign(signed: Root | Targets | Snapshot | Timestamp, signers: Iterable[Signer]) -> bytes:
    """A DSSE envelope of ``signed`` with a signature by each signer, as compact bytes."""
    from tuf.api.dsse import SimpleEnvelope

    env: SimpleEnvelope[Any] = SimpleEnvelope.from_signed(signed)
    for s in signers:
        env.sign(s)
    data: bytes = env.to_bytes()
    return data


def parse(data: bytes, expected: type[Any], *, what: str) -> tuple[Any, Any]:
    """``(signed, envelope)`` of a DSSE envelope of TUF metadata of type ``expected``
    (``MalformedMetadata`` otherwise)."""
    from tuf.api.dsse import SimpleEnvelope

    try:
        env = SimpleEnvelope.from_bytes(data)
        signed = env.get_signed()
    except Exception as exc:  # python-tuf raises several kinds for malformed input
        raise TrustError("MalformedMetadata", f"{what}: not TUF metadata in DSSE: {exc}") from None
    if not isinstance(signed, expected):
        raise TrustError(
            "MalformedMetadata",
            f"{what}: is {type(signed).__name__} metadata, expected {expected.__name__}",
        )
    return signed, env


def verify_delegate(delegator: Root | Targets, role: str, data: bytes, *, what: str) -> None:
    """``data`` (a DSSE envelope) is signed by a threshold of ``role``'s keys as
    ``delegator`` (a root or targets) names them (``SignatureThresholdNotMet``)."""
    from tuf.api.dsse import SimpleEnvelope
    from tuf.api.exceptions import UnsignedMetadataError

    env = SimpleEnvelope.from_bytes(data)
    try:
        delegator.verify_delegate(role, env.pae(), env.signatures)
    except UnsignedMetadataError as exc:
        raise TrustError("SignatureThresholdNotMet", f"{what}: {exc}") from None
    except ValueError as exc:
        raise TrustError("UnknownKey", f"{what}: {exc}") from None


def verify_by_fleet_root(
    fleet_root_keys: Mapping[str, bytes],
    keyids: Iterable[str],
    threshold: int,
    data: bytes,
    *,
    what: str,
) -> Root:
    """A first TUF root is trusted when a threshold of the fleet trust root's root keys
    signed it (the same DSSE envelope and key ids as the fleet's own documents)."""
    from tuf.api.metadata import Root

    from edgefleet.trust.envelopes import parse_envelope_bytes, require_threshold

    root, _ = parse(data, Root, what=what)
    env = parse_envelope_bytes(data, what=what)
    require_threshold(env, fleet_root_keys, frozenset(keyids), threshold, what=what)
    verify_delegate(root, ROOT, data, what=f"{what} (by its own root keys)")
    return root  # type: ignore[no-any-return]


# -- the offline ceremony (edgectl trust tuf ...) -------------------------------------------------


def parse_delegation(text: str) -> Delegation:
    """``ROLE=PUB.pub[+PUB2.pub...]:PATTERN[,PATTERN...][@THRESHOLD]`` (``edgectl trust tuf
    targets --delegate``) -> a :class:`Delegation` (``MalformedMetadata`` naming the part)."""
    from edgefleet.trust.signing import load_public_key_raw

    bad = TrustError(
        "MalformedMetadata",
        f"--delegate {text!r}: expected ROLE=PUB.pub[+PUB.pub...]:PATTERN[,PATTERN...]"
        "[@THRESHOLD], e.g. vision=vision.pub:vision-*",
    )
    role, sep, rest = text.partition("=")
    keys_part, sep2, patterns_part = rest.partition(":")
    if not sep or not sep2 or not keys_part or not patterns_part:
        raise bad
    threshold = 1
    if "@" in patterns_part:
        patterns_part, _, t = patterns_part.rpartition("@")
        if not t.isdigit():
            raise bad
        threshold = int(t)
    keys = tuple(load_public_key_raw(Path(k)) for k in keys_part.split("+"))
    patterns = tuple(p for p in patterns_part.split(",") if p)
    if not valid_role_name(role):
        raise TrustError("MalformedMetadata", f"--delegate: role name {role!r} is not usable")
    name_pattern_paths(patterns)  # checks them
    return Delegation(role, keys, threshold, patterns)


def parse_agent_delegation(text: str) -> Delegation:
    """``ROLE=PUB.pub[+PUB.pub...][@THRESHOLD]`` (``edgectl trust tuf targets
    --delegate-agent``) -> the :class:`Delegation` of agent releases."""
    from edgefleet.trust.signing import load_public_key_raw

    role, sep, keys_part = text.partition("=")
    threshold = 1
    if "@" in keys_part:
        keys_part, _, t = keys_part.rpartition("@")
        threshold = int(t) if t.isdigit() else 0
    if not sep or not keys_part or threshold < 1:
        raise TrustError(
            "MalformedMetadata",
            f"--delegate-agent {text!r}: expected ROLE=PUB.pub[+PUB.pub...][@THRESHOLD], e.g. "
            "agent=agent-publisher.pub",
        )
    if not valid_role_name(role):
        raise TrustError("MalformedMetadata", f"--delegate-agent: role name {role!r} is not usable")
    keys = tuple(load_public_key_raw(Path(k)) for k in keys_part.split("+"))
    return Delegation(role, keys, threshold, (), agent=True)


def next_root(
    current: bytes | None,
    *,
    root_keys: Sequence[bytes],
    root_threshold: int,
    targets_keys: Sequence[bytes],
    targets_threshold: int,
    online_keys: Sequence[bytes],
    expires: float,
) -> Root:
    """A TUF root of version 1, or the version after ``current`` (a rotation: sign it with
    a threshold of the current root keys and of its own)."""
    from tuf.api.metadata import Root as TufRoot

    version = 1
    if current is not None:
        old, _ = parse(current, TufRoot, what="the current TUF root")
        version = old.version + 1
    return build_root(
        root_keys=root_keys,
        root_threshold=root_threshold,
        targets_keys=targets_keys,
        targets_threshold=targets_threshold,
        online_keys=online_keys,
        version=version,
        expires=expires,
    )


# -- publishing (a publisher's delegated targets) -------------------------------------------------


def find_role(targets_data: bytes, public_raw: bytes, name: str) -> str:
    """The delegated role of the top-level targets (``targets_data``) that lists the key
    ``public_raw`` and whose model-name patterns match ``name`` (``NoDelegation``)."""
    from tuf.api.metadata import Targets

    targets, _ = parse(targets_data, Targets, what="targets.json")
    kid = key_id(public_raw)
    probe = target_path(name, "0", "f")
    roles = targets.delegations.roles if targets.delegations and targets.delegations.roles else {}
    for role in roles.values():
        if kid in role.keyids and role.is_delegated_path(probe):
            return str(role.name)
    mine = [r.name for r in roles.values() if kid in r.keyids]
    raise TrustError(
        "NoDelegation",
        f"no delegation of the fleet's TUF targets lets key {kid[:16]}... sign {name!r}"
        + (f" (its roles: {', '.join(mine)})" if mine else " (the key is in no role)"),
    )


def add_artifact(
    current: bytes | None,
    meta: ArtifactMetadata,
    signers: Sequence[Signer],
    *,
    expires: float,
    rollback_expires: float | None = None,
) -> bytes:
    """A publisher's delegated targets with the files of ``meta`` added (or replaced), the
    next version, signed by ``signers``. ``current``: the role's metadata the hub holds.
    ``rollback_expires``: with a rollback allowance until then (:func:`artifact_targets`)."""
    from tuf.api.metadata import Targets

    if current:
        signed, _ = parse(current, Targets, what="the delegated targets the hub holds")
        signed.version += 1
    else:
        signed = Targets(version=1)
    signed.expires = _expiry(expires)
    signed.targets.update(artifact_targets(meta, rollback_expires=rollback_expires))
    return sign(signed, signers)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
