"""The one exception tree of the hub.

Every error the hub raises on purpose derives from :class:`HubError`. Errors of lower layers
(sqlite3, cryptography, OS, grpc) are translated where they occur. Invalid config files and
manifests reuse edged's :class:`~edged.errors.ConfigError` and
:class:`~edged.errors.ValidationError` (every problem with its field path).

    HubError
    ├── StoreError             the store failed or cannot be opened
    │   ├── CompareFailed      a compare-and-swap (or txn compare) did not hold; nothing written
    │   ├── Compacted          a watch asked for history older than the compaction point
    │   ├── LeaseNotFound      the lease does not exist (never granted, revoked or expired)
    │   └── StoreUnavailable   the store URL names a backend that is not available
    ├── PkiError               a certificate, key or CSR is invalid or cannot be made
    │   ├── CsrRejected        a CSR is malformed or its signature does not verify
    │   ├── CaPinMismatch      a presented CA does not match the pinned hash
    │   └── IdentityError      a certificate carries no valid edgefleet identity
    ├── TokenError             a bootstrap token was refused; ``reason`` says why
    └── HubDirError            the hub data directory is missing, incomplete or already exists
"""

from __future__ import annotations

from enum import StrEnum


class HubError(Exception):
    """Base of every error the hub raises on purpose."""


class StoreError(HubError):
    """The store failed or cannot be opened."""


class CompareFailed(StoreError):
    """A compare-and-swap did not hold; nothing was written.

    ``key`` is the key whose compare failed, ``expected`` the mod revision asked for (0: must
    not exist) and ``actual`` the key's mod revision now (0: it does not exist).
    """

    def __init__(self, key: str, expected: int, actual: int) -> None:
        self.key = key
        self.expected = expected
        self.actual = actual
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


class PkiError(HubError):
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


class TokenError(HubError):
    """A bootstrap token was refused; ``reason`` says why. Never contains the secret."""

    def __init__(self, reason: TokenRefusal, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class HubDirError(HubError):
    """The hub data directory is missing, incomplete, or (for ``hub init``) already exists."""
