"""The dashboard's pure parts: counts and groups of the fleet, the devices page's query and
bounds, the generic rendering of rollout status (plots with thresholds), escaping, and the
URL edgectl dashboard prints."""

from __future__ import annotations

import re

import pytest

from edgectl.dashboards import dashboard_url
from hub.api.dashboard import pages, rolloutpages, views
from hub.api.dashboard.access import AccessRefused, DashboardAccess
from hub.decide.devices import Attestation, Device, DevicePhase, Health, TrustState
from hub.decide.placement import SecurityPolicy
from hub.state.storekeys import DesiredRecord


def _device(name: str, **kw: object) -> Device:
    return Device(name=name, **kw)  # type: ignore[arg-type]


def test_fleet_summary_counts_and_groups() -> None:
    devices = [
        _device("a", labels={"site": "s1"}, phase=DevicePhase.READY),
        _device(
            "b",
            labels={"site": "s1"},
            phase=DevicePhase.NOT_READY,
            health=Health(False, ("disk full",)),
        ),
        _device(
            "c",
            labels={"site": "s2", "region": "r2"},
            attestation=Attestation(TrustState.TRUSTED),
            generation_acked=1,
        ),
        _device("d", attestation=Attestation(TrustState.UNTRUSTED), cordoned=True),
    ]
    desired = {"a": DesiredRecord(2, (), "x"), "c": DesiredRecord(1, (), "y")}
    s = views.fleet_summary(devices, desired, SecurityPolicy(require_attestation=True), "r1")
    c = s.counts
    assert (c.total, c.ready, c.not_ready, c.pending) == (4, 1, 1, 2)
    assert (c.unhealthy, c.trusted, c.untrusted, c.noncompliant) == (1, 1, 1, 3)
    assert (c.cordoned, c.out_of_sync) == (1, 1)
    groups = {(r, site): g.total for r, site, g in s.groups}
    assert groups == {("r1", "s1"): 2, ("r2", "s2"): 1, ("r1", views.NO_SITE): 1}
    assert s.groups[0][:2] == ("r1", "s1")  # the largest first
    small = views.fleet_summary(devices, desired, SecurityPolicy(), "r1", max_groups=1)
    assert len(small.groups) == 1 and small.more_groups == 2
    assert small.counts.noncompliant == 0


def test_device_query_bounds() -> None:
    q = views.parse_device_query({"page": "2", "per": "10", "phase": "Ready", "q": " x "})
    assert (q.page, q.per_page, q.phase, q.text) == (2, 10, "Ready", "x")
    assert q.params(page=3) == {"q": "x", "phase": "Ready", "page": "3", "per": "10"}
    for bad, field in (
        ({"page": "0"}, "page"),
        ({"page": "1e3"}, "page"),
        ({"page": "9999999999"}, "page"),
        ({"per": "1000"}, "per"),
        ({"health": "meh"}, "health"),
        ({"attestation": "Maybe"}, "attestation"),
        ({"selector": "=="}, "selector"),
    ):
        with pytest.raises(views.BadQuery, match=f"^{field}:"):
            views.parse_device_query(bad)


def test_device_page_slices_by_name() -> None:
    devices = [_device(f"d{i:02d}", phase=DevicePhase.READY) for i in range(25)][::-1]
    page = views.device_page(devices, views.DeviceQuery(page=3, per_page=10))
    assert [d.name for d in page.rows] == [f"d{i}" for i in range(20, 25)]
    assert (page.matched, page.pages) == (25, 3)
    empty = views.device_page([], views.DeviceQuery())
    assert (empty.rows, empty.pages) == ([], 1)


def test_rollout_analysis_is_shown_generically_with_plots_and_thresholds() -> None:
    status = {
        "desiredDevices": 10,
        "updatedDevices": 3,
        "rollout": {
            "phase": "RolledBack",
            "revision": 2,
            "steps": 4,
            "startedAt": 1700000000.0,
            "analysis": {
                "checks": [
                    {"name": "errorRate", "passed": False, "message": "<b>0.2</b> > 0.05"},
                ],
                "errorRate": {
                    "canary": [0.01, 0.05, 0.2],
                    "stable": [0.01, 0.01, 0.02],
                    "threshold": 0.05,
                },
                "latencyP95": [[1.0, 12.5], [2.0, 13.0]],
            },
        },
    }
    revisions = [{"number": 2, "model": "m 2.0", "role": "current", "devices": 7, "ready": 6}]
    html = rolloutpages.deployment_fragment(status, revisions)
    assert "<td>current</td><td class=num>7</td><td class=num>6</td>" in html
    assert html.count("<svg") == 2
    assert "class=threshold" in html and "threshold 0.05" in html
    assert "canary 0.2" in html and "stable 0.02" in html
    assert "&lt;b&gt;0.2&lt;/b&gt;" in html and "<b>0.2" not in html
    assert "errorRate" in html and ">no<" in html  # passed: False
    assert "data-pct=30" in html  # updated 3 of 10


def test_a_rolled_back_deployment_lists_the_devices_it_was_rolled_back_for() -> None:
    """After a rollback ``status.failing`` (failing now) is empty; the devices the rollout was
    given up for are listed all the same, as ``edgectl describe`` lists them (issue 29, 5)."""
    status = {
        "failing": {},
        "rollout": {
            "phase": "RolledBack",
            "revision": 3,
            "failedDevices": {"dev-0": "2.0.0 Failed: ModelLoadFailed"},
        },
    }
    html = rolloutpages.deployment_fragment(status, [])
    assert "dev-0" in html
    assert "2.0.0 Failed: ModelLoadFailed (revision 3, rolled back)" in html
    status["rollout"]["phase"] = "Complete"  # type: ignore[index]
    assert "ModelLoadFailed" not in rolloutpages.deployment_fragment(status, []).split("Failing")[1]


def test_values_are_escaped_and_bounded() -> None:
    hostile = {
        "<k>": ['"><script>x</script>'],
        "deep": {"a": {"b": {"c": {"d": {"e": {"f": {}}}}}}},
    }
    html = pages.value_html(hostile)
    assert "<script>" not in html and "&lt;k&gt;" in html and "&quot;&gt;" in html
    assert "…" in html
    assert pages.esc("x" * 5000).endswith("…") and len(pages.esc("x" * 5000)) < 2100
    assert pages.value_html([float("nan"), 1]) == "nan, 1"  # not a plot: NaN is no number


def test_tokens() -> None:
    access = DashboardAccess()
    token, expires = access.issue("alice", "abc", now=1000.0, ttl=60)
    assert re.fullmatch(r"v1\.[\w-]+\.[\w-]+", token) and expires == 1060.0
    viewer = access.verify(token, now=1059.0, revoked={})
    assert (viewer.name, viewer.serial, viewer.via) == ("alice", "abc", "token")
    with pytest.raises(AccessRefused, match="expired"):
        access.verify(token, now=1060.0, revoked={})
    with pytest.raises(AccessRefused, match="revoked"):
        access.verify(token, now=1001.0, revoked={"abc": "alice"})
    with pytest.raises(AccessRefused, match="not issued by this hub"):
        DashboardAccess().verify(token, now=1001.0, revoked={})
    for ttl in (1.0, 3600.0):
        with pytest.raises(ValueError, match="ttl"):
            access.issue("alice", "abc", now=0, ttl=ttl)


def test_dashboard_url() -> None:
    assert dashboard_url("hub.example:7443", 7446, "v1.a+b.c") == (
        "https://hub.example:7446/login?token=v1.a%2Bb.c"
    )
    assert dashboard_url("[::1]:7443", 9, "t").startswith("https://[::1]:9/")


def test_figures_are_recorded_over_time_with_their_thresholds() -> None:
    history = views.FigureHistory()
    for t, (updated, canary) in enumerate([(1, 0.01), (2, 0.03), (2, 0.09)]):
        status = {
            "desiredDevices": 10,
            "updatedDevices": updated,
            "rollout": {
                "revision": 2,
                "startedAt": 1.0,
                "analysis": {
                    "errorRate": {"canary": canary, "stable": 0.01, "threshold": 0.05},
                    "latencyP95Ms": {"value": 12.0 + t, "max": 20},
                    "passed": canary < 0.05,
                    "note": "<b>x</b>",
                },
            },
        }
        history.record("fraud", status, now=float(t))
    series, thresholds = history.of("fraud")
    assert series["updatedDevices"] == [1, 2, 2]
    assert series["rollout.analysis.errorRate.canary"] == [0.01, 0.03, 0.09]
    assert series["rollout.analysis.errorRate.stable"] == [0.01] * 3
    assert "rollout.revision" not in series and "rollout.startedAt" not in series
    assert thresholds["rollout.analysis.errorRate.canary"] == 0.05
    assert thresholds["rollout.analysis.latencyP95Ms.value"] == 20
    html = rolloutpages.history_html(series, thresholds)
    assert html.count("<svg") == len(series) and html.count("class=threshold") == 3
    history.forget("fraud")
    assert history.of("fraud") == ({}, {})
    many = views.FigureHistory()
    many.record("x", {"rollout": {f"k{i}": i for i in range(100)}}, now=0)
    many.record("x", {"rollout": {f"k{i}": i + 1 for i in range(100)}}, now=1)
    assert len(many.of("x")[0]) == views.MAX_SERIES


def test_each_device_shows_its_agent_version_and_a_refusal() -> None:
    refused = "AgentVersionOutsideWindow: edged 0.9.0 is outside what hub 0.2.0 accepts"
    rows = [
        _device("cam-1", agent_version="0.2.0"),
        _device("cam-2", agent_version="0.9.0", agent_refused=refused),
        _device("cam-3"),
    ]
    page = views.DevicePage(rows, 3, 1, 1)
    html = pages.devices_body(page, views.parse_device_query({}))
    assert "<th>agent</th>" in html
    assert "<td>0.2.0</td>" in html and "<td>unknown</td>" in html
    assert f'title="{refused}">0.9.0 (refused)</span>' in html
    body = pages.device_body(rows[1], None, [])
    assert f"edged 0.9.0 refused: {refused}" in body


def test_a_deployment_page_reads_like_describe() -> None:
    """What the deployment asks for one fact a row, match expressions included, and its
    rollout in words; a hostile value stays text; the raw rollout fields only folded."""
    doc = {
        "metadata": {"name": "det", "labels": {"team": "<b>x</b>"}},
        "spec": {
            "model": {"name": "det", "version": "2.0.0"},
            "replicas": {"total": 3},
            "placement": {
                "matchExpressions": [
                    {"key": "site", "operator": "In", "values": ["a", "b"]},
                    {"key": "lab", "operator": "DoesNotExist"},
                ]
            },
            "rollout": {"canary": {"steps": [{"weight": 10}, {"pause": {}}], "analysis": {}}},
        },
        "status": {
            "desiredDevices": 3,
            "rollout": {
                "revision": 2,
                "version": "2.0.0",
                "stableRevision": 1,
                "stableVersion": "1.0.0",
                "phase": "Paused",
                "reason": "Paused",
                "canary": {"step": 2, "stepCount": 2, "weight": 10, "weightDevices": 1},
            },
        },
    }
    html = rolloutpages.deployment_fragment(doc["status"], [], doc=doc)
    for fact in (
        "<th>Replicas:</th><td>3 across the fleet</td>",
        "<th>Selector:</th><td>site in (a,b),!lab</td>",
        "canary, 2 steps, with analysis",
        "<th>Rollout:</th><td>revision 2 (2.0.0) Paused (Paused), stable revision 1 (1.0.0)",
        "<th>Canary:</th><td>step 2 of 2: weight 10% (1 devices)",
        "team=&lt;b&gt;x&lt;/b&gt;",
    ):
        assert fact in html, fact
    assert "<b>x</b>" not in html and "<th>Created:</th>" not in html
    assert html.index("<details>") > html.index("id=rollout-facts")


def _placements(
    n: int, explanation: object, *, total: int | None = 3, limit: int = views.MAX_LISTED
) -> views.DeploymentPlacements:
    from edgefleet.api import ModelDeployment, parse_manifest
    from hub.decide.devices import RevisionPhase, RevisionReport, WorkloadReport
    from hub.decide.records import ModelRecord
    from hub.decide.revisions import Revision, template_hash

    replicas = {"total": total} if total is not None else {"perDevice": 1}
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {"model": {"name": "det", "version": "2.0.0"}, "replicas": replicas},
    }
    dep = parse_manifest(doc)
    assert isinstance(dep, ModelDeployment)
    manifest = dep.to_dict()
    rev = Revision("det", 2, template_hash(manifest), manifest, 0.0)
    ready = RevisionReport("2.0.0", "2" * 64, RevisionPhase.READY, 1, wanted=True)
    devices = {
        f"cam-{i:03}": _device(
            f"cam-{i:03}",
            phase=DevicePhase.READY,
            workloads={"det": WorkloadReport("2.0.0", 1, revisions=(ready,))} if i % 2 else {},
        )
        for i in range(n)
    }
    # a device that reports the deployment but is no longer sent it: leaving
    devices["old-<b>"] = _device(
        "old-<b>", workloads={"det": WorkloadReport("2.0.0", 1, revisions=(ready,))}
    )
    record = DesiredRecord(3, ("det",), "d", (("det", 2, 3),))
    records = {name: record for name in devices if "old" not in name}
    records["ghost"] = record  # a record without a device record: not shown
    return views.deployment_placements(
        "det",
        dep=dep,
        holding=records,
        devices=devices,
        records=records,
        revisions={2: rev},
        models={("det", "2.0.0"): ModelRecord("det", "2.0.0", "2" * 64, 1, b"{}", 0.0)},
        explanation=explanation,  # type: ignore[arg-type]
        limit=limit,
    )


def test_a_deployment_page_shows_its_placements_and_why_devices_were_left_out() -> None:
    """As ``edgectl describe deployment``'s Placements: each device sent it (revision,
    ready/asked, phase there and why), one leaving; the scheduler's reasons for the devices
    it left out, bounded with "and K more"; hostile names and reasons stay text."""
    from hub.decide.nodes import Explanation

    hostile = '<script>alert("x")</script>'
    reasons = tuple((f"{hostile} filter {i}", 30 - i) for i in range(views.MAX_REASONS + 3))
    notes = (f"note {hostile}",) * (views.MAX_REASONS + 1)
    explanation = Explanation(3, 2, 1000, reasons, notes)
    placed = _placements(4, explanation)
    assert (placed.total, placed.placed, placed.more) == (5, 4, 0)  # "ghost" has no device
    by_device = {p.device: p for p in placed.shown}
    assert by_device["cam-001"].phase == "Ready" and by_device["cam-000"].phase == "Pending"
    assert by_device["old-<b>"].phase == "Leaving"
    html = rolloutpages.deployment_fragment({}, [], placements=placed)
    assert "<script>" not in html and "<b>" not in html and "old-&lt;b&gt;" in html
    assert '<a href="/devices/old-%3Cb%3E">' in html
    assert "<td>2 (2.0.0)</td><td class=num>1/1</td><td class=ok>Ready</td>" in html
    assert "4 devices sent it, 1 leaving" in html
    left_out = html.split("<h2>Devices left out</h2>")[1].split("<h2>Revisions</h2>")[0]
    left = sum(n for _, n in reasons)
    assert f"2/3 replicas placed; {1000 - left}/1000 devices fit" in left_out
    assert len(re.findall(r"filter \d+</td>", left_out)) == views.MAX_REASONS
    hidden = reasons[views.MAX_REASONS :]
    assert f"and 3 more reasons ({sum(n for _, n in hidden)} devices)" in left_out
    assert left_out.count("<li>note &lt;script&gt;") == views.MAX_REASONS
    assert "and 1 more</li>" in left_out

    # bounded: the first of many, then how many more and the command that lists them all
    many = _placements(30, Explanation(3, 3, 30), limit=10)
    assert (len(many.shown), many.total, many.more) == (10, 31, 21)
    html = rolloutpages.deployment_fragment({}, [], placements=many)
    assert html.count('<tr><td><a href="/devices/') == 10
    assert "and 21 more: <code>edgectl get placements --for deployment/det</code>" in html
    assert "<p id=left-out class=ok>3/3 replicas placed</p>" in html
    assert "id=left-out-reasons" not in html

    # not scheduled yet, and a perDevice deployment (no scheduler): said, not left blank
    html = rolloutpages.deployment_fragment({}, [], placements=_placements(1, None))
    assert "the scheduler has not placed it yet" in html
    per_device = _placements(1, explanation, total=None)
    assert per_device.explanation is None  # a stale explanation of a total is not shown
    html = rolloutpages.deployment_fragment({}, [], placements=per_device)
    assert "replicas.perDevice: every device" in html and "filter" not in html
