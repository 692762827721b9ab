"""Bounds on everything a device sends on its Sync stream (pure; table- and property-tested).

A device holding a valid certificate is still an outside party: one that sends megabytes of
labels, facts or conditions would otherwise bloat the store for everyone and make listing the
fleet exceed the message limit. Each check returns every problem with its field path
(``status.workloads[3].conditions[0].message: at most 1024 characters, got 5000``); the stream
is then refused with INVALID_ARGUMENT and nothing of the message is kept.

The limits are generous for what edged reports (its whole Hello is a few KiB) and small
against the 4 MiB message limit: a device's stored record stays well under 1 MiB.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from edgefleet.api.meta import label_key, label_value
from edgefleet.v1 import common_pb2, device_pb2

MAX_LABELS = 64
MAX_INVENTORY_BYTES = 64 * 1024
MAX_NAME = 253
MAX_SHORT = 128
MAX_MESSAGE_TEXT = 1024
MAX_REASONS = 32
MAX_WORKLOADS = 256
MAX_CONDITIONS = 16
MAX_REPLICAS = 10_000
MAX_REVISIONS = 8  # revisions per workload the hub keeps (hub.syncing.MAX_REPORTED_REVISIONS)
MAX_STATUS_BYTES = 512 * 1024
MAX_NONCE = 64
MAX_EVIDENCE_BYTES = 256 * 1024
MAX_GENERATION = 2**62
"""Generations are store revisions; one past this would be a hostile device's number, and
raising above it (the projector's floor + 1) must stay within DesiredState's uint64."""


def _text(problems: list[str], path: str, value: str, limit: int) -> None:
    if len(value) > limit:
        problems.append(f"{path}: at most {limit} characters, got {len(value)}")


def _health(problems: list[str], path: str, health: common_pb2.Health) -> None:
    if len(health.reasons) > MAX_REASONS:
        problems.append(f"{path}.reasons: at most {MAX_REASONS}, got {len(health.reasons)}")
    for i, reason in enumerate(health.reasons[:MAX_REASONS]):
        _text(problems, f"{path}.reasons[{i}]", reason, MAX_MESSAGE_TEXT)


def _conditions(problems: list[str], path: str, conditions: Sequence[common_pb2.Condition]) -> None:
    if len(conditions) > MAX_CONDITIONS:
        problems.append(f"{path}: at most {MAX_CONDITIONS}, got {len(conditions)}")
    for i, c in enumerate(conditions[:MAX_CONDITIONS]):
        at = f"{path}[{i}]"
        for name, value in (("type", c.type), ("status", c.status), ("reason", c.reason)):
            _text(problems, f"{at}.{name}", value, MAX_SHORT)
        _text(problems, f"{at}.message", c.message, MAX_MESSAGE_TEXT)


def reserved_labels(labels: Iterable[str], reserved: Sequence[str]) -> list[str]:
    """The keys of ``labels`` that are reserved (``[enrollment] reservedLabels``)."""
    return sorted(
        k for k in labels if any(k.startswith(r) if r.endswith("/") else k == r for r in reserved)
    )


def check_hello(hello: device_pb2.Hello, *, reserved: Sequence[str] = ()) -> list[str]:
    """Every problem with a Hello (pure)."""
    problems: list[str] = []
    _text(problems, "hello.device_name", hello.device_name, 63)
    _text(problems, "hello.edged_version", hello.edged_version, MAX_SHORT)
    if hello.applied_generation > MAX_GENERATION:
        problems.append(
            f"hello.applied_generation: at most {MAX_GENERATION}, got {hello.applied_generation}"
        )
    if len(hello.labels) > MAX_LABELS:
        problems.append(f"hello.labels: at most {MAX_LABELS}, got {len(hello.labels)}")
    else:
        for key, value in sorted(hello.labels.items()):
            for convert, what in ((label_key, key), (label_value, value)):
                try:
                    convert(what)
                except ValueError as exc:
                    problems.append(f"hello.labels[{key[:80]!r}]: {exc}"[:400])
        for key in reserved_labels(hello.labels, reserved):
            problems.append(
                f"hello.labels[{key!r}]: reserved for bootstrap tokens and edgectl label "
                "([enrollment] reservedLabels); a device cannot report it"
            )
    size = hello.inventory.ByteSize()
    if size > MAX_INVENTORY_BYTES:
        problems.append(f"hello.inventory: at most {MAX_INVENTORY_BYTES} bytes, got {size}")
    if hello.HasField("health"):
        _health(problems, "hello.health", hello.health)
    return problems


def check_status(status: device_pb2.Status) -> list[str]:
    """Every problem with a Status (pure)."""
    problems: list[str] = []
    size = status.ByteSize()
    if size > MAX_STATUS_BYTES:
        problems.append(f"status: at most {MAX_STATUS_BYTES} bytes, got {size}")
    if len(status.workloads) > MAX_WORKLOADS:
        problems.append(f"status.workloads: at most {MAX_WORKLOADS}, got {len(status.workloads)}")
    names: set[str] = set()
    for i, w in enumerate(status.workloads[:MAX_WORKLOADS]):
        at = f"status.workloads[{i}]"
        _text(problems, f"{at}.name", w.name, MAX_NAME)
        if w.name in names:
            problems.append(f"{at}.name: {w.name[:MAX_NAME]!r} is reported twice")
        names.add(w.name)
        _text(problems, f"{at}.revision", w.revision, MAX_SHORT)
        _text(problems, f"{at}.model_version", w.model_version, MAX_SHORT)
        for name, value in (
            ("ready_replicas", w.ready_replicas),
            ("desired_replicas", w.desired_replicas),
        ):
            if value > MAX_REPLICAS:
                problems.append(f"{at}.{name}: at most {MAX_REPLICAS}, got {value}")
        _conditions(problems, f"{at}.conditions", w.conditions)
        for j, r in enumerate(w.revisions[:MAX_REVISIONS]):
            if r.bytes_done > r.bytes_total:
                problems.append(
                    f"{at}.revisions[{j}].bytes_done: at most bytes_total ({r.bytes_total}), "
                    f"got {r.bytes_done}"
                )
    if status.HasField("health"):
        _health(problems, "status.health", status.health)
    return problems


def check_evidence(evidence: device_pb2.AttestationEvidence) -> list[str]:
    """Every problem with attestation evidence (pure)."""
    problems: list[str] = []
    if len(evidence.nonce) > MAX_NONCE:
        problems.append(
            f"attestation_evidence.nonce: at most {MAX_NONCE} bytes, got {len(evidence.nonce)}"
        )
    if len(evidence.evidence) > MAX_EVIDENCE_BYTES:
        problems.append(
            f"attestation_evidence.evidence: at most {MAX_EVIDENCE_BYTES} bytes, "
            f"got {len(evidence.evidence)}"
        )
    return problems


MAX_LOG_LINES = 1000
MAX_LOG_LINE = 2048


def check_log_lines(lines: device_pb2.DeviceLogLines) -> list[str]:
    """Every problem with an answer to a log request (pure)."""
    problems = []
    if len(lines.lines) > MAX_LOG_LINES:
        problems.append(f"log_lines.lines: at most {MAX_LOG_LINES}, got {len(lines.lines)}")
    for i, line in enumerate(lines.lines[:MAX_LOG_LINES]):
        if len(line) > MAX_LOG_LINE:
            problems.append(
                f"log_lines.lines[{i}]: at most {MAX_LOG_LINE} characters, got {len(line)}"
            )
            break
    return problems


def check_message(message: device_pb2.DeviceMessage, *, issued: int | None = None) -> list[str]:
    """Every problem with a message after the Hello (pure). ``issued``: the newest generation
    the hub issued the device (an Ack above it acknowledges what was never sent)."""
    kind = message.WhichOneof("message")
    if kind == "ack" and issued is not None and message.ack.generation > issued:
        return [
            f"ack.generation: {message.ack.generation} was never issued to this device "
            f"(the newest is {issued})"
        ]
    if kind == "status":
        return check_status(message.status)
    if kind == "attestation_evidence":
        return check_evidence(message.attestation_evidence)
    if kind == "hello":
        return ["hello: only the first message of a stream may be a Hello"]
    if kind == "log_lines":
        return check_log_lines(message.log_lines)
    # ack and heartbeat: numbers and nothing; none: a kind newer than this hub (ignored, as
    # protobuf's forward compatibility intends)
    return []
