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
from edgefleet.trust.versions import compare_versions


@dataclass(frozen=True, slots=True)
class Accepted:
    """What the device accepted for one artifact name."""

    metadata_version: int
    model_version: str


@dataclass(frozen=True, slots=True)
class TrustState:
    """Persisted in ``D/trust/state.json``: never goes down, survives restarts."""

    root_version: int = 0
    artifacts: Mapping[str, Accepted] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "rootVersion": self.root_version,
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
        return TrustState(int(doc.get("rootVersion", 0)), arts)

    def accept(self, meta: ArtifactMetadata) -> TrustState:
        """The state after accepting ``meta``: highest versions only ever go up."""
        old = self.artifacts.get(meta.name)
        mv = (
            meta.metadata_version
            if old is None
            else max(old.metadata_version, meta.metadata_version)
        )
        model = meta.version
        if old is not None and compare_versions(old.model_version, meta.version) > 0:
            model = old.model_version
        return replace(self, artifacts={**self.artifacts, meta.name: Accepted(mv, model)})


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
) -> None:
    """Refuse a model version lower than the highest accepted, unless a valid signed rollback
    allowance names exactly this name and version."""
    accepted = state.artifacts.get(meta.name)
    if accepted is None:
        return
    try:
        older = compare_versions(meta.version, accepted.model_version) < 0
    except ValueError as exc:
        raise TrustError("VersionNotComparable", f"{meta.name}: {exc}") from None
    if not older:
        return
    what = f"{meta.name} {meta.version}"
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
