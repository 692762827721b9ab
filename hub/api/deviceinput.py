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

import math
from collections.abc import Iterable, Mapping, Sequence

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
MAX_QUEUE_DEPTH = 1_000_000.0  # requests in flight per replica a device may report
MAX_CPU_PERCENT = 100_000.0  # % of what the workers may use (a burst can pass 100)
MAX_REVISIONS = (
    8  # revisions per workload the hub keeps (hub.api.devicesync.MAX_REPORTED_REVISIONS)
)
MAX_STATUS_BYTES = 512 * 1024
MAX_REVISIONS = 8  # per workload, as hub.api.devicesync keeps
MAX_COUNTER = 2**53  # requests a revision answered: exact in a double, in JSON
MAX_METRIC_SECONDS = 86_400.0
MAX_BENCHMARK_RUNS = 1000
MAX_NONCE = 64
MAX_EVIDENCE_BYTES = 256 * 1024
MAX_GENERATION = 2**62
MAX_SANDBOXES = 64  # replicas' sandbox reports per workload
MAX_SANDBOX_PROBLEMS = 8
MAX_PORTS = 64
MAX_TERMINATION_REASON = 64  # an event's reason at the hub: one CamelCase word
MAX_RESTART_COUNT = 2**31 - 1
MAX_SIGNAL = 64  # Linux's highest real-time signal
MAX_EXIT_CODE = 255
MAX_FINISHED_AT = 253_402_300_799  # 9999-12-31T23:59:59Z, as protobuf's Timestamp allows
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


def _revision(problems: list[str], path: str, r: device_pb2.RevisionStatus) -> None:
    """A revision's metrics and validation accuracy (what the canary analysis reads)."""
    if r.HasField("metrics"):
        m = r.metrics
        for name, count in (
            ("requests", m.requests),
            ("errors", m.errors),
            ("window_requests", m.window_requests),
        ):
            if count > MAX_COUNTER:
                problems.append(f"{path}.metrics.{name}: at most {MAX_COUNTER}, got {count}")
        if m.errors > m.requests:
            problems.append(
                f"{path}.metrics.errors: at most requests ({m.requests}), got {m.errors}"
            )
        for name, seconds in (
            ("latency_p95_seconds", m.latency_p95_seconds),
            ("latency_window_seconds", m.latency_window_seconds),
        ):
            if not 0 <= seconds <= MAX_METRIC_SECONDS:  # also NaN
                problems.append(
                    f"{path}.metrics.{name}: from 0 to {MAX_METRIC_SECONDS} seconds, got {seconds}"
                )
    if r.HasField("benchmark"):
        b = r.benchmark
        if not 0 <= b.p95_seconds <= MAX_METRIC_SECONDS:  # also NaN
            problems.append(
                f"{path}.benchmark.p95_seconds: from 0 to {MAX_METRIC_SECONDS} seconds, "
                f"got {b.p95_seconds}"
            )
        if not 0 < b.runs <= MAX_BENCHMARK_RUNS:
            problems.append(f"{path}.benchmark.runs: from 1 to {MAX_BENCHMARK_RUNS}, got {b.runs}")
        if not r.sha256:
            problems.append(f"{path}.benchmark: needs the revision's sha256")
    if r.HasField("validation"):
        v = r.validation
        if not 0 <= v.accuracy <= 1:  # also NaN
            problems.append(f"{path}.validation.accuracy: from 0 to 1, got {v.accuracy}")
        if v.correct > v.samples:
            problems.append(
                f"{path}.validation.correct: at most samples ({v.samples}), got {v.correct}"
            )
        _text(problems, f"{path}.validation.reason", v.reason, MAX_SHORT)
        _text(problems, f"{path}.validation.message", v.message, MAX_MESSAGE_TEXT)


def reserved_labels(labels: Iterable[str], reserved: Sequence[str]) -> list[str]:
    """The keys of ``labels`` that are reserved (``[enrollment] reservedLabels``)."""
    return sorted(
        k for k in labels if any(k.startswith(r) if r.endswith("/") else k == r for r in reserved)
    )


def _labels(
    problems: list[str], at: str, labels: Mapping[str, str], reserved: Sequence[str]
) -> None:
    if len(labels) > MAX_LABELS:
        problems.append(f"{at}: at most {MAX_LABELS}, got {len(labels)}")
        return
    for key, value in sorted(labels.items()):
        for convert, what in ((label_key, key), (label_value, value)):
            try:
                convert(what)
            except ValueError as exc:
                problems.append(f"{at}[{key[:80]!r}]: {exc}"[:400])
    for key in reserved_labels(labels, reserved):
        problems.append(
            f"{at}[{key!r}]: reserved for bootstrap tokens and edgectl label "
            "([enrollment] reservedLabels); a device cannot report it"
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
    _labels(problems, "hello.labels", hello.labels, reserved)
    size = hello.inventory.ByteSize()
    if size > MAX_INVENTORY_BYTES:
        problems.append(f"hello.inventory: at most {MAX_INVENTORY_BYTES} bytes, got {size}")
    if hello.HasField("health"):
        _health(problems, "hello.health", hello.health)
    return problems


def _sizing(problems: list[str], at: str, sizing: device_pb2.WorkloadSizing) -> None:
    for name in (
        "current_replicas",
        "desired_replicas",
        "min_replicas",
        "max_replicas",
        "evicted_replicas",
        "effective_max_batch_size",
    ):
        value = getattr(sizing, name)
        if value > MAX_REPLICAS:
            problems.append(f"{at}.{name}: at most {MAX_REPLICAS}, got {value}")
    for name, bound in (("queue_depth", MAX_QUEUE_DEPTH), ("cpu_percent", MAX_CPU_PERCENT)):
        if sizing.HasField(name):
            figure = getattr(sizing, name)
            if not (math.isfinite(figure) and 0 <= figure <= bound):
                problems.append(f"{at}.{name}: must be from 0 to {bound}, got {figure}")
    d = sizing.last_decision
    for name, value in (("from_replicas", d.from_replicas), ("to_replicas", d.to_replicas)):
        if value > MAX_REPLICAS:
            problems.append(f"{at}.last_decision.{name}: at most {MAX_REPLICAS}, got {value}")
    _text(problems, f"{at}.last_decision.reason", d.reason, MAX_SHORT)
    _text(problems, f"{at}.last_decision.message", d.message, MAX_MESSAGE_TEXT)


def check_status(status: device_pb2.Status, *, reserved: Sequence[str] = ()) -> list[str]:
    """Every problem with a Status (pure)."""
    problems: list[str] = []
    _labels(problems, "status.labels", status.labels, reserved)
    if status.observed_generation > MAX_GENERATION:
        problems.append(
            f"status.observed_generation: at most {MAX_GENERATION}, "
            f"got {status.observed_generation}"
        )
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
        if w.HasField("sizing"):
            _sizing(problems, f"{at}.sizing", w.sizing)
        for j, r in enumerate(w.revisions[:MAX_REVISIONS]):  # the hub keeps no more
            _revision(problems, f"{at}.revisions[{j}]", r)
            if r.bytes_done > r.bytes_total:
                problems.append(
                    f"{at}.revisions[{j}].bytes_done: at most bytes_total ({r.bytes_total}), "
                    f"got {r.bytes_done}"
                )
        _sandboxes(problems, f"{at}.replica_sandboxes", w.replica_sandboxes)
        if w.restart_count > MAX_RESTART_COUNT:
            problems.append(
                f"{at}.restart_count: at most {MAX_RESTART_COUNT}, got {w.restart_count}"
            )
        if w.HasField("last_termination"):
            _termination(problems, f"{at}.last_termination", w.last_termination)
        if w.HasField("model_config"):
            _model_config(problems, f"{at}.model_config", w.model_config)
    if status.HasField("health"):
        _health(problems, "status.health", status.health)
    if status.HasField("compliance"):
        _compliance(problems, "status.compliance", status.compliance)
    if status.HasField("agent"):
        _agent(problems, "status.agent", status.agent)
    return problems


MAX_AGENT_TRIES = 1000
MAX_AGENT_BYTES = 2**40  # a release's size a device may report (1 TiB)


def _agent(problems: list[str], path: str, a: device_pb2.AgentStatus) -> None:
    """edged's release and self-update (issue 32): each text bounded, counters sane."""
    for name in (
        "version",
        "slot",
        "committed_version",
        "phase",
        "desired_version",
        "reason",
        "arch",
        "python_abi",
        "upgrade",
    ):
        _text(problems, f"{path}.{name}", getattr(a, name), MAX_SHORT)
    _text(problems, f"{path}.message", a.message, MAX_MESSAGE_TEXT)
    if a.tries > MAX_AGENT_TRIES:
        problems.append(f"{path}.tries: at most {MAX_AGENT_TRIES}, got {a.tries}")
    if a.upgrade_revision > MAX_GENERATION:
        problems.append(f"{path}.upgrade_revision: at most {MAX_GENERATION}")
    if a.bytes_total > MAX_AGENT_BYTES:
        problems.append(f"{path}.bytes_total: at most {MAX_AGENT_BYTES}, got {a.bytes_total}")
    if a.bytes_done > a.bytes_total:
        problems.append(f"{path}.bytes_done: at most bytes_total ({a.bytes_total})")


MAX_FINDINGS = 32


def _compliance(problems: list[str], path: str, c: device_pb2.DeviceCompliance) -> None:
    _text(problems, f"{path}.action", c.action, MAX_SHORT)
    _text(problems, f"{path}.quarantined", c.quarantined, MAX_MESSAGE_TEXT)
    _text(problems, f"{path}.opens_watch_reason", c.opens_watch_reason, MAX_MESSAGE_TEXT)
    if len(c.findings) > MAX_FINDINGS:
        problems.append(f"{path}.findings: at most {MAX_FINDINGS}, got {len(c.findings)}")
    for i, f in enumerate(c.findings[:MAX_FINDINGS]):
        _text(problems, f"{path}.findings[{i}].kind", f.kind, MAX_SHORT)
        _text(problems, f"{path}.findings[{i}].subject", f.subject, MAX_SHORT)
        _text(problems, f"{path}.findings[{i}].message", f.message, MAX_MESSAGE_TEXT)


def _sandboxes(
    problems: list[str], path: str, sandboxes: Sequence[device_pb2.ReplicaSandbox]
) -> None:
    if len(sandboxes) > MAX_SANDBOXES:
        problems.append(f"{path}: at most {MAX_SANDBOXES}, got {len(sandboxes)}")
    for i, x in enumerate(sandboxes[:MAX_SANDBOXES]):
        at = f"{path}[{i}]"
        for name, value in (("replica", x.replica), ("revision", x.revision), ("mode", x.mode)):
            _text(problems, f"{at}.{name}", value, MAX_SHORT)
        if len(x.connect_ports) > MAX_PORTS:
            problems.append(f"{at}.connect_ports: at most {MAX_PORTS}, got {len(x.connect_ports)}")
        if len(x.connect_to) > MAX_PORTS:
            problems.append(f"{at}.connect_to: at most {MAX_PORTS}, got {len(x.connect_to)}")
        for j, text in enumerate(x.connect_to[:MAX_PORTS]):
            _text(problems, f"{at}.connect_to[{j}]", text, MAX_SHORT)
        if len(x.problems) > MAX_SANDBOX_PROBLEMS:
            problems.append(f"{at}.problems: at most {MAX_SANDBOX_PROBLEMS}, got {len(x.problems)}")
        for j, text in enumerate(x.problems[:MAX_SANDBOX_PROBLEMS]):
            _text(problems, f"{at}.problems[{j}]", text, MAX_MESSAGE_TEXT)


MAX_CONFIG_ERROR = 1024


def _model_config(problems: list[str], at: str, c: device_pb2.ModelConfigStatus) -> None:
    """A config digest is "" or "sha256:" and 64 hex digits; its error is bounded."""
    digest = c.digest
    if digest and not (
        len(digest) == 71
        and digest.startswith("sha256:")
        and all(ch in "0123456789abcdef" for ch in digest[7:])
    ):
        problems.append(f'{at}.digest: must be "sha256:" and 64 lowercase hex digits')
    if len(c.error) > MAX_CONFIG_ERROR:
        problems.append(f"{at}.error: at most {MAX_CONFIG_ERROR} characters, got {len(c.error)}")


def _termination(problems: list[str], path: str, t: device_pb2.ReplicaTermination) -> None:
    """A replica's last termination: its reason becomes an event's reason at the hub, so one
    CamelCase word (``OOMKilled``), and either an exit code or a signal, never both."""
    _text(problems, f"{path}.replica", t.replica, MAX_SHORT)
    if not t.reason:
        problems.append(f"{path}.reason: required (OOMKilled, Error...)")
    elif len(t.reason) > MAX_TERMINATION_REASON:
        problems.append(
            f"{path}.reason: at most {MAX_TERMINATION_REASON} characters, got {len(t.reason)}"
        )
    elif not (t.reason.isascii() and t.reason.isalnum() and t.reason[0].isalpha()):
        problems.append(f"{path}.reason: must be one CamelCase word, got {t.reason[:80]!r}")
    _text(problems, f"{path}.message", t.message, MAX_MESSAGE_TEXT)
    if not 0 <= t.exit_code <= MAX_EXIT_CODE:
        problems.append(f"{path}.exit_code: from 0 to {MAX_EXIT_CODE}, got {t.exit_code}")
    if t.signal > MAX_SIGNAL:
        problems.append(f"{path}.signal: at most {MAX_SIGNAL}, got {t.signal}")
    if t.exit_code and t.signal:
        problems.append(f"{path}: an exit code ({t.exit_code}) or a signal ({t.signal}), not both")
    if t.HasField("finished_at"):
        at = t.finished_at
        if not 0 <= at.seconds <= MAX_FINISHED_AT or not 0 <= at.nanos < 1_000_000_000:
            problems.append(
                f"{path}.finished_at: a time from 1970 to 9999, got {at.seconds}s {at.nanos}ns"
            )


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


def check_message(
    message: device_pb2.DeviceMessage,
    *,
    issued: int | None = None,
    reserved: Sequence[str] = (),
) -> list[str]:
    """Every problem with a message after the Hello (pure). ``issued``: the newest generation
    the hub issued the device (an Ack above it acknowledges what was never sent);
    ``reserved``: label keys a device may not report."""
    kind = message.WhichOneof("message")
    if kind == "ack" and issued is not None and message.ack.generation > issued:
        return [
            f"ack.generation: {message.ack.generation} was never issued to this device "
            f"(the newest is {issued})"
        ]
    if kind == "status":
        return check_status(message.status, reserved=reserved)
    if kind == "attestation_evidence":
        return check_evidence(message.attestation_evidence)
    if kind == "hello":
        return ["hello: only the first message of a stream may be a Hello"]
    if kind == "log_lines":
        return check_log_lines(message.log_lines)
    # ack and heartbeat: numbers and nothing; none: a kind newer than this hub (ignored, as
    # protobuf's forward compatibility intends)
    return []
