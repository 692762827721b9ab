"""ModelDeployment manifests: parsing, every problem with its path, canonical round trips.

Pure: documents are Python data or YAML text parsed in memory; nothing faked.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from manifesttesting import DESIGN_EXAMPLE

from edgefleet.api import (
    API_VERSION,
    SUPPORTED_KINDS,
    IntOrPercent,
    ModelDeployment,
    ModelDeploymentSpec,
    ModelRef,
    ObjectMeta,
    Probe,
    Replicas,
    RuntimeSpec,
    TolerationOperator,
    parse_manifest,
)
from edgefleet.errors import ValidationError


def minimal(**spec: Any) -> dict[str, Any]:
    """A minimal valid ModelDeployment document, with ``spec`` fields added or replaced."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": "mnist"},
        "spec": {"model": {"name": "mnist", "version": "1.0"}, **spec},
    }


def problems_of(doc: object) -> dict[str, str]:
    """Path -> message of every problem ``doc`` has (one message per path)."""
    with pytest.raises(ValidationError) as info:
        parse_manifest(doc, source="test.yaml")
    assert info.value.source == "test.yaml"
    return {p.path: p.message for p in info.value.problems}


def test_power_and_precision_parse_and_round_trip() -> None:
    doc = minimal(
        runtime={"precision": "int8"},
        power={
            "schedule": [{"from": "22:00", "to": "06:00", "precision": "fp16"}],
            "lowBattery": {"below": "25%", "precision": "int8"},
        },
    )
    m = parse_manifest(doc)
    assert isinstance(m, ModelDeployment)
    assert m.spec.power is not None and m.spec.power.low_battery is not None
    assert m.spec.power.low_battery.below_percent == 25
    assert m.spec.to_dict()["power"]["lowBattery"] == {"below": "25%", "precision": "int8"}
    assert parse_manifest(m.to_dict()) == m


def test_scaling_with_replicas_total_is_the_hubs() -> None:
    m = parse_manifest(minimal(replicas={"total": 3}, scaling={"maxReplicas": 6}))
    assert isinstance(m, ModelDeployment) and m.spec.scaling is not None
    assert m.spec.scaling.max_replicas == 6


def test_design_example_parses() -> None:
    doc = yaml.safe_load(DESIGN_EXAMPLE)
    m = parse_manifest(doc)
    assert isinstance(m, ModelDeployment)
    assert (m.kind, m.name, m.api_version) == ("ModelDeployment", "fraud-detection", API_VERSION)
    s = m.spec
    assert (s.model.name, s.model.version) == ("fraud-detection", "2.4.1")
    assert s.runtime.max_batch_size == 8
    assert s.runtime.execution_providers == ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert s.replicas == Replicas(per_device=1, total=None)
    assert (s.resources.cpu_millis, s.resources.memory_bytes) == (500, 256 * 2**20)
    assert s.resources.accelerator == "npu"
    assert s.placement.node_selector == {"site": "retail"}
    assert s.placement.tolerations[0].key == "battery"
    assert s.placement.tolerations[0].operator is TolerationOperator.EXISTS
    assert s.placement.regions == ("eu-frankfurt", "eu-dublin")
    assert s.placement.topology_spread is not None
    assert s.placement.topology_spread.min_per_domain == 2
    assert s.probes.startup == Probe(timeout_s=60.0, period_s=1.0, failure_threshold=3)
    assert s.probes.readiness.period_s == 5.0
    assert s.probes.liveness == Probe(timeout_s=5.0, period_s=10.0, failure_threshold=3)
    assert s.rollout.max_unavailable == IntOrPercent(10, percent=True)
    assert s.rollout.max_surge == IntOrPercent(25, percent=True)
    assert s.rollout.canary is not None
    assert s.rollout.canary.weights == (5, 50, 100)
    assert s.rollout.canary.analysis is not None
    assert s.rollout.canary.analysis.min_accuracy == 0.98
    assert s.rollout.canary.analysis.window_s == 60.0
    assert s.scaling is not None
    assert (s.scaling.min_replicas, s.scaling.max_replicas) == (1, 4)
    assert s.scaling.cpu_down_below == 40
    assert (s.scaling.scale_up_window_s, s.scaling.scale_down_window_s) == (15.0, 300.0)


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        ({"scaling": {"minReplicas": 0, "maxReplicas": 4}}, "spec.scaling.minReplicas", "zero"),
    ],
)
def test_what_is_not_built_is_refused(spec: dict[str, Any], path: str, words: str) -> None:
    problems = problems_of(minimal(**spec))
    assert list(problems) == [path]
    assert problems[path].startswith("not supported yet") and words in problems[path]


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        ({"priority": "high"}, "spec.priority", "integer"),
        ({"priority": 2_000_000_000}, "spec.priority", "got 2000000000"),
        (
            {"scaling": {"maxReplicas": 2, "scaleUpWindow": "2h"}},
            "spec.scaling.scaleUpWindow",
            "1h",
        ),
        ({"scaling": {"maxReplicas": 2, "cpuDownBelow": "0%"}}, "spec.scaling.cpuDownBelow", "1%"),
        ({"scaling": {"maxReplicas": 2, "queueDepthUp": 0}}, "spec.scaling.queueDepthUp", "from 1"),
    ],
)
def test_priority_and_scaling_bounds(spec: dict[str, Any], path: str, words: str) -> None:
    problems = problems_of(minimal(**spec))
    assert list(problems) == [path] and words in problems[path]


def test_priority_and_scaling_windows_parse() -> None:
    m = parse_manifest(
        minimal(
            priority=100,
            scaling={"maxReplicas": 3, "scaleUpWindow": "3s", "scaleDownWindow": "0s"},
        )
    )
    assert m.spec.priority == 100 and m.spec.effective_priority == 100
    assert m.spec.scaling is not None
    assert (m.spec.scaling.scale_up_window_s, m.spec.scaling.scale_down_window_s) == (3.0, 0.0)
    assert parse_manifest(minimal()).spec.effective_priority == 0
    assert "priority" not in parse_manifest(minimal()).to_dict()["spec"]


def test_minimal_manifest_takes_defaults() -> None:
    m = parse_manifest(minimal())
    assert m.spec == ModelDeploymentSpec(model=ModelRef(name="mnist", version="1.0"))
    assert m.spec.runtime == RuntimeSpec(
        max_batch_size=1, max_queue_delay=0.002, execution_providers=("CPUExecutionProvider",)
    )
    assert m.spec.replicas.count_on_device() == 1
    assert m.spec.scaling is None
    assert m.spec.power is None


def test_null_means_default() -> None:
    doc = minimal(runtime={"maxBatchSize": None, "precision": None}, replicas=None, rollout=None)
    doc["metadata"]["labels"] = None
    assert parse_manifest(doc) == parse_manifest(minimal())


def test_status_is_accepted_and_dropped() -> None:
    doc = minimal()
    doc["status"] = {"observedGeneration": 3, "anything": ["at", "all"]}
    assert parse_manifest(doc) == parse_manifest(minimal())
    assert "status" not in parse_manifest(doc).to_dict()


def test_every_problem_is_reported_with_its_path() -> None:
    doc = yaml.safe_load(
        """
        apiVersion: v1
        kind: ModelDeployment
        metadata: {name: Fraud_Detection, labels: {site: 1}}
        spec:
          model: {name: fraud, version: 2.40}
          runtime:
            maxBatchSize: "8"
            precision: fp64
            executionProviders: [CUDAExecutionProvider, CUDAExecutionProvider, Cuda]
            maxQueueDelay: 2s
          replicas: {perDevice: 100}
          resources: {cpu: abc, memory: 256m}
          placement: {tolerations: [{operator: Equal}, {key: k, operator: Exists, value: v}]}
          probes: {liveness: {periodSeconds: 0}}
          rollout: {maxUnavailable: ten, canary: {steps: [50%, 5%]}}
          scaling: {minReplicas: 5, maxReplicas: 4}
          power: {schedule: [{from: "25:00", to: "06:00", precision: fp16}]}
        """
    )
    assert set(problems_of(doc)) == {
        "apiVersion",
        "metadata.name",
        "metadata.labels.site",
        "spec.model.version",
        "spec.runtime.maxBatchSize",
        "spec.runtime.precision",
        "spec.runtime.executionProviders[1]",
        "spec.runtime.executionProviders[2]",
        "spec.runtime.maxQueueDelay",
        "spec.replicas.perDevice",
        "spec.resources.cpu",
        "spec.resources.memory",
        "spec.placement.tolerations[0].key",
        "spec.placement.tolerations[1].value",
        "spec.probes.liveness.periodSeconds",
        "spec.rollout.maxUnavailable",
        "spec.rollout.canary.steps",
        "spec.scaling.minReplicas",
        "spec.power.schedule[0].from",
    }


@pytest.mark.parametrize(
    ("spec", "path", "message"),
    [
        ({"runtime": {"maxBatchSize": "8"}}, "spec.runtime.maxBatchSize", 'integer, got "8"'),
        ({"runtime": {"maxBatchSize": True}}, "spec.runtime.maxBatchSize", "integer, got true"),
        ({"runtime": {"maxBatchSize": 0}}, "spec.runtime.maxBatchSize", "from 1 to 1024, got 0"),
        ({"runtime": {"maxBatchSize": 2000}}, "spec.runtime.maxBatchSize", "from 1 to 1024"),
        ({"runtime": {"maxQueueDelay": "2s"}}, "spec.runtime.maxQueueDelay", "at most 1s"),
        ({"runtime": {"precision": "fp64"}}, "spec.runtime.precision", "fp32, fp16, int8"),
        ({"runtime": {"executionProviders": []}}, "spec.runtime.executionProviders", "at least"),
        (
            {"runtime": {"executionProviders": "CPUExecutionProvider"}},
            "spec.runtime.executionProviders",
            "must be a list",
        ),
        ({"runtime": {"intraOpThreads": 0}}, "spec.runtime.intraOpThreads", "from 1 to 256"),
        ({"replicas": {"perDevice": 1, "total": 5}}, "spec.replicas", "exactly one"),
        ({"replicas": {}}, "spec.replicas", "set one of perDevice and total"),
        ({"replicas": {"total": -1}}, "spec.replicas.total", "from 0 to 100000"),
        ({"resources": {"cpu": "1.0005"}}, "spec.resources.cpu", "millicores"),
        ({"resources": "big"}, "spec.resources", 'must be a mapping, got "big"'),
        (
            {"placement": {"nodeSelector": {"a/b/c": "x"}}},
            'spec.placement.nodeSelector["a/b/c"]',
            "invalid key",
        ),
        (
            {"placement": {"nodeSelector": {"site": 1}}},
            "spec.placement.nodeSelector.site",
            "quotes",
        ),
        (
            {"placement": {"regions": ["eu", "eu"]}},
            "spec.placement.regions[1]",
            "duplicates spec.placement.regions[0]",
        ),
        (
            {"placement": {"topologySpread": {"minPerDomain": 2}}},
            "spec.placement.topologySpread.key",
            "required",
        ),
        (
            {"placement": {"tolerations": [{"key": "k", "operator": "In"}]}},
            "spec.placement.tolerations[0].operator",
            "Exists, Equal",
        ),
        (
            {"probes": {"startup": {"timeoutSeconds": -1}}},
            "spec.probes.startup.timeoutSeconds",
            "more than 0",
        ),
        (
            {"probes": {"startup": {"timeoutSeconds": float("inf")}}},
            "spec.probes.startup.timeoutSeconds",
            "finite",
        ),
        (
            {"probes": {"readiness": {"failureThreshold": 0}}},
            "spec.probes.readiness.failureThreshold",
            "from 1",
        ),
        ({"rollout": {"maxUnavailable": "ten"}}, "spec.rollout.maxUnavailable", 'got "ten"'),
        ({"rollout": {"maxSurge": "150%"}}, "spec.rollout.maxSurge", "0% to 100%"),
        (
            {"rollout": {"maxUnavailable": 0, "maxSurge": "0%"}},
            "spec.rollout.maxUnavailable",
            "not be 0",
        ),
        ({"rollout": {"canary": {}}}, "spec.rollout.canary.steps", "required"),
        ({"rollout": {"canary": {"steps": [0]}}}, "spec.rollout.canary.steps[0]", "percentage"),
        (
            {"rollout": {"canary": {"steps": ["0%"]}}},
            "spec.rollout.canary.steps[0]",
            "more than 0%",
        ),
        (
            {"rollout": {"canary": {"steps": ["5%"], "analysis": {"minAccuracy": 1.5}}}},
            "spec.rollout.canary.analysis.minAccuracy",
            "from 0 to 1",
        ),
        (
            {"rollout": {"canary": {"steps": ["5%"], "analysis": {"window": "0s"}}}},
            "spec.rollout.canary.analysis.window",
            "more than 0s",
        ),
        (
            {"rollout": {"canary": {"steps": [{"setWeight": "5%", "pause": {}}]}}},
            "spec.rollout.canary.steps[0]",
            "exactly one of setWeight or pause",
        ),
        (
            {"rollout": {"canary": {"steps": [{"pause": {"duration": "0s"}}]}}},
            "spec.rollout.canary.steps[0].pause.duration",
            "more than 0s",
        ),
        (
            {"rollout": {"canary": {"steps": [{"pause": {"duraton": "1s"}}]}}},
            "spec.rollout.canary.steps[0].pause.duraton",
            "did you mean",
        ),
        (
            {"rollout": {"canary": {"steps": ["5%"], "analysis": {"minRequests": 0}}}},
            "spec.rollout.canary.analysis.minRequests",
            "from 1",
        ),
        ({"rollout": {"progressDeadlineSeconds": 0}}, "spec.rollout.progressDeadlineSeconds", "1"),
        ({"scaling": {"minReplicas": 1}}, "spec.scaling.maxReplicas", "required"),
        (
            {"scaling": {"maxReplicas": 3, "cpuDownBelow": "40"}},
            "spec.scaling.cpuDownBelow",
            "percentage",
        ),
        (
            {"power": {"schedule": [{"from": 750, "to": "13:00", "precision": "fp16"}]}},
            "spec.power.schedule[0].from",
            "quotes",
        ),
        (
            {"power": {"schedule": [{"from": "01:00", "to": "01:00", "precision": "fp16"}]}},
            "spec.power.schedule[0].to",
            "differ",
        ),
        (
            {"power": {"schedule": [{"from": "01:00", "to": "02:00"}]}},
            "spec.power.schedule[0].precision",
            "required",
        ),
        ({"model": {"name": "mnist"}}, "spec.model.version", "required field is missing"),
        ({"model": {"name": "mnist", "version": 2}}, "spec.model.version", 'quotes (version: "2")'),
        (
            {"model": {"name": "mnist", "version": "1", "sha256": "abc"}},
            "spec.model.sha256",
            "64 hexadecimal",
        ),
        ({"model": {"name": "m" * 64, "version": "1"}}, "spec.model.name", "at most 63"),
        ({"model": None}, "spec.model", "required field is missing"),
    ],
)
def test_one_bad_field(spec: dict[str, Any], path: str, message: str) -> None:
    found = problems_of(minimal(**spec))
    assert path in found, found
    assert message in found[path]


def test_version_given_as_float_is_rejected_with_a_hint() -> None:
    doc = yaml.safe_load(
        "apiVersion: edgefleet.io/v1\nkind: ModelDeployment\nmetadata: {name: m}\n"
        "spec: {model: {name: m, version: 2.40}}\n"
    )
    assert problems_of(doc) == {
        "spec.model.version": (
            'must be a string, got the number 2.4: write it in quotes (version: "2.4"); '
            "YAML reads unquoted numbers as numbers, so 2.40 would become 2.4"
        )
    }


def test_replicas_with_both_per_device_and_total() -> None:
    assert problems_of(minimal(replicas={"perDevice": 1, "total": 5})) == {
        "spec.replicas": "set exactly one of perDevice and total, not both"
    }


@pytest.mark.parametrize(
    ("where", "path", "suggestion"),
    [
        ("top", "spc", "spec"),
        ("metadata", "metadata.lables", "labels"),
        ("spec", "spec.runtim", "runtime"),
        ("runtime", "spec.runtime.maxBatchSise", "maxBatchSize"),
        ("toleration", "spec.placement.tolerations[0].efect", "effect"),
        ("probe", "spec.probes.startup.timeoutSecond", "timeoutSeconds"),
        ("analysis", "spec.rollout.canary.analysis.windw", "window"),
        ("window", "spec.power.schedule[0].form", "from"),
    ],
)
def test_unknown_field_at_any_depth(where: str, path: str, suggestion: str) -> None:
    doc = minimal(
        runtime={},
        placement={"tolerations": [{"operator": "Exists"}]},
        probes={"startup": {}},
        rollout={"canary": {"steps": ["5%"], "analysis": {}}},
        power={"schedule": [{"from": "01:00", "to": "02:00", "precision": "fp16"}]},
    )
    target = {
        "top": doc,
        "metadata": doc["metadata"],
        "spec": doc["spec"],
        "runtime": doc["spec"]["runtime"],
        "toleration": doc["spec"]["placement"]["tolerations"][0],
        "probe": doc["spec"]["probes"]["startup"],
        "analysis": doc["spec"]["rollout"]["canary"]["analysis"],
        "window": doc["spec"]["power"]["schedule"][0],
    }[where]
    target[path.rsplit(".", 1)[-1]] = 1
    problems = problems_of(doc)
    assert problems == {path: f'unknown field (did you mean "{suggestion}"?)'}


def test_unknown_field_far_from_any_name_has_no_suggestion() -> None:
    assert problems_of(minimal(zzz=1)) == {"spec.zzz": "unknown field"}


def test_unknown_kind_lists_supported_kinds() -> None:
    doc = minimal()
    doc["kind"] = "Deployment"
    found = problems_of(doc)
    assert list(found) == ["kind"]
    assert (
        found["kind"]
        == f'must be a supported kind ({", ".join(SUPPORTED_KINDS)}), got "Deployment"'
    )


@pytest.mark.parametrize("doc", [[], "text", None, 3])
def test_document_must_be_a_mapping(doc: object) -> None:
    assert list(problems_of(doc)) == [""]


def test_missing_everything() -> None:
    assert set(problems_of({})) == {"apiVersion", "kind", "metadata"}
    assert set(problems_of({"apiVersion": API_VERSION, "kind": "ModelDeployment"})) == {
        "metadata",
        "spec",
    }


def test_labels_and_annotations() -> None:
    doc = minimal()
    doc["metadata"]["labels"] = {"app.kubernetes.io/name": "mnist", "tier": "", "z": "1"}
    doc["metadata"]["annotations"] = {"edgefleet.io/note": "anything: at all!"}
    m = parse_manifest(doc)
    assert list(m.metadata.labels) == ["app.kubernetes.io/name", "tier", "z"]
    assert m.metadata.annotations == {"edgefleet.io/note": "anything: at all!"}


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("app", True),
        ("example.com/app", True),
        ("a_b.c-d", True),
        ("-app", False),
        ("/app", False),
        ("Example.com/app", False),
        ("a" * 64, False),
        ("", False),
    ],
)
def test_label_key_syntax(key: str, ok: bool) -> None:
    doc = minimal()
    doc["metadata"]["labels"] = {key: "v"}
    if ok:
        assert parse_manifest(doc).metadata.labels == {key: "v"}
    else:
        assert "invalid key" in next(iter(problems_of(doc).values()))


def test_total_replicas_count_on_device() -> None:
    m = parse_manifest(minimal(replicas={"total": 5}))
    assert m.spec.replicas == Replicas(per_device=None, total=5)
    assert m.spec.replicas.count_on_device() == 5


def test_sha256_is_kept_lowercase() -> None:
    digest = "AB" * 32
    m = parse_manifest(
        minimal(model={"name": "m", "version": "1", "sha256": digest, "path": "m.onnx"})
    )
    assert m.spec.model.sha256 == digest.lower()
    assert m.spec.model.path == "m.onnx"


def _buildable(doc: dict[str, Any]) -> dict[str, Any]:
    return doc


ROUND_TRIP_CASES = [
    _buildable(yaml.safe_load(DESIGN_EXAMPLE)),
    minimal(),
    minimal(
        runtime={"maxQueueDelay": "2500us", "intraOpThreads": 2},
        replicas={"total": 7},
        resources={"cpu": 1.5, "memory": "129e6"},
        placement={"tolerations": [{"key": "k", "value": "v", "effect": "NoSchedule"}]},
        probes={"readiness": {"timeoutSeconds": 0.25, "periodSeconds": 2, "failureThreshold": 9}},
        rollout={"maxUnavailable": 2, "maxSurge": "0", "canary": {"steps": ["10%"]}},
        priority=-5,
    ),
    minimal(
        scaling={"maxReplicas": 3, "minReplicas": 2, "scaleUpWindow": "2s"},
        priority=1000,
    ),
    minimal(
        replicas={"total": 5},
        resources={"accelerator": {"anyOf": ["gpu", "npu"]}},
        placement={
            "matchExpressions": [
                {"key": "site", "operator": "In", "values": ["a", "b"]},
                {"key": "battery", "operator": "DoesNotExist"},
            ],
            "zones": ["z1"],
            "topologySpread": {"key": "zone", "minPerDomain": 2, "maxSkew": 1},
            "deploymentAffinity": ["camera"],
            "deploymentAntiAffinity": ["noisy"],
            "strategy": "BinPack",
        },
        priorityClassName="critical",
    ),
    minimal(replicas={"total": 1}, resources={"accelerator": {"anyOf": ["npu"]}}, priority=-5),
]


@pytest.mark.parametrize("doc", ROUND_TRIP_CASES)
def test_to_dict_round_trips(doc: dict[str, Any]) -> None:
    m = parse_manifest(doc)
    canonical = m.to_dict()
    assert parse_manifest(canonical) == m
    assert parse_manifest(canonical).to_dict() == canonical
    # JSON and YAML both carry it unchanged
    assert parse_manifest(json.loads(json.dumps(canonical))) == m
    assert parse_manifest(yaml.safe_load(yaml.safe_dump(canonical))) == m


def test_scheduling_fields() -> None:
    m = parse_manifest(ROUND_TRIP_CASES[-2])
    assert isinstance(m, ModelDeployment)
    assert m.spec.resources.accelerators == ("gpu", "npu")
    assert m.spec.resources.accelerator == "gpu"  # a device not told otherwise takes the first
    assert m.spec.effective_priority == 1_000_000
    one = parse_manifest(ROUND_TRIP_CASES[-1])
    assert isinstance(one, ModelDeployment)
    assert one.spec.resources.to_dict() == {"accelerator": "npu"}
    assert one.spec.effective_priority == -5
    assert parse_manifest(minimal()).spec.effective_priority == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("spec", "path", "message"),
    [
        (
            {"placement": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            "spec.placement.matchExpressions[0].values",
            "at least one value for In",
        ),
        (
            {
                "placement": {
                    "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
                }
            },
            "spec.placement.matchExpressions[0].values",
            "must be empty when operator is Exists",
        ),
        (
            {"placement": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}},
            "spec.placement.matchExpressions[0].operator",
            "In, NotIn, Exists, DoesNotExist",
        ),
        ({"placement": {"strategy": "Random"}}, "spec.placement.strategy", "Spread, BinPack"),
        (
            {"placement": {"topologySpread": {"key": "zone", "maxSkew": 0}}},
            "spec.placement.topologySpread.maxSkew",
            "at least 1",
        ),
        (
            {"resources": {"accelerator": {"anyOf": []}}},
            "spec.resources.accelerator.anyOf",
            "at least one",
        ),
        (
            {"resources": {"accelerator": {"oneOf": ["gpu"]}}},
            "spec.resources.accelerator.oneOf",
            "unknown field",
        ),
        ({"priorityClassName": "Urgent!"}, "spec.priorityClassName", "must be a DNS label"),
        ({"priority": 10, "priorityClassName": "high"}, "spec", "at most one of priority"),
        (
            {"replicas": {"perDevice": 1}, "placement": {"deploymentAffinity": ["x"]}},
            "spec.placement.deploymentAffinity",
            "applies to replicas.total only",
        ),
    ],
)
def test_scheduling_field_problems(spec: dict[str, Any], path: str, message: str) -> None:
    found = problems_of(minimal(**spec))
    assert path in found, found
    assert message in found[path]


def test_to_dict_is_canonical_and_deterministic() -> None:
    a = minimal(resources={"cpu": "0.5", "memory": "268435456"}, runtime={"maxQueueDelay": "500ms"})
    a["metadata"]["labels"] = {"b": "2", "a": "1"}
    b = minimal(resources={"memory": "256Mi", "cpu": "500m"}, runtime={"maxQueueDelay": 0.5})
    b["metadata"]["labels"] = {"a": "1", "b": "2"}
    da, db = parse_manifest(a).to_dict(), parse_manifest(b).to_dict()
    assert json.dumps(da) == json.dumps(db)
    assert da["spec"]["resources"] == {"cpu": "500m", "memory": "256Mi"}
    assert da["spec"]["runtime"]["maxQueueDelay"] == "500ms"
    assert list(da["metadata"]["labels"]) == ["a", "b"]


def test_hand_built_objects_render_sorted_labels() -> None:
    m = ModelDeployment(
        metadata=ObjectMeta(name="x", labels={"z": "1", "a": "2"}),
        spec=ModelDeploymentSpec(model=ModelRef(name="x", version="1")),
    )
    assert list(m.to_dict()["metadata"]["labels"]) == ["a", "z"]
    assert parse_manifest(m.to_dict()) == m


def test_canary_steps_with_pauses_round_trip() -> None:
    doc = minimal(
        rollout={
            "progressDeadlineSeconds": 300,
            "canary": {
                "steps": [
                    "10%",
                    {"pause": {"duration": "30s"}},
                    {"setWeight": "50%"},
                    {"pause": {}},
                    "100%",
                ],
                "analysis": {"maxLatencyP95": "250ms", "minRequests": 5, "window": "20s"},
            },
        }
    )
    dep = parse_manifest(doc)
    assert isinstance(dep, ModelDeployment)
    rollout = dep.spec.rollout
    assert rollout.progress_deadline_s == 300
    assert rollout.canary is not None
    assert rollout.canary.weights == (10, 50, 100)
    assert [s.pause_s for s in rollout.canary.steps if s.pause] == [30.0, None]
    assert rollout.canary.analysis is not None
    assert rollout.canary.analysis.max_latency_p95_s == 0.25
    assert rollout.canary.analysis.min_requests == 5
    again = parse_manifest(dep.to_dict())
    assert again == dep
    assert dep.to_dict()["spec"]["rollout"]["canary"]["steps"] == [
        "10%",
        {"pause": {"duration": "30s"}},
        "50%",
        {"pause": {}},
        "100%",
    ]


def _priority_class(name: str = "safety", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_a_priority_class_is_read_canonically() -> None:
    pc = parse_manifest(_priority_class(value=5000, description="collision avoidance"))
    assert pc.to_dict()["spec"] == {
        "value": 5000,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": "collision avoidance",
    }
    never = parse_manifest(_priority_class(value=-5, preemptionPolicy="Never"))
    assert never.to_dict()["spec"] == {"value": -5, "preemptionPolicy": "Never"}
    # a deployment may name any class: the hub checks that it exists
    dep = parse_manifest(minimal(priorityClassName="safety"))
    assert isinstance(dep, ModelDeployment) and dep.spec.priority_class_name == "safety"


@pytest.mark.parametrize(
    ("doc", "path", "message"),
    [
        (_priority_class(), "spec.value", "required field is missing"),
        (_priority_class(value=True), "spec.value", "must be an integer"),
        (_priority_class(value=2_000_000_000), "spec.value", "must be from"),
        (_priority_class(value=1, preemptionPolicy="Sometimes"), "spec.preemptionPolicy",
         "must be one of PreemptLowerPriority, Never"),
        (_priority_class(value=1, description="x" * 1025), "spec.description",
         "at most 1024 characters"),
        (_priority_class("critical", value=1), "metadata.name", "'critical' is a built-in class"),
        (_priority_class(value=1, globalDefault=True), "spec.globalDefault", "unknown field"),
    ],
)  # fmt: skip
def test_priority_class_problems(doc: dict[str, Any], path: str, message: str) -> None:
    found = problems_of(doc)
    assert path in found, found
    assert message in found[path]
