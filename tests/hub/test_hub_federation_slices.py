"""Federation's pure decisions as tables (docs/federation.md): what a region's slice holds
(placement, overrides, variants), what applying it writes, a region's report checked and the
regions' figures added up."""

from __future__ import annotations

from typing import Any

import pytest
from hubfederationtesting import (
    deployment,
    inventory_report,
    model_value,
    record,
    report,
)

from edgefleet.api import parse_manifest
from hub.controllers.parentlink.sliceapply import STATE_KEY, plan_apply
from hub.decide import regionslice
from hub.decide.regionslice import StoredValue
from hub.state import regionmapping, storekeys
from hub.state import regions as regions_module
from hub.state.regions import RegionState
from hub.state.store import Delete, Put


@pytest.mark.parametrize(
    ("regions", "region", "expected"),
    [(None, "eu", True), ([], "eu", True), (["eu"], "eu", True), (["us"], "eu", False)],
)
def test_a_deployment_goes_to_the_regions_it_names_or_to_all(
    regions: list[str] | None, region: str, expected: bool
) -> None:
    assert regionslice.goes_to(deployment("d", regions), region) is expected


def test_other_kinds_go_everywhere_and_unknown_kinds_nowhere() -> None:
    assert regionslice.goes_to({"kind": "SecurityBaseline", "metadata": {"name": "b"}}, "eu")
    assert not regionslice.goes_to({"kind": "Secret", "metadata": {"name": "s"}}, "eu")


def test_a_slice_carries_the_models_of_its_deployments_and_their_revisions() -> None:
    models = {
        ("a", "1.0.0"): record("a", "1.0.0"),
        ("a", "0.9.0"): record("a", "0.9.0"),
        ("b", "1.0.0"): record("b", "1.0.0"),
    }
    objects = [deployment("a", ["eu"]), deployment("b", ["us"]), deployment("c")]
    s = regionslice.plan_slice("eu", objects, models, {"a": [("a", "0.9.0")]}, [b"root"])
    assert [o["metadata"]["name"] for o in s.objects] == ["a", "c"]
    assert [(m.name, m.version) for m in s.models] == [("a", "0.9.0"), ("a", "1.0.0")]  # c unpushed
    again = regionslice.plan_slice(
        "eu", list(reversed(objects)), models, {"a": [("a", "0.9.0")]}, [b"root"]
    )
    assert again.digest == s.digest
    other = regionslice.plan_slice("eu", objects, models, {}, [b"root2"])
    assert other.digest != s.digest
    message = regionmapping.slice_message(s, 7)
    assert message.models[1].envelope == b"{}" and message.generation == 7


def test_applying_a_slice_replaces_local_objects_drops_old_root_objects_keeps_own() -> None:
    a, b = deployment("a"), deployment("b")
    root_owned_old = storekeys.federated_object_value(deployment("old"), 1.0, 3)
    stored = {
        storekeys.object_key("ModelDeployment", "a"): StoredValue(
            "k", storekeys.object_value(a, 1.0), 5
        ),
        storekeys.object_key("ModelDeployment", "old"): StoredValue("k", root_owned_old, 6),
        storekeys.object_key("ModelDeployment", "mine"): StoredValue(
            "k", storekeys.object_value(deployment("mine"), 1.0), 7
        ),
        storekeys.object_key("ModelDeployment", "b"): StoredValue(
            "k", storekeys.federated_object_value(b, 2.0, 4), 8
        ),
    }
    plan = plan_apply(9, "d", [a, b], [record("a", "1.0.0")], stored, {}, now=100.0)
    assert [o["metadata"]["name"] for o in plan.put_objects] == ["a"]  # b unchanged, mine kept
    assert plan.dropped_objects == (("ModelDeployment", "old"),)
    assert [(c.key, c.mod_revision) for c in plan.compares] == [
        (storekeys.object_key("ModelDeployment", "a"), 5),
        (storekeys.object_key("ModelDeployment", "old"), 6),
        (storekeys.model_key("a", "1.0.0"), 0),
    ]
    puts = {op.key: op for op in plan.ops if isinstance(op, Put)}
    assert (
        storekeys.federated_generation(puts[storekeys.object_key("ModelDeployment", "a")].value)
        == 9
    )
    assert storekeys.created_of(puts[storekeys.object_key("ModelDeployment", "a")].value) == 1.0
    assert storekeys.loads(puts[STATE_KEY].value) == {"generation": 9, "digest": "d"}
    assert any(isinstance(op, Delete) for op in plan.ops)
    model_doc = storekeys.loads(puts[storekeys.model_key("a", "1.0.0")].value)
    assert storekeys.ModelRecord.from_json(model_doc).envelope == b"{}"  # relayed as it came
    # the same slice again changes nothing but the state key
    stored_models = {
        storekeys.model_key("a", "1.0.0"): StoredValue(
            "k", puts[storekeys.model_key("a", "1.0.0")].value, 10
        )
    }
    stored[storekeys.object_key("ModelDeployment", "a")] = StoredValue(
        "k", puts[storekeys.object_key("ModelDeployment", "a")].value, 10
    )
    del stored[storekeys.object_key("ModelDeployment", "old")]
    again = plan_apply(9, "d", [a, b], [record("a", "1.0.0")], stored, stored_models, now=101.0)
    assert again.compares == () and len(again.ops) == 1


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda r: r.deployments.add(name="a"), "report.deployments[1].name: 'a' twice"),
        (lambda r: setattr(r.deployments[0], "ready", 9), "must not exceed desired"),
        (
            lambda r: setattr(r.deployments[0], "name", "x" * 300),
            "report.deployments[0].name: at most 253",
        ),
        (lambda r: r.deployments[0].failing.update({"d": "y" * 2000}), "at most 1024 characters"),
        (lambda r: setattr(r.inventory, "total", 0), "report.inventory.total"),
        (
            lambda r: r.inventory.devices[0].labels.update({"bad key!": "v"}),
            "report.inventory.devices[0].labels",
        ),
        (
            lambda r: r.inventory.devices[0].labels.update({"k": "bad value!"}),
            "report.inventory.devices[0].labels['k']: must be a label value",
        ),
        (
            lambda r: r.inventory.devices[0].labels.update({f"k{i}": "v" for i in range(65)}),
            "labels: at most 64",
        ),
    ],
)
def test_a_report_over_a_bound_is_refused_naming_the_field(change: Any, problem: str) -> None:
    r = report()
    assert regionmapping.check_report(r) == []
    change(r)
    assert any(problem in p for p in regionmapping.check_report(r)), regionmapping.check_report(r)


def test_too_many_devices_in_a_report() -> None:
    r = report(devices=regionslice.MAX_REPORT_DEVICES + 1)
    assert any("report.inventory.devices: at most" in p for p in regionmapping.check_report(r))


def test_the_root_adds_every_regions_figures() -> None:
    own = {"desiredDevices": 1, "readyDevices": 1, "failing": {"x": "Failed"}, "versions": {}}
    regions: dict[str, dict[str, Any] | None] = {
        "eu": {
            "desiredDevices": 2,
            "readyDevices": 1,
            "failing": {"d1": "Refused"},
            "versions": {"1.0.0": 2},
        },
        "us": None,
    }
    out = regionslice.add_regions(own, regions)
    assert out["desiredDevices"] == 3 and out["readyDevices"] == 2
    assert out["failing"] == {"eu/d1": "Refused", "x": "Failed"}
    assert out["versions"]["1.0.0"]["devices"] == 2
    assert out["regions"]["us"] is None


def with_annotations(doc: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    return {**doc, "metadata": {**doc["metadata"], "annotations": annotations}}


def test_a_region_gets_its_replica_override() -> None:
    total = deployment("a")
    total["spec"]["replicas"] = {"total": 2}
    doc = with_annotations(total, {"federation.edgefleet.io/replicas.eu": "5"})
    s = regionslice.plan_slice("eu", [doc], {}, {}, [])
    assert s.objects[0]["spec"]["replicas"] == {"total": 5}
    assert regionslice.plan_slice("us", [doc], {}, {}, []).objects[0]["spec"]["replicas"] == {
        "total": 2
    }
    per = with_annotations(deployment("b"), {"federation.edgefleet.io/replicas.eu": "3"})
    assert regionslice.with_overrides(per, "eu")["spec"]["replicas"] == {"perDevice": 3}


def test_a_region_gets_its_model_variant_at_the_deployments_versions() -> None:
    doc = with_annotations(
        deployment("det", version="2.0.0"),
        {
            "federation.edgefleet.io/model.eu": "det-int8",
            "federation.edgefleet.io/replicas.eu": "2",
        },
    )
    models = {
        (n, v): record(n, v) for n in ("det", "det-int8") for v in ("1.0.0", "2.0.0", "3.0.0")
    }
    revisions = {"det": [("det", "1.0.0"), ("det", "2.0.0")]}
    eu = regionslice.plan_slice("eu", [doc], models, revisions, [])
    assert eu.objects[0]["spec"]["model"] == {"name": "det-int8", "version": "2.0.0"}
    assert eu.objects[0]["spec"]["replicas"] == {"perDevice": 2}  # both overrides
    assert [(m.name, m.version) for m in eu.models] == [
        ("det-int8", "1.0.0"),
        ("det-int8", "2.0.0"),
    ]
    us = regionslice.plan_slice("us", [doc], models, revisions, [])
    assert us.objects[0]["spec"]["model"] == {"name": "det", "version": "2.0.0"}
    assert [(m.name, m.version) for m in us.models] == [("det", "1.0.0"), ("det", "2.0.0")]
    assert regionslice.with_overrides(doc, "us") is doc


def test_a_region_gets_its_precision_variant() -> None:
    doc = with_annotations(deployment("det"), {"federation.edgefleet.io/precision.eu": "int8"})
    doc["spec"]["runtime"] = {"maxBatchSize": 4}
    doc = parse_manifest(doc).to_dict()
    eu = regionslice.plan_slice("eu", [doc], {}, {}, []).objects[0]
    assert eu["spec"]["runtime"] == {**doc["spec"]["runtime"], "precision": "int8"}
    assert eu["spec"]["model"] == doc["spec"]["model"]  # the same artifact, another extra
    assert parse_manifest(dict(eu)).to_dict() == eu  # a canonical manifest the region accepts
    assert regionslice.plan_slice("us", [doc], {}, {}, []).objects[0] == doc


@pytest.mark.parametrize(
    ("annotations", "problem"),
    [
        (
            {"federation.edgefleet.io/replicas.eu": "0"},
            "must be a whole number from 1 to 100000, got '0'",
        ),
        ({"federation.edgefleet.io/replicas.eu": "two"}, "got 'two'"),
        ({"federation.edgefleet.io/replicas.EU_1": "2"}, "the region: must be a DNS label"),
        ({"federation.edgefleet.io/model.eu": "Det Int8"}, "the model name: must be a DNS label"),
        ({"federation.edgefleet.io/model.eu": ""}, "the model name:"),
        ({"federation.edgefleet.io/model.EU_1": "det-int8"}, "the region: must be a DNS label"),
        (
            {"federation.edgefleet.io/runtime.eu": "fp16"},
            "not supported: the per-region overrides are federation.edgefleet.io/replicas.<region>"
            " (a replica count), federation.edgefleet.io/model.<region> (a model variant) and "
            "federation.edgefleet.io/precision.<region> (a precision variant)",
        ),
        ({"federation.edgefleet.io/max-weight": "10"}, "not applied by hand"),
        (
            {"federation.edgefleet.io/precision.eu": "int4"},
            'must be one of fp32, fp16, int8, got "int4"',
        ),
    ],
)
def test_a_bad_override_is_refused_at_apply_naming_the_annotation(
    annotations: dict[str, str], problem: str
) -> None:
    from edgefleet.errors import ValidationError
    from hub.decide import apply

    doc = with_annotations(deployment("a"), annotations)
    with pytest.raises(ValidationError) as err:
        apply.parse_documents([storekeys.dumps(doc)])
    text = "\n".join(str(p) for p in err.value.problems)
    key = next(iter(annotations))
    assert f'documents[0].metadata.annotations["{key}"]' in text, text
    assert problem in text, text
    assert apply.parse_documents([storekeys.dumps(deployment("a"))])  # no override: fine


def test_a_model_variant_is_refused_where_it_cannot_apply() -> None:
    from edgefleet.errors import ValidationError
    from hub.decide import apply

    pinned = deployment("a")
    pinned["spec"]["model"]["sha256"] = "ab" * 32
    baseline = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "SecurityBaseline",
        "metadata": {"name": "fleet"},
        "spec": {"requireAttestation": False},
    }
    for doc, problem in (
        (pinned, "spec.model may not pin the artifact itself (it sets sha256)"),
        (baseline, "a model override applies to a ModelDeployment only"),
    ):
        annotated = with_annotations(doc, {"federation.edgefleet.io/model.eu": "a-int8"})
        with pytest.raises(ValidationError) as err:
            apply.parse_documents([storekeys.dumps(annotated)])
        text = "\n".join(str(p) for p in err.value.problems)
        assert problem in text, text


def test_a_region_object_is_small_whatever_the_regions_size() -> None:
    """``get regions`` is bounded by the number of regions: a Region carries counts, never
    the region's device or deployment lists (a report may list 20,000 devices)."""
    state = RegionState("eu", "ab", 1.0, not_after=2.0)
    big = inventory_report({"Ready": regionslice.MAX_REPORT_DEVICES}, deployments=2000)
    seen = regions_module.Seen(big, 5.0, connected=True)
    doc = regions_module.region_object(state, seen, now=7.0, here="hub")
    assert len(storekeys.dumps(doc)) < 1024
    assert doc["status"]["devices"] == {
        "total": regionslice.MAX_REPORT_DEVICES,
        "ready": regionslice.MAX_REPORT_DEVICES,
        "byPhase": {"Ready": regionslice.MAX_REPORT_DEVICES},
    }
    assert doc["status"]["deployments"] == 2000 and doc["status"]["reportAgeSeconds"] == 2.0


def test_root_models_no_longer_sent_nor_used_are_removed_never_the_regions_own() -> None:
    records = {v: record("m", v) for v in ("1.0.0", "2.0.0", "3.0.0", "4.0.0", "5.0.0", "6.0.0")}
    owned = {"1.0.0", "2.0.0", "3.0.0", "4.0.0", "6.0.0"}  # 5.0.0 was pushed at the region
    stored_models = {
        storekeys.model_key("m", v): StoredValue(
            "k", model_value(r, 3 if v in owned else None), 10 + i
        )
        for i, (v, r) in enumerate(sorted(records.items()))
    }
    local = deployment("mine", version="3.0.0")  # the region's own deployment uses m 3.0.0
    local["spec"]["model"]["name"] = "m"
    stored_objects = {
        storekeys.object_key("ModelDeployment", "mine"): StoredValue(
            "k", storekeys.object_value(local, 1.0), 5
        )
    }
    plan = plan_apply(
        9,
        "d",
        [deployment("m", version="2.0.0")],  # sent without its model record: still used
        [records["6.0.0"]],  # still sent
        stored_objects,
        stored_models,
        now=100.0,
        kept={("m", "4.0.0")},  # a revision of the region's may go back to it
    )
    assert plan.dropped_models == (("m", "1.0.0"),)
    key = storekeys.model_key("m", "1.0.0")
    assert [op.key for op in plan.ops if isinstance(op, Delete)] == [key]
    assert (key, 10) in [(c.key, c.mod_revision) for c in plan.compares]
    # nothing sent and nothing used: every root-owned model goes, the region's push stays
    bare = plan_apply(10, "e", [], [], {}, stored_models, now=101.0)
    assert sorted(v for _, v in bare.dropped_models) == sorted(owned)


def agent_report() -> Any:
    """A region of 3 devices reporting one AgentUpgrade and the releases its hub holds."""
    r = report(devices=3)
    r.agent_upgrades.add(
        name="edged-0-3-0",
        version="0.3.0",
        phase="RolledBack",
        revision=1,
        pool=3,
        done=1,
        updating=1,
        failed_count=1,
        failed={"d1": "CommitDeadline: did not connect"},
    )
    r.agent_release_versions.extend(["0.2.0", "0.3.0"])
    return r


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            lambda r: r.agent_upgrades.add(name="edged-0-3-0", phase="Pending"),
            "'edged-0-3-0' twice",
        ),
        (lambda r: setattr(r.agent_upgrades[0], "phase", "Done!"), ".phase: must be one of"),
        (lambda r: setattr(r.agent_upgrades[0], "pool", 4), "pool: more than the region's devices"),
        (lambda r: setattr(r.agent_upgrades[0], "done", 3), "must not exceed pool (3)"),
        (lambda r: setattr(r.agent_upgrades[0], "failed_count", 10**6), "failed_count: more than"),
        (
            lambda r: r.agent_upgrades[0].failed.update({"d2": "x"}),
            "failed: at most 20 and failed_count (1), got 2",
        ),
        (
            lambda r: r.agent_upgrades[0].failed.update({"d1": "y" * 2000}),
            "at most 1024 characters",
        ),
        (
            lambda r: [r.agent_upgrades.add(name=f"u{i}", phase="Pending") for i in range(64)],
            "report.agent_upgrades: at most 64",
        ),
        (
            lambda r: r.agent_release_versions.extend(["1.0.0"] * 64),
            "report.agent_release_versions: at most 64",
        ),
        (
            lambda r: setattr(r.agent_upgrades[0], "message", "m" * 2000),
            "report.agent_upgrades[0].message: at most 1024",
        ),
    ],
)
def test_a_regions_agent_upgrades_over_a_bound_are_refused_naming_the_field(
    change: Any, problem: str
) -> None:
    r = agent_report()
    assert regionmapping.check_report(r) == []
    change(r)
    assert any(problem in p for p in regionmapping.check_report(r)), regionmapping.check_report(r)


def test_the_root_shows_a_regions_agent_upgrades_as_reported() -> None:
    r = agent_report()
    shown = regionmapping.region_agent_upgrade_json(r.agent_upgrades[0])
    assert shown == {
        "version": "0.3.0",
        "phase": "RolledBack",
        "revision": 1,
        "poolDevices": 3,
        "doneDevices": 1,
        "updatingDevices": 1,
        "failedCount": 1,
        "failedDevices": {"d1": "CommitDeadline: did not connect"},
    }


def model_config(name: str, model: str, threshold: float = 0.5) -> dict[str, Any]:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelConfig",
        "metadata": {"name": name},
        "spec": {"model": model, "data": {"threshold": threshold}},
    }
    return parse_manifest(doc).to_dict()


def test_a_slice_carries_the_model_configs_of_its_deployments() -> None:
    models = {("a", "1.0.0"): record("a", "1.0.0"), ("b", "1.0.0"): record("b", "1.0.0")}
    variant = deployment("v")
    variant["metadata"]["annotations"] = {f"{regionslice.MODEL_OVERRIDE}eu": "v-int8"}
    objects = [
        deployment("a", ["eu"]),
        deployment("b", ["us"]),
        variant,
        model_config("cfg-a", "a"),
        model_config("cfg-b", "b"),
        model_config("cfg-v", "v"),  # eu runs v-int8: sent naming it
        model_config("cfg-none", "none"),  # no deployment of it
    ]
    eu = regionslice.plan_slice("eu", objects, models, {}, [b"root"])
    assert [(o["kind"], o["metadata"]["name"]) for o in eu.objects] == [
        ("ModelConfig", "cfg-a"),
        ("ModelConfig", "cfg-v"),
        ("ModelDeployment", "a"),
        ("ModelDeployment", "v"),
    ]
    # eu runs v's variant: the config it gets names it (the deployment's model there)
    sent_v = next(o for o in eu.objects if o["metadata"]["name"] == "cfg-v")
    assert sent_v["spec"]["model"] == "v-int8" and sent_v["spec"]["data"] == {"threshold": 0.5}
    us = regionslice.plan_slice("us", objects, models, {}, [b"root"])
    assert ("ModelConfig", "cfg-b") in [(o["kind"], o["metadata"]["name"]) for o in us.objects]
    assert ("ModelConfig", "cfg-v") in [(o["kind"], o["metadata"]["name"]) for o in us.objects]
    # a config change changes the slice's digest (the region is sent it again)
    changed = [*objects[:3], model_config("cfg-a", "a", 0.7), *objects[4:]]
    assert regionslice.plan_slice("eu", changed, models, {}, [b"root"]).digest != eu.digest
    # a slice without configs keeps the digest it had before configs travelled
    bare = regionslice.plan_slice("eu", objects[:3], models, {}, [b"root"])
    assert bare.digest == regionslice.plan_slice("eu", objects[:3], models, {}, [b"root"]).digest
    assert regionslice.with_model_variant(variant, ["eu", "us"]) == ["eu"]


def test_applying_a_slice_config_replaces_the_regions_own_config_of_that_model() -> None:
    a = deployment("a")
    own_same_model = model_config("local-a", "a")
    own_other_model = model_config("local-b", "b")
    stored = {
        storekeys.object_key("ModelConfig", "local-a"): StoredValue(
            "k", storekeys.object_value(own_same_model, 1.0), 5
        ),
        storekeys.object_key("ModelConfig", "local-b"): StoredValue(
            "k", storekeys.object_value(own_other_model, 1.0), 6
        ),
    }
    root_config = model_config("cfg-a", "a")
    plan = plan_apply(4, "d", [a, root_config], [record("a", "1.0.0")], stored, {}, 10.0)
    assert ("ModelConfig", "local-a") in plan.dropped_objects
    assert ("ModelConfig", "local-b") not in plan.dropped_objects  # another model: kept
    assert Delete(storekeys.object_key("ModelConfig", "local-a")) in plan.ops
    assert [o["metadata"]["name"] for o in plan.put_objects] == ["a", "cfg-a"]


def test_a_slice_config_that_does_not_parse_is_refused_by_the_region() -> None:
    from edgefleet.v1 import federation_pb2
    from hub.controllers.parentlink.sliceapply import check_slice

    bad = model_config("cfg", "a")
    bad["spec"]["data"] = {"apiToken": "x"}  # a credential-like key: refused as at apply
    import orjson

    message = federation_pb2.RegionSlice(objects=[orjson.dumps(bad)])
    (problem,) = check_slice(message)
    assert problem.startswith("slice.objects[0]:") and "apiToken" in problem, problem


def _config_report(**fields: Any) -> Any:
    from edgefleet.v1 import federation_pb2

    r = report()
    r.deployments[0].config.CopyFrom(federation_pb2.RegionConfigStatus(**fields))
    return r


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"devices": 1, "running_desired": 2}, "config: running_desired and not_running_devices"),
        ({"devices": 1, "not_running_devices": 0, "not_running": {"d": "x"}}, "not_running: at"),
        (
            {
                "devices": 40,
                "not_running_devices": 40,
                "not_running": {f"d{i}": "x" for i in range(33)},
            },
            "config.not_running: at most 32",
        ),
        ({"devices": 1, "model_config": "x" * 2000}, "config.model_config: at most"),
        (
            {"devices": 1, "not_running_devices": 1, "not_running": {"d": "y" * 2000}},
            "config.not_running['d']: at most",
        ),
    ],
)
def test_a_regions_config_figures_over_a_bound_are_refused(
    fields: dict[str, Any], problem: str
) -> None:
    assert regionmapping.check_report(_config_report(devices=2, running_desired=1)) == []
    found = regionmapping.check_report(_config_report(**fields))
    assert any(problem in p for p in found), found


def test_the_root_adds_every_regions_config_figures() -> None:
    r = _config_report(
        model_config="det", devices=3, running_desired=2, not_running_devices=1,
        not_running={"cam-9": "runs sha256:1c2d, not sha256:9f8e"},
    )  # fmt: skip
    shown = regionmapping.region_deployment_json(r.deployments[0])
    assert shown["config"] == {
        "modelConfig": "det",
        "devices": 3,
        "runningDesired": 2,
        "notRunningDesired": {"cam-9": "runs sha256:1c2d, not sha256:9f8e"},
    }
    own = {"config": {"modelConfig": "det", "devices": 1, "runningDesired": 1,
                      "notRunningDesired": {}}}  # fmt: skip
    out = regionslice.add_regions(own, {"eu": shown, "us": None})
    assert out["config"] == {
        "modelConfig": "det",
        "devices": 4,
        "runningDesired": 3,
        "notRunningDesired": {"eu/cam-9": "runs sha256:1c2d, not sha256:9f8e"},
    }
    assert "config" not in regionslice.add_regions({}, {"eu": {"desiredDevices": 1}})


def test_a_region_in_waves_gets_the_config_of_the_revision_it_is_sent() -> None:
    from hub.decide.modelconfigs import config_text

    current, stable = model_config("cfg-a", "a", 0.7), model_config("cfg-a", "a", 0.5)
    objects = [deployment("a"), current]
    models = {("a", "1.0.0"): record("a", "1.0.0")}

    def sent(configs: dict[str, str] | None) -> list[Any]:
        s = regionslice.plan_slice("eu", objects, models, {}, [b"root"], configs)
        return [o for o in s.objects if o["kind"] == "ModelConfig"]

    assert sent(None) == [current]  # no waves: the current one
    assert sent({"a": config_text([stable], "a")}) == [stable]  # before its wave: the stable's
    assert sent({"a": ""}) == []  # the stable revision had none
