"""The Grafana dashboard in packaging/ asks only for metrics that exist: the hub's (from its
registry) and edged's (the table in docs/edged.md, itself checked against a running
edged in tests/e2e/test_serving.py for the names it asserts)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hub.api.observability import HubMetrics

ROOT = Path(__file__).resolve().parents[2]


def test_every_metric_of_the_dashboard_exists() -> None:
    dashboard = json.loads((ROOT / "packaging" / "grafana" / "edgefleet.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    asked = {
        re.sub(r"_(bucket|sum|count)$", "", name)
        for e in exprs
        for name in re.findall(r"(?<![$\w])(?:hub|edged)_[a-z_]+", e)
    }
    hub = set(re.findall(r"^# TYPE (\S+) ", HubMetrics().render(), re.M))
    docs = (ROOT / "docs" / "edged.md").read_text()
    edged = set(re.findall(r"^\s*\| `(edged_[a-z_]+)` \|", docs, re.M))
    assert {"edged_replica_restarts_total", "edged_inference_requests_total"} <= edged
    assert asked - hub - edged == set()
    assert {n for n in asked if n.startswith("hub_")} == hub  # every hub metric is shown
