"""The decisions of artifact verification: pure functions of documents, state and ``now``.

No I/O and no clock: ``now`` is fixed by the caller at the start of an update, so that every
check of one update sees the same time. Each function raises ``TrustError(reason, message)``
with one of the reasons listed in docs/trust.md, or returns what it verified. The order of
checks for artifact metadata is the one in docs/trust.md: root valid → signatures meet the
threshold → not expired → metadata version not lower than the highest accepted; then (apart)
the model version against the highest accepted model version, unless a signed rollback
allowance covers it. Length and digest are enforced while the bytes stream into the store
(:class:`SignedFile`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from edgefleet.artifacts.storing import StagedArtifact
from edgefleet.errors import TrustError
from edgefleet.trust.documents import (
    ROLE_ARTIFACTS,
    ROLE_ROOT,
    ArtifactMetadata,
    FileInfo,
    RollbackAllowance,
    Root,
    format_time,
    parse_artifact,
    parse_rollback,
    parse_root,
)
from edgefleet.trust.envelopes import (
    ARTIFACT_TYPE,
    ROLLBACK_TYPE,
    ROOT_TYPE,
    Envelope,
    decode_payload,
    require_threshold,
)
from edgefleet.trust.versions import compare_versions, require_comparable_version, version_key

ROOT_HISTORY_MAX = 1000  # root digests remembered (one per rotation)
# where a rollback allowance goes with TUF (edgefleet.trust.tufmeta CUSTOM_FIELD/ROLLBACK_FIELD)
TUF_ALLOWANCE_FIELD = "edgefleet.rollbackAllowance"


@dataclass(frozen=True, slots=True)
class Accepted:
    """What the device accepted for one artifact name."""

    metadata_version: int
    model_version: str


@dataclass(frozen=True, slots=True)
class TrustState:
    """Persisted in ``D/trust/state.json``: never goes down, survives restarts.

    ``root_digests``: the payload digest (:func:`root_digest`) of every root version this
    device accepted, so that "same version, other content" is seen as a conflict."""

    root_version: int = 0
    artifacts: Mapping[str, Accepted] = field(default_factory=dict)
    root_digests: Mapping[int, str] = field(default_factory=dict)
    # the highest TUF root version accepted (0: none): from then on TUF is required, and
    # TUF metadata that went missing is detected (docs/trust.md, "TUF roles")
    tuf_root_version: int = 0
    # the TPM trust-state counter's value this state was written with (0: no TPM counter)
    tpm_counter: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "rootVersion": self.root_version,
            **({"tufRootVersion": self.tuf_root_version} if self.tuf_root_version else {}),
            **({"tpmCounter": self.tpm_counter} if self.tpm_counter else {}),
            "rootDigests": {str(v): d for v, d in sorted(self.root_digests.items())},
            "artifacts": {
                n: {"metadataVersion": a.metadata_version, "modelVersion": a.model_version}
                for n, a in sorted(self.artifacts.items())
            },
        }

    @staticmethod
    def from_json(doc: Any) -> TrustState:
        if not isinstance(doc, dict):
            raise ValueError("trust state is not a JSON object")
        arts = {
            str(n): Accepted(int(a["metadataVersion"]), str(a["modelVersion"]))
            for n, a in dict(doc.get("artifacts", {})).items()
        }
        digests = {int(v): str(d) for v, d in dict(doc.get("rootDigests", {})).items()}
        return TrustState(
            int(doc.get("rootVersion", 0)),
            arts,
            digests,
            int(doc.get("tufRootVersion", 0)),
            int(doc.get("tpmCounter", 0)),
        )

    def with_roots(self, version: int, digests: Mapping[int, str]) -> TrustState:
        """The state after accepting roots up to ``version`` (``digests``: version -> digest
        of each root accepted). The oldest are forgotten past :data:`ROOT_HISTORY_MAX`."""
        merged = {**self.root_digests, **digests}
        kept = dict(sorted(merged.items())[-ROOT_HISTORY_MAX:])
        return replace(self, root_version=max(version, self.root_version), root_digests=kept)

    def accept(self, meta: ArtifactMetadata) -> TrustState:
        """The state after accepting ``meta``: highest versions only ever go up. A recorded
        model version that is not comparable (written before such versions were refused)
        is replaced, so it cannot lock the name."""
        old = self.artifacts.get(meta.name)
        mv = (
            meta.metadata_version
            if old is None
            else max(old.metadata_version, meta.metadata_version)
        )
        model = meta.version
        if (
            old is not None
            and _comparable(old.model_version)
            and compare_versions(old.model_version, meta.version) > 0
        ):
            model = old.model_version
        return replace(self, artifacts={**self.artifacts, meta.name: Accepted(mv, model)})


def _comparable(version: str) -> bool:
    try:
        version_key(version)
    except ValueError:
        return False
    return True


def lost_trust_state(
    *, state_exists: bool, state: TrustState, root_version: int | None, root_digest: str | None
) -> tuple[str, str] | None:
    """Whether the persisted trust state was lost or rolled back (pure): ``(reason, message)``
    or None. The accepted root (``root.json``) and the state (``state.json``) are written
    together, root first; one without the other, or a root older than the state's root
    version, means files were deleted or replaced, and the highest accepted versions (the
    rollback protection) cannot be trusted any more."""
    fix = "remove the whole trust directory to start again from the image's root"
    if root_version is not None and not state_exists:
        return (
            "TrustStateLost",
            f"the trust state is missing although root version {root_version} is accepted: "
            f"rollback protection was reset ({fix})",
        )
    if state.root_version > 0 and (root_version is None or root_version < state.root_version):
        have = "missing" if root_version is None else f"version {root_version}"
        return (
            "TrustStateLost",
            f"the accepted root is {have}, but root version {state.root_version} was "
            f"accepted: the root file was deleted or replaced ({fix})",
        )
    if root_version is not None and state.root_digests.get(root_version) not in (
        None,
        root_digest,
    ):
        return (
            "TrustStateLost",
            f"the accepted root of version {root_version} is not the one this device "
            f"accepted (sha256:{state.root_digests[root_version]}): it was replaced ({fix})",
        )
    return None


# -- roots --------------------------------------------------------------------------------------


def check_root_usable(root: Root | None, now: float) -> Root:
    if root is None:
        raise TrustError(
            "NoTrustRoot",
            "no trust root: set trust.rootFile (or enroll) so signed artifacts can be verified",
        )
    if now >= root.expires:
        raise TrustError(
            "RootExpired",
            f"trust root version {root.version} expired at {format_time(root.expires)}",
        )
    return root


def _root_of(env: Envelope, what: str) -> Root:
    return parse_root(decode_payload(env, expected_type=ROOT_TYPE, what=what), what=what)


def verify_initial_root(env: Envelope, now: float, *, what: str = "trust root") -> Root:
    """A first root (from the device image or enrollment): a threshold of its own root keys."""
    root = _root_of(env, what)
    r = root.role(ROLE_ROOT)
    require_threshold(env, root.keys, r.keyids, r.threshold, what=what)
    return check_root_usable(root, now)


def verify_root_update(current: Root, env: Envelope, *, what: str = "new trust root") -> Root:
    """One rotation step: version exactly current+1, signed by a threshold of the current
    root's root keys AND a threshold of the new root's own root keys. Expiry is checked on the
    last root of a chain (:func:`update_root`), as TUF does."""
    new = _root_of(env, what)
    if new.version != current.version + 1:
        raise TrustError(
            "RootVersionNotNext",
            f"{what}: version {new.version} does not follow the accepted version "
            f"{current.version} (expected {current.version + 1})",
        )
    old_role = current.role(ROLE_ROOT)
    require_threshold(
        env,
        current.keys,
        old_role.keyids,
        old_role.threshold,
        what=f"{what} (by the old root keys)",
    )
    new_role = new.role(ROLE_ROOT)
    require_threshold(
        env, new.keys, new_role.keyids, new_role.threshold, what=f"{what} (by its own root keys)"
    )
    return new


def update_root(current: Root, chain: Sequence[Envelope], now: float) -> Root:
    """Follow ``chain`` (versions current+1, current+2, ...) and return the last root."""
    root = current
    for env in chain:
        root = verify_root_update(root, env)
    return check_root_usable(root, now)


def root_digest(env: Envelope) -> str:
    """What identifies a root: the sha256 (hex) of its signed payload. The envelope's
    formatting (indentation, a trailing newline) and its signature list do not change it, so
    pins, conflicts and attestation compare roots by this, never by file bytes."""
    return hashlib.sha256(env.payload).hexdigest()


def parse_root_pin(pin: str) -> str:
    """``sha256:<64 hex>`` (a root pin, as printed by ``edgectl trust root create``) -> hex."""
    hexpart = pin.strip().lower().removeprefix("sha256:")
    if not pin.strip().lower().startswith("sha256:") or len(hexpart) != 64:
        raise TrustError("MalformedRootPin", f"a root pin is sha256:<64 hex digits>, got {pin!r}")
    try:
        bytes.fromhex(hexpart)
    except ValueError:
        raise TrustError(
            "MalformedRootPin", f"a root pin is sha256:<64 hex digits>, got {pin!r}"
        ) from None
    return hexpart


@dataclass(frozen=True, slots=True)
class RootUpdate:
    """What :func:`follow_roots` accepted: the last root, its envelope, and the digest of
    every root accepted on the way (version -> digest). ``changed`` is False when nothing
    newer was found (the roots offered were all known)."""

    root: Root
    envelope: Envelope | None
    digests: Mapping[int, str]
    changed: bool


def follow_roots(
    current: Root | None,
    known: Mapping[int, str],
    envelopes: Sequence[Envelope],
    now: float,
    *,
    anchor: str | None = None,
    what: str = "trust root",
) -> RootUpdate:
    """Decide which of the offered roots to accept (pure).

    Without a ``current`` root, the first root is the offered one whose digest equals
    ``anchor`` (a pin), or the first offered one when ``anchor`` is None (a file from the
    device image: trusted by being there). It needs a threshold of its own root keys; expiry
    is checked only on the last root, as TUF does. Then every offered root newer than the
    current one must follow it one version at a time, signed by the old and the new root
    thresholds (:func:`verify_root_update`). An offered root of a version already accepted
    with other content (``known``) is a ``RootConflict``: two different roots of one version
    exist, so one of them was not made by the fleet's root keys. Roots older than anything
    known cannot be checked and are passed over."""
    by_version: dict[int, tuple[Envelope, str]] = {}
    for env in envelopes:
        version = _root_of(env, what).version
        digest = root_digest(env)
        seen = by_version.get(version)
        if seen is not None and seen[1] != digest:
            raise TrustError(
                "RootConflict",
                f"{what}: two different roots of version {version} were offered",
            )
        by_version[version] = (env, digest)
    accepted: dict[int, str] = {}
    last: Envelope | None = None
    if current is None:
        if not by_version:
            raise TrustError("NoTrustRoot", f"{what}: no root was offered")
        if anchor is None:
            first = envelopes[0]
        else:
            match = [e for e, d in by_version.values() if d == anchor]
            if not match:
                offered = ", ".join(f"v{v} sha256:{d}" for v, (_, d) in sorted(by_version.items()))
                raise TrustError(
                    "RootPinMismatch",
                    f"{what}: no root offered has the pinned digest sha256:{anchor} "
                    f"(offered: {offered})",
                )
            first = match[0]
        root = _root_of(first, what)
        r = root.role(ROLE_ROOT)
        require_threshold(first, root.keys, r.keyids, r.threshold, what=what)
        accepted[root.version] = root_digest(first)
        last = first
        known = {**known, root.version: root_digest(first)}
    else:
        root = current
    for version, (env, digest) in sorted(by_version.items()):
        if version <= root.version:
            if version in known and known[version] != digest:
                raise TrustError(
                    "RootConflict",
                    f"{what}: version {version} differs from the root of that version this "
                    f"device accepted (sha256:{digest} offered, sha256:{known[version]} "
                    "accepted): same version, other content",
                )
            continue
        root = verify_root_update(root, env, what=f"{what} version {version}")
        accepted[version] = digest
        last = env
    check_root_usable(root, now)
    return RootUpdate(root, last, accepted, bool(accepted))


# -- artifacts ----------------------------------------------------------------------------------


def verify_artifact_metadata(
    root: Root | None,
    env: Envelope,
    *,
    now: float,
    state: TrustState,
    what: str = "artifact metadata",
) -> ArtifactMetadata:
    """Root valid, signatures meet the artifacts threshold, not expired, no metadata rollback."""
    root = check_root_usable(root, now)
    role = root.role(ROLE_ARTIFACTS)
    require_threshold(env, root.keys, role.keyids, role.threshold, what=what)
    meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what=what), what=what)
    what = f"{what} of {meta.name} {meta.version}"
    require_comparable_version(meta.version, what=what)
    if now >= meta.expires:
        raise TrustError("MetadataExpired", f"{what}: expired at {format_time(meta.expires)}")
    accepted = state.artifacts.get(meta.name)
    if accepted is not None and meta.metadata_version < accepted.metadata_version:
        raise TrustError(
            "MetadataRollback",
            f"{what}: metadata version {meta.metadata_version} is lower than "
            f"{accepted.metadata_version}, the highest this device accepted",
        )
    return meta


def check_matches(meta: ArtifactMetadata, *, name: str, version: str, model_file: str) -> FileInfo:
    """The signed metadata is for this name, version and model file name."""
    if meta.name != name or meta.version != version:
        raise TrustError(
            "MetadataMismatch",
            f"the signed metadata is for {meta.name} {meta.version}, "
            f"the deployment asks for {name} {version}",
        )
    info = meta.files.get(model_file)
    if info is None or info.role != "model":
        signed, _ = meta.model_file()
        raise TrustError(
            "FileNotSigned",
            f"{name} {version}: model file {model_file!r} is not the signed model file "
            f"({signed!r})",
        )
    return info


def check_model_version(
    meta: ArtifactMetadata,
    *,
    state: TrustState,
    root: Root,
    allowance: Envelope | None,
    now: float,
    grant: RollbackAllowance | None = None,
    tuf: bool = False,
) -> None:
    """Refuse a model version lower than the highest accepted, unless a valid signed rollback
    allowance names exactly this name, version and model sha256: ``grant``, the one in the
    publisher's TUF targets (custom field of the model's target, verified by python-tuf), or
    else ``allowance``, a separate envelope signed by artifacts keys.

    With ``tuf`` (the device uses TUF) only ``grant`` counts: a separate envelope may be
    signed by any artifacts key, so by a publisher not delegated this model name, and it is
    refused (``RollbackAllowanceNotInTargets``) rather than honoured."""
    accepted = state.artifacts.get(meta.name)
    if accepted is None or not _comparable(accepted.model_version):
        return  # nothing accepted, or a version recorded before such versions were refused
    require_comparable_version(meta.version, what=f"{meta.name} {meta.version}")
    if compare_versions(meta.version, accepted.model_version) >= 0:
        return
    what = f"{meta.name} {meta.version}"
    if grant is not None:
        gwhat = f"rollback allowance in the TUF targets for {what}"
        _, model = meta.model_file()
        if (grant.name, grant.version) != (meta.name, meta.version):
            raise TrustError(
                "RollbackAllowanceMismatch",
                f"{gwhat}: the allowance is for {grant.name} {grant.version}",
            )
        if grant.sha256 != model.sha256:
            raise TrustError(
                "RollbackAllowanceMismatch",
                f"{gwhat}: the allowance is for other bytes (sha256 {grant.sha256}, the signed "
                f"model is {model.sha256})",
            )
        if now >= grant.expires:
            raise TrustError(
                "RollbackAllowanceExpired", f"{gwhat}: expired at {format_time(grant.expires)}"
            )
        return
    if tuf and allowance is not None:
        raise TrustError(
            "RollbackAllowanceNotInTargets",
            f"{what} is older than {accepted.model_version}, the highest version this device "
            f"accepted, and its rollback allowance is a separate envelope: with TUF, only an "
            f"allowance in the publisher's own targets counts (custom {TUF_ALLOWANCE_FIELD} of "
            f"the model's target; edgectl models push ... --allow-rollback DURATION)",
        )
    if allowance is None:
        raise TrustError(
            "ModelVersionRollback",
            f"{what} is older than {accepted.model_version}, the highest version this device "
            "accepted, and no signed rollback allowance covers it",
        )
    awhat = f"rollback allowance for {what}"
    role = root.role(ROLE_ARTIFACTS)
    require_threshold(allowance, root.keys, role.keyids, role.threshold, what=awhat)
    allow = parse_rollback(
        decode_payload(allowance, expected_type=ROLLBACK_TYPE, what=awhat), what=awhat
    )
    if (allow.name, allow.version) != (meta.name, meta.version):
        raise TrustError(
            "RollbackAllowanceMismatch",
            f"{awhat}: the allowance is for {allow.name} {allow.version}",
        )
    _, model = meta.model_file()
    if allow.sha256 != model.sha256:
        raise TrustError(
            "RollbackAllowanceMismatch",
            f"{awhat}: the allowance is for other bytes (sha256 {allow.sha256}, the signed "
            f"model is {model.sha256})",
        )
    if now >= allow.expires:
        raise TrustError(
            "RollbackAllowanceExpired", f"{awhat}: expired at {format_time(allow.expires)}"
        )


class SignedFile:
    """A store verifier: the staged bytes are exactly the signed length and digest.

    Use with ``max_bytes=info.length`` so that a longer stream stops at the limit."""

    def __init__(self, info: FileInfo, what: str) -> None:
        self._info = info
        self._what = what

    def verify(self, staged: StagedArtifact) -> None:
        if staged.length != self._info.length:
            raise TrustError(
                "LengthMismatch",
                f"{self._what}: {staged.origin} is {staged.length} bytes, "
                f"signed length is {self._info.length}",
            )
        if staged.sha256 != self._info.sha256:
            raise TrustError(
                "DigestMismatch",
                f"{self._what}: {staged.origin} has sha256 {staged.sha256}, "
                f"signed sha256 is {self._info.sha256}",
            )
