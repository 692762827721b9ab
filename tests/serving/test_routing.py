"""The inference router's choice when one model name is given by several workloads, and what
edged says of them: plain objects (replicas that record what they were asked, a response
slot), no sockets, no workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from edged.reconcile.model import WorkloadStatus
from edged.serving.inference import InferenceRouter
from edged.serving.measuring import RevisionMeters
from edged.statusboard import overlay_serving
from edged.workloads import DesiredWorkload, WorkloadName, serving_order
from edgefleet.api import ModelDeployment, parse_manifest


@dataclass
class Limits:
    memory_bytes: int = 1 << 30


@dataclass
class Spec:
    model_name: str
    model_version: str
    max_batch_size: int = 1
    limits: Limits = field(default_factory=Limits)


@dataclass
class FakeReplica:
    workload: str
    spec: Spec
    inflight: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    forwarded: int = 0

    def forward(self, req: Any, resp: Any) -> None:
        self.forwarded += 1
        resp.send(200, b"{}")


class Req:
    def __init__(self, path: str, method: str = "POST") -> None:
        self.path = path
        self.method = method
        self.headers: dict[str, str] = {}
        self.body = b""


class Resp:
    def __init__(self) -> None:
        self.status = 0

    def send(self, status: int, body: bytes, *_: Any) -> None:
        self.status = status

    def send_error(self, status: int, message: str) -> None:
        self.status = status

    def send_json(self, status: int, doc: Any) -> None:
        self.status = status


def replica(workload: str, version: str = "1.0.0", model: str = "mlp") -> FakeReplica:
    return FakeReplica(workload, Spec(model, version))


def infer(router: InferenceRouter, path: str = "/v2/models/mlp/infer") -> int:
    resp = Resp()
    router.handle(Req(path), resp)  # type: ignore[arg-type]
    return resp.status


class Routed:
    def __init__(self) -> None:
        self.refused: list[tuple[str, str | None]] = []
        self.router = InferenceRouter(
            lambda: True, refused=lambda w, v: self.refused.append((w, v))
        )

    def ready(self, *reps: FakeReplica) -> None:
        for rep in reps:
            self.router.replica_ready(rep, True)  # type: ignore[arg-type]


def test_one_model_two_workloads_goes_to_the_first_in_order() -> None:
    r = Routed()
    r.router.set_models({"mlp": (("a", "1.0.0"), ("b", "2.0.0"))})
    a, b = replica("a"), replica("b", "2.0.0")
    r.ready(b, a)  # readiness order does not matter
    assert [infer(r.router) for _ in range(4)] == [200] * 4
    assert (a.forwarded, b.forwarded) == (4, 0)
    # a version asked for goes to the workload that has it
    assert infer(r.router, "/v2/models/mlp/versions/2.0.0/infer") == 200
    assert b.forwarded == 1


def test_deleting_the_serving_workload_routes_to_the_other_at_once() -> None:
    r = Routed()
    r.router.set_models({"mlp": (("a", "1.0.0"), ("b", "1.0.0"))})
    a, b = replica("a"), replica("b")
    r.ready(a, b)
    r.router.set_models({"mlp": (("b", "1.0.0"),)})  # "a" deleted: its replica drains
    r.router.replica_ready(a, False)  # type: ignore[arg-type]
    assert infer(r.router) == 200
    assert b.forwarded == 1 and r.refused == []


def test_the_first_without_a_ready_replica_leaves_it_to_the_other() -> None:
    r = Routed()
    r.router.set_models({"mlp": (("a", "1.0.0"), ("b", "1.0.0"))})
    b = replica("b")
    r.ready(b)
    assert infer(r.router) == 200 and b.forwarded == 1


def test_a_request_with_no_ready_replica_is_refused_and_reported() -> None:
    r = Routed()
    r.router.set_models({"mlp": (("a", "1.0.0"),)})
    assert infer(r.router) == 503
    assert infer(r.router, "/v2/models/mlp/versions/1.0.0/infer") == 503
    assert r.refused == [("a", None), ("a", "1.0.0")]
    assert infer(r.router, "/v2/models/other/infer") == 404  # not a model here: not counted
    assert len(r.refused) == 2


def test_refused_requests_are_errors_of_the_revision() -> None:
    now = [100.0]
    meters = RevisionMeters(period=0.0, clock=lambda: now[0])
    meters.answered("a", "r1", 200, 0.01)
    meters.refused("a", "r1")
    got = meters.of("a", "r1")
    assert got is not None
    assert (got.requests, got.errors, got.window_requests) == (2, 1, 1)  # no latency added


def desired(name: str, model: str) -> DesiredWorkload:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": model, "version": "1.0.0", "path": "m.onnx"}},
    }
    dep = parse_manifest(doc)
    assert isinstance(dep, ModelDeployment)
    return DesiredWorkload(dep, "0" * 64)


def test_serving_order_is_by_workload_name() -> None:
    workloads = {
        WorkloadName(n): desired(n, m) for n, m in (("z", "mlp"), ("a", "mlp"), ("x", "x"))
    }
    assert serving_order(workloads) == {"mlp": ("a", "z"), "x": ("x",)}


def test_routes_follow_the_desired_workloads_in_serving_order() -> None:
    r = Routed()
    r.router.route({WorkloadName(n): desired(n, "mlp") for n in ("z", "a")})
    a, z = replica("a"), replica("z")
    r.ready(z, a)
    assert infer(r.router) == 200 and (a.forwarded, z.forwarded) == (1, 0)
    r.router.route({WorkloadName("z"): desired("z", "mlp")})  # "a" deleted: "z" serves
    assert infer(r.router) == 200 and z.forwarded == 1
    r.router.route({})
    assert infer(r.router) == 404  # no workload gives the name any more


RUNNING = WorkloadStatus("Running", 1, 1, "r1")


@pytest.mark.parametrize(
    ("status", "serving", "recently", "phase", "added"),
    [
        pytest.param(RUNNING, None, False, "Running", [], id="alone-serving"),
        pytest.param(RUNNING, "a", False, "Degraded", ["ModelNameConflict"], id="standing-by"),
        pytest.param(RUNNING, None, True, "Degraded", ["Serving"], id="refused-recently"),
        pytest.param(
            WorkloadStatus("Progressing", 0, 1, "r1"),
            "a",
            True,
            "Progressing",
            ["ModelNameConflict", "Serving"],
            id="not-running-keeps-phase",
        ),
    ],
)
def test_overlay_serving(
    status: WorkloadStatus, serving: str | None, recently: bool, phase: str, added: list[str]
) -> None:
    got = overlay_serving(
        status,
        model="mlp",
        serving=WorkloadName(serving) if serving else None,
        refused=3,
        refused_recently=recently,
    )
    assert got.phase == phase
    assert [c.type for c in got.conditions] == added
    for c in got.conditions:
        assert c.message and (serving is None or serving in c.message or c.type == "Serving")
