"""Reading a Prometheus text exposition in tests (edged's and the hub's /metrics)."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import yaml


def series_value(text: str, series: str) -> float:
    """The value of one series (``name{labels}``) in an exposition; 0 when it is absent."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# -- promtool test rules over a real exposition (packaging/prometheus/edgefleet-rules.yaml) --
RULES = Path(__file__).resolve().parents[1] / "packaging" / "prometheus" / "edgefleet-rules.yaml"
ALERTS = (
    "EdgefleetDeploymentRolledBack",
    "EdgefleetDeploymentUnavailable",
    "EdgefleetDevicesNotReady",
    "EdgefleetRegionCutOff",
)
JOB, INSTANCE = "edgefleet-hub", "hub-0:9445"


def input_series(text: str, *, minutes: int = 15) -> list[dict[str, str]]:
    """promtool's ``input_series`` from an exposition: each hub sample (with the ``job`` and
    ``instance`` labels a scrape adds) held at its value for ``minutes``, once a minute."""
    out = []
    extra = f'job="{JOB}",instance="{INSTANCE}"'
    for line in text.splitlines():
        if not line.startswith("hub_"):
            continue
        series, value = line.rsplit(" ", 1)
        if not math.isfinite(float(value)):
            continue
        labelled = series.endswith("}")
        series = f"{series[:-1]},{extra}}}" if labelled else f"{series}{{{extra}}}"
        out.append({"series": series, "values": f"{value}x{minutes}"})
    return out


def annotations(alert: str, labels: Mapping[str, str]) -> dict[str, str]:
    """An alert's annotations as Prometheus renders them for ``labels`` (the rules use only
    ``{{ $labels.NAME }}``; an absent label renders empty)."""
    rules = yaml.safe_load(RULES.read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert)

    def render(template: str) -> str:
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m[1], ""), template)

    return {k: render(v) for k, v in rule.get("annotations", {}).items()}


def promtool_test(
    tmp_path: Path,
    text: str,
    firing: Mapping[str, list[dict[str, str]]],
    *,
    at: str = "14m",
) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of the shipped rules over ``text`` (a hub's /metrics): at
    ``at``, each alert of :data:`ALERTS` fires exactly with the label sets ``firing`` gives it
    (the scrape's job and instance and the rule's severity added), the others not at all."""
    rules = yaml.safe_load(RULES.read_text())
    severity = {r["alert"]: r["labels"]["severity"] for g in rules["groups"] for r in g["rules"]}
    tests = []
    for alert in ALERTS:
        expected = []
        for labels in firing.get(alert, []):
            full = {**labels, "job": JOB, "instance": INSTANCE, "severity": severity[alert]}
            expected.append({"exp_labels": full, "exp_annotations": annotations(alert, full)})
        tests.append({"eval_time": at, "alertname": alert, "exp_alerts": expected})
    doc = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": input_series(text), "alert_rule_test": tests}],
    }
    path = tmp_path / "edgefleet-rules.test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/install-system-deps installs prometheus"
    return subprocess.run(
        [promtool, "test", "rules", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
