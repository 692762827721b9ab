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


def test_the_dashboard_panels_are_distinct_and_do_not_overlap() -> None:
    dashboard = json.loads((ROOT / "packaging" / "grafana" / "edgefleet.json").read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, p["title"]
        cells |= mine


def test_every_metric_of_the_alerting_rules_exists() -> None:
    """packaging/prometheus/edgefleet-rules.yaml asks only for the hub's metrics (a renamed
    metric would silence an alert, not break it)."""
    rules = (ROOT / "packaging" / "prometheus" / "edgefleet-rules.yaml").read_text()
    exprs = " ".join(re.findall(r"expr: >-\n((?:\s{10}.*\n)+)", rules))
    asked = set(re.findall(r"(?<![$\w])hub_[a-z_]+", exprs))
    hub = set(re.findall(r"^# TYPE (\S+) ", HubMetrics().render(), re.M))
    assert len(asked) >= 8 and asked <= hub, asked - hub
