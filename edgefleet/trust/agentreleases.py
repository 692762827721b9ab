"""edged releases as signed artifacts (issue 32, docs/agent-updates.md "Releases"): pure except
for reading a release file.

A release is a gzip'd tar of ``release.json`` and ``lib/`` (the edgefleet and edged packages
and ``lib/edgefleet-V.dist-info``), built by ``packaging/agent/build-release``.
:func:`inspect_release` reads one within bounds and refuses any entry that is not a plain file
or folder under ``lib/`` (a path that climbs out, a link, a device) and a ``release.json`` or
dist-info that disagrees with the version.

Its **signed metadata** is a DSSE envelope of payload type :data:`AGENT_RELEASE_TYPE`
(distinct from a model's ``application/vnd.edgefleet.artifact+json``, so that neither passes
for the other)::

    {"_type": "agent-release", "name": "edged", "version": "0.2.1",
     "platform": {"arch": "x86_64", "pythonAbi": "cp311"},
     "file": {"name": "edged-0.2.1-x86_64-cp311.tar.gz", "sha256": HEX, "length": N},
     "requires": {"grpcio": "1.85.1", ...}, "created": TIME, "expires": TIME}

**TUF.** The top-level targets delegate agent releases to a role of their own whose only path
pattern is :data:`AGENT_PATH_PATTERN` (``agent/edged/*/*``); the release file is the target
``agent/edged/VERSION/FILE``. A model publisher's delegation (``NAME/VERSION/FILE``, patterns
without ``/``: three components) can never list an agent release (four), and the agent role
can never list a model. The envelope must be signed by a threshold of the keys of the agent
role that lists the file (:func:`check_agent_role`); the fleet trust root's artifacts keys do
not count, so a model publisher cannot sign a release and the agent publisher key (which is in
no artifacts role) cannot sign a model.
"""

from __future__ import annotations

import hashlib
import platform as _platform
import re
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import orjson

from edgefleet.errors import ArtifactError, TrustError
from edgefleet.trust.documents import format_time, parse_time
from edgefleet.trust.envelopes import Envelope, decode_payload, parse_envelope_bytes, sign_envelope
from edgefleet.trust.versions import require_comparable_version

if TYPE_CHECKING:
    from securesystemslib.signer import Signer
    from tuf.api.metadata import TargetFile

    from edgefleet.trust.publishers import DelegatedRole

AGENT_RELEASE_TYPE = "application/vnd.edgefleet.agent-release+json"
RELEASE_NAME = "edged"
RELEASE_FORMAT = 1
AGENT_ROLE = "agent"  # the quickstart's agent delegation (hub init)
AGENT_PATH_PATTERN = "agent/edged/*/*"
AGENT_TARGET_PREFIX = "agent/edged/"
CUSTOM_FIELD = "edgefleet"
RELEASE_FIELD = "agentRelease"

# Bounds on what is read from outside (an operator's file, a hub's desired state).
MAX_RELEASE_BYTES = 64 << 20  # the .tar.gz a push may carry and a device downloads
MAX_UNPACKED_BYTES = 256 << 20  # the sum of its files
MAX_ENTRIES = 20_000
MAX_RELEASE_JSON_BYTES = 64 << 10
MAX_METADATA_BYTES = 64 << 10  # the signed metadata envelope
MAX_REQUIRES = 200
_SHA256 = re.compile(r"[0-9a-f]{64}")
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+\-]{0,63}")
_ARCH = re.compile(r"[a-z0-9_]{1,32}")
_ABI = re.compile(r"cp3[0-9]{1,2}")
_DIST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,127}")
_DIST_VERSION = re.compile(r"[0-9A-Za-z.+!\-_]{1,64}")


def _bad(what: str, field_path: str, msg: str) -> TrustError:
    return TrustError("MalformedMetadata", f"{what}: {field_path}: {msg}")


def _malformed(what: str, msg: str) -> ArtifactError:
    return ArtifactError("MalformedRelease", f"{what}: {msg}")


# -- platform ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Platform:
    """What a release runs on: the machine (``x86_64``, ``aarch64``) and the CPython ABI
    (``cp311``) of the device's base install."""

    arch: str
    python_abi: str

    def to_json(self) -> dict[str, str]:
        return {"arch": self.arch, "pythonAbi": self.python_abi}

    def __str__(self) -> str:
        return f"{self.arch}/{self.python_abi}"


def this_platform() -> Platform:
    """The platform of the running interpreter."""
    return Platform(_platform.machine().lower(), f"cp{sys.version_info[0]}{sys.version_info[1]}")


def _platform_of(doc: object, what: str, at: str) -> Platform:
    if not isinstance(doc, dict):
        raise _bad(what, at, 'must be {"arch": "x86_64", "pythonAbi": "cp311"}')
    arch, abi = doc.get("arch"), doc.get("pythonAbi")
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise _bad(what, f"{at}.arch", f"must be a machine name such as x86_64, got {arch!r}")
    if not isinstance(abi, str) or not _ABI.fullmatch(abi):
        raise _bad(what, f"{at}.pythonAbi", f"must be a CPython ABI such as cp311, got {abi!r}")
    return Platform(arch, abi)


def check_version_text(version: object, *, what: str, at: str = "version") -> str:
    """A release version: comparable (``0.2.1``, ``1.0.0-rc.1``), usable in a path."""
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise _bad(what, at, f"must be a version such as 0.2.1, got {version!r}")
    require_comparable_version(version, what=what)
    return version


def _requires(doc: object, what: str, at: str) -> dict[str, str]:
    if not isinstance(doc, dict) or len(doc) > MAX_REQUIRES:
        raise _bad(what, at, f"must be an object of at most {MAX_REQUIRES} distribution -> version")
    out = {}
    for name, version in doc.items():
        if not _DIST.fullmatch(name) or not isinstance(version, str):
            raise _bad(what, f"{at}.{name}", "must be a distribution name and its version")
        if not _DIST_VERSION.fullmatch(version):
            raise _bad(what, f"{at}.{name}", f"must be a version, got {version!r}")
        out[name] = version
    return out


# -- release.json and the tarball ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReleaseManifest:
    """``release.json`` of a release tarball."""

    version: str
    platform: Platform
    requires: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RELEASE_FORMAT,
            "name": RELEASE_NAME,
            "version": self.version,
            "platform": self.platform.to_json(),
            "requires": dict(sorted(self.requires.items())),
        }


def parse_release_json(data: bytes, *, what: str = "release.json") -> ReleaseManifest:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _malformed(what, "is not valid JSON") from None
    if not isinstance(doc, dict):
        raise _malformed(what, "is not a JSON object")
    if doc.get("format") != RELEASE_FORMAT:
        raise _malformed(what, f"format must be {RELEASE_FORMAT}, got {doc.get('format')!r}")
    if doc.get("name") != RELEASE_NAME:
        raise _malformed(what, f"name must be {RELEASE_NAME!r}, got {doc.get('name')!r}")
    try:
        return ReleaseManifest(
            check_version_text(doc.get("version"), what=what),
            _platform_of(doc.get("platform"), what, "platform"),
            _requires(doc.get("requires", {}), what, "requires"),
        )
    except TrustError as exc:
        raise ArtifactError("MalformedRelease", str(exc)) from None


def _safe_member_name(name: str) -> str | None:
    """The normalised name of a tar entry, or None when it is not a plain relative path."""
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        return None
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if not parts or any(p == ".." for p in parts):
        return None
    return "/".join(parts)


def inspect_release(
    path: Path, *, what: str | None = None, max_bytes: int = MAX_RELEASE_BYTES
) -> ReleaseManifest:
    """Read a release tarball within bounds and return its ``release.json``.
    ``ArtifactError``: ``ReleaseTooLarge``, ``UnsafeReleasePath`` (an entry that is absolute,
    climbs out with ``..``, a link or anything but a file or folder, or outside ``release.json``
    and ``lib/``), ``MalformedRelease`` (not a gzip'd tar, no or a bad ``release.json``, a
    dist-info whose version is not the release's)."""
    what = what or str(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise ArtifactError(
            "ReleaseTooLarge", f"{what}: {size} bytes, more than the {max_bytes} a release may be"
        )
    manifest_bytes: bytes | None = None
    metadata_text: dict[str, bytes] = {}
    total = count = 0
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for member in tar:
                count += 1
                if count > MAX_ENTRIES:
                    raise ArtifactError(
                        "ReleaseTooLarge", f"{what}: more than {MAX_ENTRIES} entries"
                    )
                name = _safe_member_name(member.name)
                if name is None:
                    raise ArtifactError(
                        "UnsafeReleasePath", f"{what}: entry {member.name!r} is not a relative path"
                    )
                if not (member.isfile() or member.isdir()):
                    raise ArtifactError(
                        "UnsafeReleasePath",
                        f"{what}: entry {name!r} is a link or a special file; a release holds "
                        "only files and folders",
                    )
                if name not in {"release.json", "lib"} and not name.startswith("lib/"):
                    raise ArtifactError(
                        "UnsafeReleasePath",
                        f"{what}: entry {name!r} is outside release.json and lib/",
                    )
                total += member.size
                if total > MAX_UNPACKED_BYTES:
                    raise ArtifactError(
                        "ReleaseTooLarge",
                        f"{what}: unpacks to more than {MAX_UNPACKED_BYTES} bytes",
                    )
                if name == "release.json" and member.isfile():
                    if member.size > MAX_RELEASE_JSON_BYTES or manifest_bytes is not None:
                        raise _malformed(what, "release.json is repeated or too large")
                    f = tar.extractfile(member)
                    manifest_bytes = f.read(MAX_RELEASE_JSON_BYTES + 1) if f else b""
                elif member.isfile() and re.fullmatch(r"lib/[^/]+\.dist-info/METADATA", name):
                    f = tar.extractfile(member)
                    metadata_text[name] = f.read(MAX_RELEASE_JSON_BYTES) if f else b""
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        if isinstance(exc, ArtifactError):
            raise
        raise _malformed(what, f"is not a gzip'd tar: {exc}") from None
    if manifest_bytes is None:
        raise _malformed(what, "has no release.json")
    manifest = parse_release_json(manifest_bytes, what=f"{what}: release.json")
    expected = f"lib/edgefleet-{manifest.version}.dist-info/METADATA"
    meta = metadata_text.get(expected)
    if meta is None or f"\nVersion: {manifest.version}\n" not in meta.decode(errors="replace"):
        raise _malformed(
            what,
            f"{expected} is missing or does not say Version: {manifest.version} (the release "
            "must report its own version)",
        )
    others = sorted(set(metadata_text) - {expected})
    if any(n.startswith("lib/edgefleet-") for n in others):
        raise _malformed(what, f"more than one edgefleet dist-info: {', '.join(others)}")
    return manifest


def file_digest(path: Path) -> tuple[str, int]:
    """``(sha256 hex, length)`` of a file."""
    h = hashlib.sha256()
    length = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            length += len(chunk)
    return h.hexdigest(), length


# -- the signed metadata ---------------------------------------------------------------------------


def release_file_name(version: str, plat: Platform) -> str:
    """``edged-0.2.1-x86_64-cp311.tar.gz``: one file per release and platform."""
    return f"{RELEASE_NAME}-{version}-{plat.arch}-{plat.python_abi}.tar.gz"


def target_path(version: str, file_name: str) -> str:
    """The TUF target of a release file: ``agent/edged/VERSION/FILE``."""
    return f"{AGENT_TARGET_PREFIX}{version}/{file_name}"


@dataclass(frozen=True, slots=True)
class AgentReleaseMetadata:
    version: str
    platform: Platform
    file_name: str
    sha256: str
    length: int
    requires: Mapping[str, str]
    created: float
    expires: float

    @property
    def target(self) -> str:
        return target_path(self.version, self.file_name)

    @property
    def what(self) -> str:
        return f"edged {self.version} ({self.platform})"


def build_release_metadata(
    path: Path, *, version: str, expires_in_s: float, now: float | None = None
) -> tuple[ReleaseManifest, dict[str, Any]]:
    """The metadata document of the release file at ``path`` (checked first with
    :func:`inspect_release`; its ``release.json`` must say ``version``: ``VersionMismatch``)."""
    manifest = inspect_release(path)
    if manifest.version != version:
        raise ArtifactError(
            "VersionMismatch",
            f"{path}: release.json says version {manifest.version}, not {version}",
        )
    sha, length = file_digest(path)
    now = time.time() if now is None else now
    doc = {
        "_type": "agent-release",
        "name": RELEASE_NAME,
        "version": version,
        "platform": manifest.platform.to_json(),
        "file": {
            "name": release_file_name(version, manifest.platform),
            "sha256": sha,
            "length": length,
        },
        "requires": dict(sorted(manifest.requires.items())),
        "created": format_time(now),
        "expires": format_time(now + expires_in_s),
    }
    return manifest, doc


def sign_release(
    path: Path,
    *,
    version: str,
    private_keys: Iterable[Any],
    expires_in_s: float,
    now: float | None = None,
) -> tuple[AgentReleaseMetadata, Envelope]:
    """The release's signed metadata, an envelope signed by each Ed25519 private key."""
    _, doc = build_release_metadata(path, version=version, expires_in_s=expires_in_s, now=now)
    env = sign_envelope(AGENT_RELEASE_TYPE, doc, private_keys)
    return parse_release_metadata(doc), env


def parse_release_metadata(
    doc: Mapping[str, Any], *, what: str = "agent release metadata"
) -> AgentReleaseMetadata:
    """Every problem a ``MalformedMetadata`` naming the field."""
    if doc.get("_type") != "agent-release":
        raise _bad(what, "_type", "must be 'agent-release'")
    if doc.get("name") != RELEASE_NAME:
        raise _bad(what, "name", f"must be {RELEASE_NAME!r}")
    version = check_version_text(doc.get("version"), what=what)
    plat = _platform_of(doc.get("platform"), what, "platform")
    f = doc.get("file")
    if not isinstance(f, dict):
        raise _bad(what, "file", "must be {name, sha256, length}")
    if f.get("name") != release_file_name(version, plat):
        raise _bad(what, "file.name", f"must be {release_file_name(version, plat)!r}")
    sha = f.get("sha256")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise _bad(what, "file.sha256", "must be 64 lowercase hexadecimal digits")
    length = f.get("length")
    if not isinstance(length, int) or isinstance(length, bool) or not length > 0:
        raise _bad(what, "file.length", "must be a positive integer")
    if length > MAX_RELEASE_BYTES:
        raise TrustError(
            "ReleaseTooLarge", f"{what}: file.length {length} is more than {MAX_RELEASE_BYTES}"
        )
    return AgentReleaseMetadata(
        version=version,
        platform=plat,
        file_name=str(f["name"]),
        sha256=sha,
        length=length,
        requires=_requires(doc.get("requires", {}), what, "requires"),
        created=parse_time(doc.get("created"), "created", what),
        expires=parse_time(doc.get("expires"), "expires", what),
    )


def decode_release(
    data: bytes, *, what: str = "agent release metadata"
) -> tuple[Envelope, AgentReleaseMetadata]:
    """The envelope and the metadata it claims, not yet verified (``MalformedEnvelope``,
    ``WrongPayloadType``: a model's metadata is not a release's, ``MalformedMetadata``)."""
    if len(data) > MAX_METADATA_BYTES:
        raise TrustError("MalformedEnvelope", f"{what}: larger than {MAX_METADATA_BYTES} bytes")
    env = parse_envelope_bytes(data, what=what)
    doc = decode_payload(env, expected_type=AGENT_RELEASE_TYPE, what=what)
    return env, parse_release_metadata(doc, what=what)


def check_not_expired(meta: AgentReleaseMetadata, now: float) -> None:
    if now >= meta.expires:
        raise TrustError(
            "MetadataExpired",
            f"{meta.what}: signed metadata expired at {format_time(meta.expires)}",
        )


def check_platform(meta: AgentReleaseMetadata, plat: Platform) -> None:
    if meta.platform != plat:
        raise TrustError(
            "WrongPlatform",
            f"{meta.what} is built for {meta.platform}; this device runs {plat}",
        )


# -- TUF -----------------------------------------------------------------------------------------


def is_agent_role(paths: Sequence[str] | None) -> bool:
    """Whether a delegated role's paths make it an agent-release role: exactly
    ``[agent/edged/*/*]``, nothing else (no role signs both models and releases)."""
    return list(paths or ()) == [AGENT_PATH_PATTERN]


def check_agent_role(env: Envelope, role: DelegatedRole, paths: Sequence[str] | None) -> None:
    """The TUF role that lists a release file is an agent role (:func:`is_agent_role`:
    ``NotAnAgentRole``) and a threshold of its keys signed the release's envelope
    (``SignerNotDelegated``)."""
    from edgefleet.trust.publishers import check_signed_by_role

    if not is_agent_role(paths):
        raise TrustError(
            "NotAnAgentRole",
            f"TUF role {role.name!r} lists an agent release but its paths are "
            f"{list(paths or ())}, not only {AGENT_PATH_PATTERN!r}",
        )
    check_signed_by_role(env, role, what="agent release")


def release_target(meta: AgentReleaseMetadata) -> dict[str, TargetFile]:
    """The TUF target of the release file, with its length, sha256 and platform."""
    from tuf.api.metadata import TargetFile

    custom = {"version": meta.version, **meta.platform.to_json()}
    return {
        meta.target: TargetFile(
            meta.length,
            {"sha256": meta.sha256},
            meta.target,
            unrecognized_fields={"custom": {CUSTOM_FIELD: {RELEASE_FIELD: custom}}},
        )
    }


def check_listed(lookup: Callable[[str], TargetFile | None], meta: AgentReleaseMetadata) -> None:
    """The release file is a target with the signed length and sha256 (``lookup``: the
    delegated targets' or python-tuf's ``get_targetinfo``): ``NotInTargets``,
    ``TargetMismatch``."""
    target = lookup(meta.target)
    if target is None:
        raise TrustError(
            "NotInTargets",
            f"{meta.what}: {meta.target} is in no agent publisher's signed TUF targets",
        )
    if target.length != meta.length or target.hashes.get("sha256") != meta.sha256:
        raise TrustError(
            "TargetMismatch",
            f"{meta.what}: the TUF targets sign {meta.target} with length {target.length} and "
            f"sha256 {target.hashes.get('sha256')}, the release metadata says {meta.length} and "
            f"{meta.sha256}",
        )


def find_agent_role(targets_data: bytes, public_raw: bytes) -> str:
    """The agent role of the top-level targets that lists key ``public_raw`` (``NoDelegation``)."""
    from tuf.api.metadata import Targets

    from edgefleet.trust import tufmeta
    from edgefleet.trust.envelopes import key_id

    targets, _ = tufmeta.parse(targets_data, Targets, what="targets.json")
    kid = key_id(public_raw)
    roles = targets.delegations.roles if targets.delegations and targets.delegations.roles else {}
    for role in roles.values():
        if kid in role.keyids and is_agent_role(role.paths):
            return str(role.name)
    agent = [r.name for r in roles.values() if is_agent_role(r.paths)]
    raise TrustError(
        "NoDelegation",
        f"no agent-release delegation of the fleet's TUF targets lists key {kid[:16]}... "
        + (
            f"(agent roles: {', '.join(agent)})"
            if agent
            else "(the targets delegate no agent releases: edgectl trust tuf targets "
            "--delegate-agent)"
        ),
    )


def add_release(
    current: bytes | None,
    meta: AgentReleaseMetadata,
    signers: Sequence[Signer],
    *,
    expires: float,
) -> bytes:
    """The agent role's delegated targets with the release file added (or replaced), the next
    version, signed by ``signers``. ``current``: the role's metadata the hub holds."""
    from tuf.api.metadata import Targets

    from edgefleet.trust import tufmeta

    if current:
        signed, _ = tufmeta.parse(current, Targets, what="the agent targets the hub holds")
        signed.version += 1
    else:
        signed = Targets(version=1)
    signed.expires = datetime.fromtimestamp(int(expires), tz=UTC)
    signed.targets.update(release_target(meta))
    return tufmeta.sign(signed, signers)
