"""The one exception tree of edged.

Every error edged raises on purpose derives from :class:`EdgedError`. Errors of lower layers
(onnxruntime, OS, sockets) are translated at the boundary where they occur.

    EdgedError
    ├── ConfigError            the edged config file is invalid (every problem listed)
    ├── ValidationError        a manifest is invalid (every problem listed, with field paths)
    ├── ArtifactError          an artifact could not be fetched, verified or stored
    │   └── TrustError         signed metadata, a trust root or an allowance was refused
    ├── StateError             persisted state is unreadable
    └── ReconcileError         raised by reconcilers; tells the runner how to retry
        ├── TemporaryError     retry with per-key exponential backoff
        └── PermanentError     do not retry until the key's inputs change
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class EdgedError(Exception):
    """Base of every error edged raises on purpose."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input, at a field path such as ``spec.runtime.maxBatchSize``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class _ProblemsError(EdgedError):
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
    """The edged config file is invalid."""


class ValidationError(_ProblemsError):
    """A manifest is invalid."""


class ArtifactError(EdgedError):
    """An artifact could not be fetched, verified or stored; ``reason`` is a CamelCase word."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class TrustError(ArtifactError):
    """Signed metadata, a trust root or a rollback allowance was refused (``reason`` says why:
    ``SignatureThresholdNotMet``, ``MetadataExpired``, ``RootExpired``...; see docs/trust.md)."""


class StateError(EdgedError):
    """Persisted state could not be read."""


class ReconcileError(EdgedError):
    """Raised by a reconciler; the runner decides how to retry."""


class TemporaryError(ReconcileError):
    """Retry later with per-key exponential backoff."""


class PermanentError(ReconcileError):
    """Retrying will not help until the inputs change."""
