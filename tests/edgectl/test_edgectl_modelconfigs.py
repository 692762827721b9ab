"""``kind: ModelConfig`` through the real ``edgectl`` against a real hub (tests/edgectl/
conftest.py: cam-1 at site=retail with reported accelerator=npu, cam-2 at site=depot): apply,
get, describe with ``--device`` showing the merged result and where each value came from, a
credential-like key refused by name, two configs for one model refused, and the apply saying
what the config does (not delivered yet)."""

from __future__ import annotations

import json
from pathlib import Path

from edgectltesting import edgectl

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
    assert "not delivered" in applied.stderr  # never accepted and silently ignored
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
