"""PriorityClass objects: applied, got and deleted over real mutual-TLS AdminService gRPC (a
real SQLite store), refused where unknown or in use; resolved by the scheduler controller
(value, ``preemptionPolicy: Never``) and sent to devices as ``spec.priority``. Faked: the
clock of the scheduler test only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from asynctesting import async_test
from hubserving import AdminHub, make_hub_dir
from hubtesting import FakeClock
from placementtesting import device, parts

from edgefleet.api import parse_manifest
from edgefleet.v1 import admin_pb2
from hub.decide.desired import manifest_for
from hub.decide.priority import ClassValue, class_of, resolved, unknown_classes, users_of
from hub.decide.rollout import Revision, template_hash
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.store import SqliteStore


def klass(name: str, value: int, **spec: Any) -> dict[str, Any]:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "spec": {"value": value, **spec},
    }
    return parse_manifest(doc).to_dict()


def dep(name: str, **spec: Any) -> dict[str, Any]:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": name, "version": "1.0.0"}, **spec},
    }
    return parse_manifest(doc).to_dict()


def typed(doc: dict[str, Any]) -> Any:
    return parse_manifest(doc)


URGENT: dict[str, Any] = {"replicas": {"total": 1}, "resources": {"cpu": "2"}}
CLASSES = {"safety": ClassValue(5000), "polite": ClassValue(5000, preempts=False)}


@pytest.mark.parametrize(
    ("spec", "value", "preempts"),
    [
        ({}, 0, True),
        ({"priorityClassName": "high"}, 1000, True),
        ({"priorityClassName": "safety"}, 5000, True),
        ({"priorityClassName": "polite"}, 5000, False),
        ({"priority": 7}, 7, True),
        ({"priorityClassName": "deleted-by-force"}, 0, False),
    ],
)
def test_what_priority_a_deployment_has(spec: dict[str, Any], value: int, preempts: bool) -> None:
    d = typed(dep("x", **spec))
    assert class_of(d, CLASSES) == ClassValue(value, preempts)
    assert resolved(d, CLASSES).spec.effective_priority == value


def test_unknown_classes_and_users() -> None:
    deps = [
        typed(dep("a", priorityClassName="safety")),
        typed(dep("b", priorityClassName="nope")),
        typed(dep("c", priorityClassName="low")),
        typed(dep("d")),
    ]
    assert unknown_classes(deps, {"safety"}) == [("b", "nope")]
    assert users_of("safety", deps) == ["a"]


def test_a_device_is_sent_the_class_value_as_priority() -> None:
    manifest = dep("x", replicas={"perDevice": 1}, priorityClassName="safety")
    revision = Revision("x", 1, template_hash(manifest), manifest, 0.0)
    sent = orjson.loads(manifest_for(revision, {}, {"safety": 5000}))
    assert sent["spec"]["priority"] == 5000 and "priorityClassName" not in sent["spec"]
    builtin = dep("y", replicas={"perDevice": 1}, priorityClassName="high")
    revision = Revision("y", 1, template_hash(builtin), builtin, 0.0)
    assert manifest_for(revision, {}, {}) == revision.encoded  # edged knows the built-ins


@async_test
async def test_a_never_preempting_class_is_placed_first_but_evicts_nothing(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = await SqliteStore.open(tmp_path / "hub.db")
    try:
        cache = Cache(devices={"d0": device("d0", clock.now)})  # 4 cpus
        cache.put_object(dep("low", replicas={"total": 1}, resources={"cpu": "3"}), 1)
        scheduler, _, _ = parts(store, cache, clock)
        await scheduler.pass_now()
        assert cache.placements["low"] == {"d0"}

        cache.put_object(klass("polite", 5000, preemptionPolicy="Never"), 2)
        cache.put_object(
            dep(
                "urgent", replicas={"total": 1}, resources={"cpu": "2"}, priorityClassName="polite"
            ),
            3,
        )
        await scheduler.pass_now()
        assert cache.placements["low"] == {"d0"} and not cache.placements.get("urgent")
        assert "1 insufficient cpu" in cache.explanations["urgent"].message()

        # the same class, allowed to preempt: low is evicted for it
        cache.put_object(klass("polite", 5000), 4)
        await scheduler.pass_now()
        assert cache.placements["urgent"] == {"d0"} and cache.placements["low"] == frozenset()
        (event,) = [e for e in cache.events if e["reason"] == "Preempted"]
        assert "preempted by urgent (priority 5000)" in event["message"]
    finally:
        await store.close()


async def _code_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


@async_test
async def test_classes_are_applied_got_refused_when_unknown_and_kept_while_in_use(
    tmp_path: Path,
) -> None:
    hub = AdminHub(await make_hub_dir(tmp_path / "hub"))
    async with hub, hub.channel() as channel:
        stub = hub.stub(channel)
        user = orjson.dumps(dep("det", replicas={"total": 1}, priorityClassName="safety"))

        # an unknown class: refused, nothing written
        code, details = await _code_of(stub.Apply(admin_pb2.ApplyRequest(documents=[user])))
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert details.startswith(
            "nothing applied: ModelDeployment det: spec.priorityClassName: unknown class "
            "'safety' (built-in: system-critical, critical, high, default, low; "
            "PriorityClasses applied: none)"
        )
        assert "det" not in hub.ctx.cache.deployments

        # the class in the same apply: accepted; a built-in name as a class: refused
        pc = orjson.dumps(klass("safety", 5000, description="collision avoidance"))
        answer = await stub.Apply(admin_pb2.ApplyRequest(documents=[pc, user]))
        assert [r.outcome for r in answer.results] == [admin_pb2.ApplyResult.CREATED] * 2
        bad = {**klass("safety", 1), "metadata": {"name": "critical"}}
        code, details = await _code_of(
            stub.Apply(admin_pb2.ApplyRequest(documents=[orjson.dumps(bad)]))
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "is a built-in class" in details

        got = await stub.Get(admin_pb2.GetRequest(kind="PriorityClass", name="safety"))
        assert orjson.loads(got.json)["spec"] == {
            "value": 5000,
            "preemptionPolicy": "PreemptLowerPriority",
            "description": "collision avoidance",
        }
        own = admin_pb2.ListRequest(kind="PriorityClass", label_selector="!edgefleet.io/built-in")
        listed = await stub.List(own)
        assert [orjson.loads(o.json)["metadata"]["name"] for o in listed.items] == ["safety"]

        # in use: not deleted unless forced
        request = admin_pb2.DeleteRequest(kind="PriorityClass", name="safety")
        code, details = await _code_of(stub.Delete(request))
        assert code is grpc.StatusCode.FAILED_PRECONDITION
        assert "PriorityClass safety is in use by ModelDeployment det" in details
        assert await hub.ctx.store.get(storekeys.object_key("PriorityClass", "safety"))
        forced = admin_pb2.DeleteRequest(kind="PriorityClass", name="safety", force=True)
        assert (await stub.Delete(forced)).deleted
        assert not hub.ctx.cache.objects_of("PriorityClass")


@async_test
async def test_the_built_in_classes_are_shown_beside_the_applied_ones_and_never_deleted(
    tmp_path: Path,
) -> None:
    hub = AdminHub(await make_hub_dir(tmp_path / "hub"))
    async with hub, hub.channel() as channel:
        stub = hub.stub(channel)
        pc = orjson.dumps(klass("safety", 5000, preemptionPolicy="Never"))
        await stub.Apply(admin_pb2.ApplyRequest(documents=[pc]))
        listed = await stub.List(admin_pb2.ListRequest(kind="PriorityClass"))
        shown = {
            d["metadata"]["name"]: (d["spec"]["value"], d["metadata"].get("labels", {}))
            for d in (orjson.loads(o.json) for o in listed.items)
        }
        built_in = {"edgefleet.io/built-in": "true"}
        assert shown == {
            "critical": (1_000_000, built_in),
            "default": (0, built_in),
            "high": (1000, built_in),
            "low": (-1000, built_in),
            "safety": (5000, {}),
            "system-critical": (1_000_000_000, built_in),
        }
        only = admin_pb2.ListRequest(kind="PriorityClass", label_selector="edgefleet.io/built-in")
        assert len((await stub.List(only)).items) == 5
        # in pages, as any list: every class once
        names, token = [], ""
        while True:
            page = await stub.List(
                admin_pb2.ListRequest(kind="PriorityClass", limit=2, continue_token=token)
            )
            names += [orjson.loads(o.json)["metadata"]["name"] for o in page.items]
            if not (token := page.continue_token):
                break
        assert sorted(names) == sorted(shown) and len(names) == len(shown)
        got = orjson.loads(
            (await stub.Get(admin_pb2.GetRequest(kind="PriorityClass", name="critical"))).json
        )
        assert got["spec"] == {
            "value": 1_000_000,
            "preemptionPolicy": "PreemptLowerPriority",
            "description": "built in",
        }
        code, details = await _code_of(
            stub.Delete(admin_pb2.DeleteRequest(kind="PriorityClass", name="critical", force=True))
        )
        assert code is grpc.StatusCode.FAILED_PRECONDITION
        assert "PriorityClass critical is built in" in details
        code, _ = await _code_of(stub.Get(admin_pb2.GetRequest(kind="PriorityClass", name="x")))
        assert code is grpc.StatusCode.NOT_FOUND
