"""The one exception tree of edgefleet (edged, the hub and edgectl alike).

Every error raised on purpose derives from :class:`EdgefleetError`. Errors of lower layers
(sqlite3, grpc, cryptography, onnxruntime, udev, OS, sockets) are translated at the boundary
where they occur. Errors that only one program raises are defined next to the code that raises
them, still under this root (they are listed here so the whole tree is in one place).

    EdgefleetError
    ├── ConfigError            a config file is invalid (every problem listed, with field paths)
    ├── ValidationError        a manifest or request is invalid (every problem, with field paths)
    ├── ArtifactError          an artifact could not be fetched, verified or stored
    │   └── TrustError         signed metadata, a trust root or an allowance was refused
    ├── StateError             persisted state is unreadable
    ├── ReconcileError         raised by reconcilers; tells the runner how to retry
    │   ├── TemporaryError     retry with per-key exponential backoff
    │   └── PermanentError     do not retry until the key's inputs change
    ├── CriticalComponentError a critical component kept failing (edgefleet.supervising)
    ├── StoreError             the hub's store failed or cannot be opened
    │   ├── CompareFailed      a compare-and-swap (or txn compare) did not hold; nothing written
    │   ├── Compacted          a watch asked for history older than the compaction point
    │   ├── LeaseNotFound      the lease does not exist (never granted, revoked or expired)
    │   ├── StoreUnavailable   the store URL names a backend that is not available
    │   └── StoreIdentityError the store is missing, empty or another hub's; or a backup is
    │                          unusable (hub.state.store.identity)
    ├── PkiError               a certificate, key or CSR is invalid or cannot be made
    │   ├── CsrRejected        a CSR is malformed or its signature does not verify
    │   ├── CaPinMismatch      a presented CA does not match the pinned hash
    │   └── IdentityError      a certificate carries no valid edgefleet identity
    ├── TokenError             a bootstrap token was refused; ``reason`` says why
    ├── HubDirError            the hub data directory is missing, incomplete or already exists
    ├── StreamRefused          a device's message was refused; its Sync stream ends
    (hub.api.devicesync)
    ├── PushRefused            an artifact push was refused (hub.api.push)
    ├── LaunchError            a program started by edgefleet.launching exited or never got ready
    ├── AlreadyRunning         another edged holds the data directory (edged.state.locking)
    ├── DeviceKeyError         the device identity key cannot be made or used (edged.trust.identity)
    ├── TpmAttestationError    the TPM attestation key cannot be made, activated or used
    │                          (edged.trust.tpmattesting)
    ├── EnrollError            enrollment failed (edged.hublink.enrolling)
    ├── UdevError              udev cannot be read (edged.discovery.udev)
    └── EdgectlError           an edgectl command failed; carries its exit code (edgectl.errors)
        ├── UsageError         a wrong command line: unknown type, a flag that does not apply
        ├── InputError         a file or document given to edgectl cannot be used
        └── ClientError        a hub call failed: the gRPC code and the hub's message
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class EdgefleetError(Exception):
    """Base of every error edgefleet raises on purpose."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input, at a field path such as ``spec.runtime.maxBatchSize``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class _ProblemsError(EdgefleetError):
    """Carries every problem found, not just the first."""

    def __init__(self, problems: Iterable[Problem], *, source: str = "") -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.source = source
        lines = [str(p) for p in self.problems]
        prefix = f"{source}: " if source else ""
        if len(lines) == 1:
            text = prefix + lines[0]
        else:
            text = prefix + f"{len(lines)} problems:\n" + "\n".join(f"  - {line}" for line in lines)
        super().__init__(text)


class ConfigError(_ProblemsError):
    """A config file (edged.toml, hub.toml, admin.toml) is invalid."""


class ValidationError(_ProblemsError):
    """A manifest is invalid."""


class ArtifactError(EdgefleetError):
    """An artifact could not be fetched, verified or stored; ``reason`` is a CamelCase word."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class TrustError(ArtifactError):
    """Signed metadata, a trust root or a rollback allowance was refused (``reason`` says why:
    ``SignatureThresholdNotMet``, ``MetadataExpired``, ``RootExpired``...; see docs/trust.md)."""


class StateError(EdgefleetError):
    """Persisted state could not be read."""


class ReconcileError(EdgefleetError):
    """Raised by a reconciler; the runner decides how to retry."""


class TemporaryError(ReconcileError):
    """Retry later with per-key exponential backoff."""


class PermanentError(ReconcileError):
    """Retrying will not help until the inputs change."""


class StoreError(EdgefleetError):
    """The store failed or cannot be opened."""


class CompareFailed(StoreError):
    """A compare-and-swap did not hold; nothing was written.

    ``key`` is the key whose compare failed, ``expected`` the mod revision asked for (0: must
    not exist) and ``actual`` the key's mod revision now (0: it does not exist). ``also``: the
    other keys of the same transaction whose compares failed, so that a caller comparing
    many keys learns them all in one failure (the device writer: docs/soak.md).
    """

    def __init__(self, key: str, expected: int, actual: int, also: tuple[str, ...] = ()) -> None:
        self.key = key
        self.expected = expected
        self.actual = actual
        self.also = also
        want = "not to exist" if expected == 0 else f"to be at mod revision {expected}"
        have = "it does not exist" if actual == 0 else f"it is at mod revision {actual}"
        super().__init__(f"compare failed on {key}: expected it {want}, but {have}")


class Compacted(StoreError):
    """History before ``compact_revision`` was discarded; re-list, then watch from there."""

    def __init__(self, requested: int, compact_revision: int) -> None:
        self.requested = requested
        self.compact_revision = compact_revision
        super().__init__(
            f"revision {requested} is compacted (history starts after {compact_revision}); "
            "read the current state and watch from its revision"
        )


class LeaseNotFound(StoreError):
    """The lease does not exist: never granted, revoked, or expired."""

    def __init__(self, lease: int) -> None:
        self.lease = lease
        super().__init__(f"lease {lease} not found (revoked or expired)")


class StoreUnavailable(StoreError):
    """The store URL names a backend that is not available (or not built yet)."""


class PkiError(EdgefleetError):
    """A certificate, key or CSR is invalid or cannot be made."""


class CsrRejected(PkiError):
    """A certificate signing request is malformed or its signature does not verify."""


class CaPinMismatch(PkiError):
    """A presented CA certificate does not match the pinned ``sha256:`` hash."""


class IdentityError(PkiError):
    """A certificate carries no valid edgefleet identity (URI SAN ``spiffe://edgefleet/...``)."""


class TokenRefusal(StrEnum):
    """Why a bootstrap token was refused (CamelCase, for statuses and logs)."""

    MALFORMED = "Malformed"
    UNKNOWN = "Unknown"
    WRONG_SECRET = "WrongSecret"
    EXPIRED = "Expired"
    ALREADY_USED = "AlreadyUsed"
    WRONG_PURPOSE = "WrongPurpose"  # a regional hub's token used by a device, or the reverse


class TokenError(EdgefleetError):
    """A bootstrap token was refused; ``reason`` says why. Never contains the secret."""

    def __init__(self, reason: TokenRefusal, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class HubDirError(EdgefleetError):
    """The hub data directory is missing, incomplete, or (for ``hub init``) already exists."""
