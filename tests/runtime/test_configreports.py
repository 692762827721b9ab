"""What a workload's workers say of its model config, as edged reports it (pure): the digest
the replicas run, a worker's refusal as the workload's config error, and a validation result
only when it was measured with the config on disk. A worker's words are bounded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from edged.reconcile.model import Phase
from edged.runtime.configreports import (
    WorkerConfig,
    replica_config,
    validation_doc,
    workload_config,
)
from edged.serving.measuring import ValidationResult, validation_of

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64


@dataclass
class Rep:
    id: str
    config: dict[str, Any] | None = None
    phase: Phase = Phase.READY
    revision: str = "r1"
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.config is not None:
            self.metadata["config"] = self.config


@pytest.mark.parametrize(
    ("written", "replicas", "want"),
    [
        ((A, ""), [], (A, "")),  # no worker says: what edged wrote
        ((A, ""), [Rep("w/0")], (A, "")),  # a worker without a stage says nothing
        ((A, ""), [Rep("w/0", {"digest": A})], (A, "")),
        ((B, ""), [Rep("w/0", {"digest": B}), Rep("w/1", {"digest": A})], (A, "")),  # behind
        ((B, "edged refused it"), [Rep("w/0", {"digest": A})], (B, "edged refused it")),
        (
            (B, ""),
            [Rep("w/0", {"digest": A, "refused": B, "error": "no such input"})],
            (A, "replica w/0 refused it: no such input"),
        ),
        # a refusal of a config no longer on disk is no error now
        ((A, ""), [Rep("w/0", {"digest": A, "refused": B, "error": "old"})], (A, "")),
        # a replica that stops says nothing
        ((B, ""), [Rep("w/0", {"digest": A}, Phase.STOPPING)], (B, "")),
        # malformed words are not taken
        ((A, ""), [Rep("w/0", {"digest": "sha256:zz"})], (A, "")),
        ((A, ""), [Rep("w/0", {"digest": A, "refused": 7, "error": "x"})], (A, "")),
    ],
)
def test_workload_config(
    written: tuple[str, str], replicas: list[Rep], want: tuple[str, str]
) -> None:
    assert workload_config(written, replicas) == want  # type: ignore[arg-type]


def test_only_the_wanted_revisions_replicas_speak() -> None:
    old = Rep("w/0", {"digest": A, "refused": B, "error": "no input x"}, revision="old")
    new = Rep("w/1", {"digest": B}, revision="new")
    assert workload_config((B, ""), [old, new], "new") == (B, "")  # type: ignore[list-item]
    assert workload_config((B, ""), [old], "new") == (B, "")  # type: ignore[list-item]
    assert workload_config((B, ""), [old, new])[1].startswith("replica w/0 refused it")  # type: ignore[list-item]


def test_an_error_is_bounded() -> None:
    c = WorkerConfig.from_worker({"digest": A, "refused": B, "error": "x" * 5000})
    assert c is not None and len(c.error) == 1024


def test_a_validation_counts_only_when_measured_with_the_config_on_disk() -> None:
    ready = {"accuracy": 0.9, "samples": 10, "correct": 9}
    again = {"accuracy": 0.5, "samples": 10, "correct": 5}
    rep = Rep("w/0", {"digest": A, "validationDigest": A}, metadata={"validation": ready})
    assert validation_doc(rep, A) == ready  # READY's, measured with A  # type: ignore[arg-type]
    assert validation_doc(rep, B) is None  # B on disk: not measured yet  # type: ignore[arg-type]
    rep.metadata["config"] = {"digest": B, "validationDigest": B, "validation": again}
    assert validation_doc(rep, B) == again  # type: ignore[arg-type]
    assert validation_of([rep], "r1", B) == ValidationResult(0.5, 10, 5)  # type: ignore[list-item]
    assert validation_of([rep], "r1", A) is None  # type: ignore[list-item]
    old = Rep("w/0", metadata={"validation": ready})  # a worker without a stage
    assert validation_of([old], "r1", A) == ValidationResult(0.9, 10, 9)  # type: ignore[list-item]


def test_what_the_status_shows_of_a_replicas_config() -> None:
    assert replica_config(Rep("w/0")) is None  # type: ignore[arg-type]
    shown = replica_config(Rep("w/0", {"digest": A, "validationDigest": A}))  # type: ignore[arg-type]
    assert shown == {"digest": A}
    refused = Rep("w/0", {"digest": A, "refused": B, "error": "no such input"})
    assert replica_config(refused) == {"digest": A, "refused": B, "error": "no such input"}  # type: ignore[arg-type]
