"""A revision carries its model's ModelConfig (hub.decide.revisions.with_config): a config
change is a new template, nothing else changes templates made before; a device refusing the
revision's config makes it broken there (hub.decide.rollout.view_device); the device never
gets the annotation (hub.decide.desired)."""

from __future__ import annotations

from typing import Any

from hub.decide.desired import _rewritten
from hub.decide.devices import (
    Device,
    DevicePhase,
    RevisionPhase,
    RevisionReport,
    WorkloadReport,
)
from hub.decide.revisions import MODEL_CONFIG, config_of, template_hash, with_config
from hub.decide.rollout import TargetPhase, view_device

MANIFEST: dict[str, Any] = {
    "apiVersion": "edgefleet.io/v1",
    "kind": "ModelDeployment",
    "metadata": {"name": "det", "annotations": {"team": "x"}},
    "spec": {"model": {"name": "det", "version": "1.0.0"}, "replicas": {"perDevice": 1}},
}


def test_the_config_is_part_of_the_template_and_only_then() -> None:
    assert with_config(MANIFEST, "") is MANIFEST
    a, b = with_config(MANIFEST, '{"a":1}'), with_config(MANIFEST, '{"a":2}')
    assert template_hash(a) != template_hash(b) != template_hash(MANIFEST)
    assert template_hash(with_config(a, '{"a":1}')) == template_hash(a)
    assert config_of(a) == '{"a":1}' and config_of(MANIFEST) == ""
    assert with_config(a, "")["metadata"] == MANIFEST["metadata"]  # removed again
    assert a["metadata"]["annotations"]["team"] == "x"


def test_devices_never_get_the_annotation() -> None:
    import orjson

    encoded = orjson.dumps(with_config(MANIFEST, '{"a":1}'), option=orjson.OPT_SORT_KEYS)
    sent = orjson.loads(_rewritten(encoded, False, "", None))
    assert MODEL_CONFIG not in sent["metadata"].get("annotations", {})
    assert sent["metadata"]["annotations"] == {"team": "x"}


def _device(error: str) -> Device:
    report = WorkloadReport(
        "1.0.0",
        desired_replicas=1,
        ready_replicas=1,
        revisions=(RevisionReport("1.0.0", "", RevisionPhase.READY, 1, "r1", wanted=True),),
        config_digest="sha256:" + "0" * 64,
        config_error=error,
    )
    return Device(name="cam-1", phase=DevicePhase.READY, workloads={"det": report})


def test_a_refused_config_breaks_the_revision_on_that_device() -> None:
    ok = view_device(_device(""), "det", "1.0.0", None)
    assert ok.target is TargetPhase.READY
    bad = view_device(_device("the config does not validate"), "det", "1.0.0", None)
    assert bad.target is TargetPhase.BROKEN
    assert bad.broken_reason == "ModelConfigRefused: the config does not validate"
    # a report made before the device got the revision says nothing of its config
    stale = view_device(_device("old error"), "det", "1.0.0", None, fresh=False)
    assert stale.target is TargetPhase.PROGRESSING


def test_a_config_with_waves_or_a_variant_beside_another_deployment_is_refused() -> None:
    from hub.decide.modelconfigs import IN_WAVES, wave_conflicts

    configs = [("documents[0]", "det")]
    variant = "giving region eu a model variant"
    # alone: supported (each region gets the config of the revision it is sent, naming the
    # variant it runs)
    for why in (IN_WAVES, variant):
        assert wave_conflicts(configs, [("documents[1]", "det", why)]) == []
    # beside another deployment of the model: refused, naming both
    for why in (IN_WAVES, variant):
        beside = [("documents[1]", "det", why), ("ModelDeployment local", "det", "")]
        (found,) = wave_conflicts(configs, beside)
        assert found.startswith(f"documents[1]: a ModelDeployment {why} beside another")
        assert "(ModelDeployment local)" in found and "not supported yet" in found
        assert "(documents[0])" in found
    # another model's deployments do not count; what was stored before is not this apply's
    assert wave_conflicts(configs, [("documents[1]", "det", IN_WAVES), ("x", "other", "")]) == []
    stored = [("ModelDeployment d", "det", IN_WAVES), ("ModelDeployment e", "det", "")]
    assert wave_conflicts([("ModelConfig det", "det")], stored) == []
