"""What a workload's workers say of its model config, for the hub (docs/model-config.md,
"The processing stage"): pure.

Each worker's READY and PONG carry ``config`` (``edged.runtime.configstage``): the digest of
the config in force in it, the one it refused and why, and the digest its validation result
was measured with. From them and from what edged wrote (``edged.sources.hub``):

* :func:`workload_config`: the digest a workload's replicas run and why the config sent is
  not applied: edged's own refusal first, else a serving replica's refusal of the config on
  disk (it does not fit the model), else the digest of a replica that has not taken the
  config on disk yet (none: the one on disk);
* :func:`validation_doc`: a replica's validation result only when it was measured with the
  config on disk, so the canary's accuracy is the model's with the revision's config (a
  result from before a change is no result: the analysis waits for the new one).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edged.reconcile.model import Phase

if TYPE_CHECKING:
    from edged.runtime.processes import Replica

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MAX_ERROR = 1024


def _digest(value: object) -> str | None:
    """A digest a worker reports: "" or ``sha256:`` and 64 hex digits; None when neither."""
    if value == "":
        return ""
    if isinstance(value, str) and _DIGEST.fullmatch(value):
        return value
    return None


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    digest: str = ""  # in force ("" none)
    refused: str = ""  # the config on disk it refused ("" none)
    error: str = ""
    validation_digest: str | None = None  # what its validation was measured with (None: none)
    validation: object = None  # the re-evaluated result; None: READY's ``validation``

    @classmethod
    def from_worker(cls, doc: object) -> WorkerConfig | None:
        """Held to bounds; None when absent or malformed (a worker's words, never trusted)."""
        if not isinstance(doc, dict):
            return None
        digest = _digest(doc.get("digest", ""))
        refused = _digest(doc.get("refused", ""))
        if digest is None or refused is None:
            return None
        checked = doc.get("validationDigest")
        validated = _digest(checked) if checked is not None else None
        return cls(
            digest,
            refused,
            str(doc.get("error", ""))[:MAX_ERROR],
            validated,
            doc.get("validation") if isinstance(doc.get("validation"), dict) else None,
        )


def _serving(replicas: Iterable[Replica], wanted: str) -> list[tuple[Replica, WorkerConfig]]:
    out = []
    for rep in sorted(replicas, key=lambda r: str(r.id)):
        if rep.phase in (Phase.READY, Phase.UNREADY) and (not wanted or rep.revision == wanted):
            c = WorkerConfig.from_worker(rep.metadata.get("config"))
            if c is not None:
                out.append((rep, c))
    return out


def workload_config(
    written: tuple[str, str], replicas: Iterable[Replica], wanted: str = ""
) -> tuple[str, str]:
    """``written``: the digest edged wrote ("" none) and why the one sent is refused (module
    doc); the digest the replicas run and the error to report. ``wanted``: the workload's
    wanted revision: only its replicas speak (during a rolling update the old model's
    replicas read the same file, and may not fit a config made for the new one)."""
    digest, error = written
    if error:
        return digest, error
    serving = _serving(replicas, wanted)
    for rep, c in serving:
        if c.error and c.refused == digest:
            why = f"replica {rep.id} refused it: {c.error}"
            return c.digest, why[:MAX_ERROR]
    behind = [c.digest for _, c in serving if c.digest != digest]
    return (behind[0] if behind else digest), ""


def validation_doc(rep: Replica, config: str | None) -> Any:
    """``rep``'s validation result, if it was measured with ``config`` (the digest on disk,
    "" none; None: not known, any result); None otherwise."""
    c = WorkerConfig.from_worker(rep.metadata.get("config"))
    if c is None or config is None:
        return rep.metadata.get("validation")  # a worker without a stage: the model alone
    if c.validation_digest != config:
        return None
    return c.validation if c.validation is not None else rep.metadata.get("validation")


def replica_config(rep: Replica) -> dict[str, str] | None:
    """What ``/v1/status`` shows of a replica's model config (bounded): the digest in force,
    the one refused and why; None for a worker that says nothing of it."""
    c = WorkerConfig.from_worker(rep.metadata.get("config"))
    if c is None:
        return None
    doc = {"digest": c.digest}
    if c.error:
        doc.update(refused=c.refused, error=c.error)
    return doc
