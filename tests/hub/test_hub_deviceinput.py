"""hub.api.deviceinput: the bounds on what a device sends, as tables and as properties (hypothesis:
arbitrary bytes parsed as messages, and arbitrary messages, never raise; every message within
the bounds passes; every problem names a field). Pure: no hub, no network."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st
from propertytesting import examples

from edgefleet.v1 import common_pb2, device_pb2
from hub.api import deviceinput as di


def _status(**kw: object) -> device_pb2.Status:
    return device_pb2.Status(**kw)  # type: ignore[arg-type]


def _workload(**kw: object) -> device_pb2.WorkloadStatus:
    fields: dict[str, object] = {"name": "det", "model_version": "1.0.0", "desired_replicas": 1}
    fields.update(kw)
    return device_pb2.WorkloadStatus(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("hello", "problem"),
    [
        (device_pb2.Hello(device_name="cam-1", labels={"arch": "arm64"}), None),
        (device_pb2.Hello(labels={"site": "retail"}), "hello.labels['site']: reserved"),
        (device_pb2.Hello(labels={"bad key!": "x"}), "hello.labels['bad key!']"),
        (device_pb2.Hello(labels={"a": "x" * 64}), "hello.labels['a']"),
        (device_pb2.Hello(labels={f"k{i}": "v" for i in range(65)}), "hello.labels: at most 64"),
        (device_pb2.Hello(edged_version="v" * 129), "hello.edged_version: at most 128"),
        (
            device_pb2.Hello(health=common_pb2.Health(reasons=["r"] * 33)),
            "hello.health.reasons: at most 32",
        ),
    ],
)
def test_hello_table(hello: device_pb2.Hello, problem: str | None) -> None:
    problems = di.check_hello(hello, reserved=("site", "zone"))
    assert problems == [] if problem is None else problem in "\n".join(problems), problems


def test_a_huge_inventory_is_refused() -> None:
    hello = device_pb2.Hello()
    hello.inventory.update({"junk": "x" * (di.MAX_INVENTORY_BYTES + 1)})
    assert di.check_hello(hello)[0].startswith("hello.inventory: at most 65536 bytes")


@pytest.mark.parametrize(
    ("status", "problem"),
    [
        (_status(workloads=[_workload()]), None),
        (_status(workloads=[_workload()] * 2), "status.workloads[1].name: 'det' is reported twice"),
        (
            _status(workloads=[_workload(name=f"w{i}") for i in range(257)]),
            "status.workloads: at most 256",
        ),
        (_status(workloads=[_workload(revision="r" * 129)]), "status.workloads[0].revision"),
        (_status(workloads=[_workload(ready_replicas=10_001)]), "ready_replicas: at most"),
        (
            _status(
                workloads=[
                    _workload(
                        sizing=device_pb2.WorkloadSizing(
                            desired_replicas=2,
                            last_decision=device_pb2.ScalingDecision(message="m" * 1025),
                        )
                    )
                ]
            ),
            "status.workloads[0].sizing.last_decision.message: at most 1024 characters",
        ),
        (
            _status(
                workloads=[_workload(sizing=device_pb2.WorkloadSizing(evicted_replicas=10**6))]
            ),
            "status.workloads[0].sizing.evicted_replicas: at most 10000",
        ),
        (
            _status(workloads=[_workload(sizing=device_pb2.WorkloadSizing(desired_replicas=3))]),
            None,
        ),
        (
            _status(
                workloads=[
                    _workload(
                        revisions=[
                            device_pb2.RevisionStatus(bytes_done=5, bytes_total=10),
                            device_pb2.RevisionStatus(bytes_done=11, bytes_total=10),
                        ]
                    )
                ]
            ),
            "status.workloads[0].revisions[1].bytes_done: at most bytes_total (10), got 11",
        ),
        (
            _status(workloads=[_workload(conditions=[common_pb2.Condition(message="m" * 1025)])]),
            "status.workloads[0].conditions[0].message: at most 1024 characters, got 1025",
        ),
        (
            _status(workloads=[_workload(conditions=[common_pb2.Condition()] * 17)]),
            "conditions: at most 16",
        ),
        (
            _status(
                workloads=[_workload(name=f"w{i}", revision="r" * 100) for i in range(256)] + [],
                health=common_pb2.Health(reasons=["x" * 1000] * 32),
            ),
            None,
        ),
        (
            # the 3.6 MB status: refused by its size before anything is kept
            _status(
                workloads=[
                    _workload(
                        conditions=[common_pb2.Condition(message="m" * 1000)] * 16, name=f"w{i}"
                    )
                    for i in range(230)
                ]
            ),
            "status: at most 524288 bytes",
        ),
    ],
)
def test_status_table(status: device_pb2.Status, problem: str | None) -> None:
    problems = di.check_status(status)
    assert problems == [] if problem is None else problem in "\n".join(problems), problems


def test_evidence_and_messages_table() -> None:
    ok = device_pb2.AttestationEvidence(nonce=b"n" * 32, evidence=b"e" * 1000)
    assert di.check_evidence(ok) == []
    big = device_pb2.AttestationEvidence(nonce=b"n" * 65, evidence=b"e" * (256 * 1024 + 1))
    assert [p.split(":")[0] for p in di.check_evidence(big)] == [
        "attestation_evidence.nonce",
        "attestation_evidence.evidence",
    ]
    second_hello = device_pb2.DeviceMessage(hello=device_pb2.Hello())
    assert di.check_message(second_hello)[0].startswith("hello: only the first")
    huge_ack = device_pb2.DeviceMessage(ack=device_pb2.Ack(generation=2**64 - 1))
    assert di.check_message(huge_ack, issued=7)[0].startswith(
        "ack.generation: 18446744073709551615"
    )
    ack = device_pb2.DeviceMessage(ack=device_pb2.Ack(generation=7))
    assert di.check_message(ack, issued=7) == []
    hello = device_pb2.Hello(applied_generation=2**63)
    assert di.check_hello(hello)[0].startswith("hello.applied_generation: at most")
    status = device_pb2.Status(observed_generation=2**63)
    assert di.check_status(status) == [
        f"status.observed_generation: at most {di.MAX_GENERATION}, got {2**63}"
    ]
    assert di.check_status(device_pb2.Status(observed_generation=di.MAX_GENERATION)) == []
    for fine in (device_pb2.Ack(generation=2**64 - 1), device_pb2.Heartbeat()):
        kind = "ack" if isinstance(fine, device_pb2.Ack) else "heartbeat"
        assert di.check_message(device_pb2.DeviceMessage(**{kind: fine})) == []
    assert di.check_message(device_pb2.DeviceMessage()) == []  # a newer kind: ignored


# -- properties -------------------------------------------------------------------------------

_FIELD = ("hello.", "status", "attestation_evidence.")


@examples(3000)
@given(st.binary(max_size=4096))
def test_any_bytes_parse_or_fail_cleanly_and_checks_never_raise(data: bytes) -> None:
    message = device_pb2.DeviceMessage()
    try:
        message.ParseFromString(data)
    except DecodeError:
        return  # the registering layer answers INVALID_ARGUMENT for these
    problems = di.check_message(message)
    if message.WhichOneof("message") == "hello":
        problems = di.check_hello(message.hello, reserved=("site",))
    assert all(isinstance(p, str) and p.startswith(_FIELD) for p in problems)


def _sized(most: int) -> st.SearchStrategy[str]:
    """Strings up to ``most`` characters, cheap to make: a short random piece, repeated."""
    return st.builds(
        lambda piece, n: (piece * (n // max(1, len(piece)) + 1))[:n] if piece else "",
        st.text(max_size=6),
        st.integers(0, most),
    )


_label = st.builds(
    lambda head, n: f"{head}{n}", st.sampled_from(["a", "b-c", "x.y", "z_0"]), st.integers(0, 10**9)
)
_condition = st.builds(
    common_pb2.Condition,
    type=_sized(200),
    status=_sized(200),
    reason=_sized(200),
    message=_sized(2000),
)
_workloads = st.lists(
    st.builds(
        device_pb2.WorkloadStatus,
        name=_sized(300),
        revision=_sized(300),
        model_version=_sized(300),
        ready_replicas=st.integers(0, 2**32 - 1),
        desired_replicas=st.integers(0, 2**32 - 1),
        conditions=st.lists(_condition, max_size=18),
    ),
    max_size=4,
)


@examples(300)  # large messages: ~0.1 s each on a loaded CI core
@given(
    _workloads,
    st.lists(_sized(2000), max_size=34),
    st.dictionaries(_sized(80), _sized(80), max_size=66),
)
def test_arbitrary_messages_get_field_named_problems_never_exceptions(
    workloads: list[device_pb2.WorkloadStatus],
    reasons: list[str],
    labels: dict[str, str],
) -> None:
    status = device_pb2.Status(workloads=workloads, health=common_pb2.Health(reasons=reasons))
    hello = device_pb2.Hello(labels=labels, health=common_pb2.Health(reasons=reasons))
    for problems in (di.check_status(status), di.check_hello(hello, reserved=("zone",))):
        assert all(p.startswith(_FIELD) for p in problems)


@examples(300)  # large messages: ~0.1 s each on a loaded CI core
@given(
    st.lists(
        st.builds(
            device_pb2.WorkloadStatus,
            revision=_sized(di.MAX_SHORT),
            model_version=_sized(di.MAX_SHORT),
            ready_replicas=st.integers(0, di.MAX_REPLICAS),
            desired_replicas=st.integers(0, di.MAX_REPLICAS),
            conditions=st.lists(
                st.builds(
                    common_pb2.Condition,
                    type=_sized(di.MAX_SHORT),
                    message=_sized(di.MAX_MESSAGE_TEXT),
                ),
                max_size=di.MAX_CONDITIONS,
            ),
        ),
        max_size=4,
    ),
    st.dictionaries(_label, _label, max_size=di.MAX_LABELS),
)
def test_every_message_within_the_bounds_passes(
    workloads: list[device_pb2.WorkloadStatus], labels: dict[str, str]
) -> None:
    for i, w in enumerate(workloads):
        w.name = f"w{i}"
    assert di.check_status(device_pb2.Status(workloads=workloads)) == []
    assert di.check_hello(device_pb2.Hello(labels=labels)) == []


def _measured(**kw: object) -> device_pb2.Status:
    rev = device_pb2.RevisionStatus(model_version="1.0.0", phase="Ready", **kw)  # type: ignore[arg-type]
    return _status(workloads=[_workload(revisions=[rev])])


M = device_pb2.RevisionMetrics
V = device_pb2.RevisionValidation
B = device_pb2.RevisionBenchmark


@pytest.mark.parametrize(
    ("status", "problem"),
    [
        (_measured(metrics=M(requests=10, errors=2, latency_p95_seconds=0.01)), None),
        (_measured(validation=V(accuracy=0.9, samples=10, correct=9)), None),
        (
            _measured(metrics=M(requests=1, errors=2)),
            "status.workloads[0].revisions[0].metrics.errors: at most requests (1), got 2",
        ),
        (
            _measured(metrics=M(requests=2**60)),
            "status.workloads[0].revisions[0].metrics.requests: at most",
        ),
        (
            _measured(metrics=M(latency_p95_seconds=float("nan"))),
            "status.workloads[0].revisions[0].metrics.latency_p95_seconds: from 0 to",
        ),
        (
            _measured(metrics=M(latency_window_seconds=-1)),
            "metrics.latency_window_seconds: from 0 to",
        ),
        (
            _measured(validation=V(accuracy=1.5)),
            "status.workloads[0].revisions[0].validation.accuracy: from 0 to 1, got 1.5",
        ),
        (_measured(validation=V(samples=1, correct=2)), "validation.correct: at most samples"),
        (_measured(validation=V(message="m" * 1025)), "validation.message: at most 1024"),
        (_measured(sha256="ab" * 32, benchmark=B(p95_seconds=0.01, runs=20)), None),
        (
            _measured(sha256="ab" * 32, benchmark=B(p95_seconds=float("nan"), runs=20)),
            "revisions[0].benchmark.p95_seconds: from 0 to",
        ),
        (
            _measured(sha256="ab" * 32, benchmark=B(p95_seconds=0.01, runs=0)),
            "revisions[0].benchmark.runs: from 1 to 1000, got 0",
        ),
        (
            _measured(benchmark=B(p95_seconds=0.01, runs=3)),
            "revisions[0].benchmark: needs the revision's sha256",
        ),
    ],
)
def test_revision_figures_table(status: device_pb2.Status, problem: str | None) -> None:
    problems = di.check_status(status)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0], problems


@pytest.mark.parametrize(
    ("agent", "problem"),
    [
        (device_pb2.AgentStatus(version="0.2.1", committed_version="0.2.0", phase="Trying",
                                upgrade="u", upgrade_revision=3, tries=2), None),
        (device_pb2.AgentStatus(version="v" * 129), "status.agent.version: at most 128"),
        (device_pb2.AgentStatus(upgrade="u" * 200), "status.agent.upgrade: at most 128"),
        (device_pb2.AgentStatus(message="m" * 2000), "status.agent.message: at most 1024"),
        (device_pb2.AgentStatus(tries=5000), "status.agent.tries: at most 1000"),
        (device_pb2.AgentStatus(upgrade_revision=2**63), "status.agent.upgrade_revision"),
        (device_pb2.AgentStatus(bytes_done=5, bytes_total=4), "status.agent.bytes_done"),
        (device_pb2.AgentStatus(bytes_total=2**41), "status.agent.bytes_total"),
    ],
)  # fmt: skip
def test_agent_status_is_bounded(agent: device_pb2.AgentStatus, problem: str | None) -> None:
    """A hostile device's AgentStatus (issue 32): every field bounded, refused naming it."""
    problems = di.check_status(device_pb2.Status(agent=agent))
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith(problem), problems


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (device_pb2.ModelConfigStatus(digest="sha256:" + "a" * 64), None),
        (device_pb2.ModelConfigStatus(error="schema says no"), None),
        (device_pb2.ModelConfigStatus(digest="sha256:" + "A" * 64), "model_config.digest"),
        (device_pb2.ModelConfigStatus(digest="md5:abc"), "model_config.digest"),
        (device_pb2.ModelConfigStatus(digest="sha256:" + "a" * 65), "model_config.digest"),
        (device_pb2.ModelConfigStatus(error="x" * 1025), "model_config.error: at most 1024"),
    ],
)
def test_a_reported_model_config_is_bounded(
    config: device_pb2.ModelConfigStatus, problem: str | None
) -> None:
    """A hostile device cannot claim a config digest that is not one, nor flood the hub."""
    found = di.check_status(_status(workloads=[_workload(model_config=config)]))
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0], found
