"""What edged tells a worker process at launch: a frozen, JSON-serialisable spec.

Shared by the control process (which must not import numpy or onnxruntime) and the worker.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LimitsSpec:
    """Resource limits for one worker and how they are enforced.

    ``mode`` is ``cgroup`` (cgroup v2: ``cpu.max`` and ``memory.max`` of ``cgroup_path``),
    ``rlimit`` (RLIMIT_DATA for memory, CPU affinity to ``cpus`` for CPU), or ``none``.
    """

    mode: str = "none"
    cgroup_path: str = ""
    cpus: tuple[int, ...] = ()
    memory_bytes: int | None = None
    cpu_millis: int | None = None


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    replica_id: str
    workload: str
    model_name: str
    model_version: str
    artifact_path: str
    artifact_sha256: str
    providers: tuple[str, ...]
    intra_op_threads: int
    max_batch_size: int
    max_queue_delay_s: float
    limits: LimitsSpec
    log_level: str = "info"
    # the artifact's validation set (runtime/validating.py), evaluated when ``validate``
    validate: bool = False
    validation_path: str = ""
    validation_sha256: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> LaunchSpec:
        limits = doc.pop("limits")
        limits["cpus"] = tuple(limits["cpus"])
        doc["providers"] = tuple(doc["providers"])
        return cls(limits=LimitsSpec(**limits), **doc)
