"""``kind: ModelConfig`` through the real ``edgectl`` against a real hub (tests/edgectl/
conftest.py: cam-1 at site=retail with reported accelerator=npu, cam-2 at site=depot): apply,
get, describe with ``--device`` showing the merged result and where each value came from, a
credential-like key refused by name, two configs for one model refused, and the apply saying
what a change does (every device at once, no canary)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from edgectltesting import edgectl, seed

CONFIG = """\
apiVersion: edgefleet.io/v1
kind: ModelConfig
metadata: {name: fraud}
spec:
  model: fraud
  data: {threshold: 0.5, zones: {door: [0, 0, 10, 10]}}
  files: {labels.txt: "ok\\nfraud\\n"}
  overrides:
    - selector: {site: retail}
      data: {threshold: 0.6}
    - selector: {site: retail, accelerator: npu}
      data: {zones: {till: [1, 1, 2, 2]}}
    - devices: [cam-2]
      data: {threshold: 0.9}
"""


def test_apply_get_describe_for_a_device(config: Path) -> None:
    applied = edgectl(config, "apply", "-f", "-", stdin=CONFIG)
    assert applied.returncode == 0, applied.stderr
    assert "modelconfig/fraud created" in applied.stdout
    assert "new revision" in applied.stderr  # what a change does
    rows = edgectl(config, "get", "modelconfigs").stdout.splitlines()
    assert rows[0].split() == ["NAME", "MODEL", "KEYS", "FILES", "OVERRIDES", "AGE"]
    assert rows[1].split()[:5] == ["fraud", "fraud", "2", "1", "3"]
    got = edgectl(config, "get", "mc/fraud", "-o", "json")
    assert json.loads(got.stdout)["spec"]["overrides"][2] == {
        "devices": ["cam-2"],
        "data": {"threshold": 0.9},
    }

    one = edgectl(config, "describe", "modelconfig", "fraud", "--device", "cam-1")
    assert one.returncode == 0, one.stderr
    lines = one.stdout.splitlines()
    value = {ln.split()[0]: ln for ln in lines if ln.startswith("  data.") or "files[" in ln}
    assert "= 0.6" in value["data.threshold"]
    assert "spec.overrides[0] (selector site=retail)" in value["data.threshold"]
    assert "spec.overrides[1] (selector accelerator=npu,site=retail)" in value["data.zones.till"]
    assert "spec (defaults)" in value["data.zones.door"]
    assert "spec (defaults)" in value['files["labels.txt"]']
    assert any(ln.startswith("Digest:") and "sha256:" in ln for ln in lines)

    two = edgectl(config, "describe", "mc/fraud", "--device", "cam-2")
    assert "= 0.9" in two.stdout and "spec.overrides[2] (device cam-2)" in two.stdout
    missing = edgectl(config, "describe", "mc/fraud", "--device", "nope")
    assert missing.returncode != 0 and "nope" in missing.stderr
    wrong = edgectl(config, "describe", "device", "cam-1", "--device", "cam-1")
    assert wrong.returncode != 0 and "modelconfig" in wrong.stderr


def test_refusals_change_nothing(config: Path) -> None:
    secret = CONFIG.replace("{name: fraud}", "{name: leaky}").replace(
        "threshold: 0.5,", "threshold: 0.5, apiKey: abc,"
    )
    refused = edgectl(config, "apply", "-f", "-", stdin=secret.replace("model: fraud", "model: x"))
    assert refused.returncode != 0
    assert "spec.data.apiKey" in refused.stderr and "credential" in refused.stderr
    assert edgectl(config, "get", "mc/leaky").returncode != 0

    edgectl(config, "apply", "-f", "-", stdin=CONFIG)
    second = edgectl(config, "apply", "-f", "-", stdin=CONFIG.replace("{name: fraud}", "{name: b}"))
    assert second.returncode != 0
    assert "documents[0].spec.model" in second.stderr and "one config per model" in second.stderr
    assert edgectl(config, "get", "mc/b").returncode != 0

    # a malformed processing section (the worker's stage), in an override: refused with where
    bad = CONFIG.replace("{name: fraud}", "{name: proc}").replace("model: fraud", "model: proc")
    bad = bad.replace(
        "data: {threshold: 0.9}",
        'data: {"edgefleet.io/processing": {outputs: {logits: {threshold: high}}}}',
    )
    refused = edgectl(config, "apply", "-f", "-", stdin=bad)
    assert refused.returncode != 0
    assert (
        "documents[0].spec: spec.overrides[2] over the defaults: "
        "data['edgefleet.io/processing'].outputs['logits'].threshold: must be a finite number"
    ) in refused.stderr, refused.stderr
    assert edgectl(config, "get", "mc/proc").returncode != 0


SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["threshold"],
    "properties": {
        "threshold": {"type": "number", "minimum": 0, "maximum": 1},
        "zones": {"type": "object"},
    },
}

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: scored}
spec:
  model: {name: scored, version: "VERSION"}
  replicas: {perDevice: 1}
  placement: {nodeSelector: {site: nowhere}}
"""

SCORED = """\
apiVersion: edgefleet.io/v1
kind: ModelConfig
metadata: {name: scored}
spec:
  model: scored
  data: {threshold: 0.5}
  overrides:
    - selector: {site: retail}
      data: {threshold: THRESHOLD}
"""


def _push(config: Path, tmp_path: Path, version: str, schema: object) -> str:
    from edgefleet.demo import build_mlp

    folder = tmp_path / version
    folder.mkdir()
    model = build_mlp(folder / "scored.onnx", seed=int(version[0]))
    extra = folder / "config.schema.json"
    extra.write_text(json.dumps(schema))
    out = edgectl(
        config, "models", "push", str(model), "--name", "scored", "--version", version,
        "--extra", str(extra),
    )  # fmt: skip
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def trusted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A hub of its own with the quickstart trust root and publisher key (models push)."""
    import asyncio

    from hubserving import ThreadedHub

    from hub.initializing import init_hub
    from hub.trustsetup import quickstart_trust

    d = tmp_path_factory.mktemp("schemas") / "hub"
    result = asyncio.run(
        init_hub(d, region="eu-dublin", hub_address="127.0.0.1:7443", trust_setup=quickstart_trust)
    )
    with ThreadedHub(result.paths) as threaded:
        assert threaded.hub is not None
        threaded.run(seed(threaded.hub))
        yield result.paths.admin_config


def test_the_publishers_schema_checks_every_override_at_apply(
    trusted: Path, tmp_path: Path
) -> None:
    config = trusted
    assert "pushed" in _push(config, tmp_path, "1.0.0", SCHEMA)
    bad = _push(config, tmp_path, "9.0.0", {"type": "object", "properties": {"a": {"$ref": "#"}}})
    assert "keyword '$ref' is not supported" in bad and "pushed" not in bad

    dep = DEPLOYMENT.replace("VERSION", "1.0.0")
    refused = edgectl(
        config, "apply", "-f", "-", stdin=dep + "---\n" + SCORED.replace("THRESHOLD", "1.5")
    )
    assert refused.returncode != 0
    assert (
        "documents[1].spec.overrides[0].data.threshold: must be at most 1, got 1.5 "
        "(spec.overrides[0] over the defaults) (the config schema of model scored 1.0.0"
    ) in refused.stderr, refused.stderr
    assert edgectl(config, "get", "mc/scored").returncode != 0  # nothing applied
    assert edgectl(config, "get", "deployment/scored").returncode != 0

    good = edgectl(
        config, "apply", "-f", "-", stdin=dep + "---\n" + SCORED.replace("THRESHOLD", "0.7")
    )
    assert good.returncode == 0, good.stderr

    # a new version whose schema the stored config breaks: the deployment's apply is refused
    stricter = {**SCHEMA, "properties": {**SCHEMA["properties"], "threshold": {"maximum": 0.6}}}
    assert "pushed" in _push(config, tmp_path, "2.0.0", stricter)
    moved = edgectl(config, "apply", "-f", "-", stdin=DEPLOYMENT.replace("VERSION", "2.0.0"))
    assert moved.returncode != 0
    assert "documents[0].spec.model.version: 2.0.0 carries the config schema" in moved.stderr
    assert "spec.overrides[0].data.threshold: must be at most 0.6, got 0.7" in moved.stderr
    shown = edgectl(config, "get", "deployment/scored", "-o", "jsonpath={.spec.model.version}")
    assert shown.stdout.strip() == "1.0.0"
