"""The dashboard's HTML, rendered on the hub: plain strings, every value escaped with
:func:`esc` (what devices report is hostile: a label ``<script>`` must show as text). No
inline script or style (the Content-Security-Policy forbids both); ``/static/dashboard.js``
replaces a page's ``[data-live]`` section with fragments the hub renders the same way, and
appends events with ``textContent``.

Rollout status is shown generically (:func:`value_html`): whatever the hub's status carries,
nested objects as tables, lists of numbers as plots (SVG drawn here, with a ``threshold`` of
the same object drawn as a dashed line), so an analysis added to the status shows without a
change here.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from edgefleet.timestamps import rfc3339
from hub.api.dashboard.access import Viewer
from hub.api.dashboard.views import (
    MAX_LISTED,
    Counts,
    DevicePage,
    DeviceQuery,
    FleetSummary,
    ModelVersion,
    event_json,
)
from hub.decide.analysis import TimelineSample
from hub.decide.devices import Device, DevicePhase, TrustState
from hub.state.storekeys import DesiredRecord

MAX_DEPTH = 6
MAX_ITEMS = 50
MAX_TEXT = 2000
PLOT_W, PLOT_H = 240, 60
THRESHOLD_KEYS = ("threshold", "max", "min", "limit")


def esc(value: object) -> str:
    """``value`` as HTML text: escaped, quotes too, and cut to a bounded length."""
    text = str(value)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + "…"
    return html.escape(text, quote=True)


def href(path: str, params: Mapping[str, str] | None = None) -> str:
    return esc(path + ("?" + urlencode(params) if params else ""))


def seg(name: str) -> str:
    """A name as one URL path segment."""
    return quote(name, safe="")


def when(seconds: float | None) -> str:
    return esc(rfc3339(seconds) or "—")


NAV = (
    ("/", "Fleet"),
    ("/devices", "Devices"),
    ("/deployments", "Deployments"),
    ("/events", "Events"),
    ("/models", "Models"),
    ("/agentupgrades", "Agent upgrades"),
)


def layout(title: str, body: str, viewer: Viewer | None, *, region: str, active: str = "") -> str:
    links = "".join(
        f'<a href="{p}"{" class=active" if p == active else ""}>{esc(t)}</a>' for p, t in NAV
    )
    who = ""
    if viewer is not None:
        who = f"{esc(viewer.name)} ({esc(viewer.via)}"
        if viewer.expires is not None:
            who += f", until {when(viewer.expires)}"
        who += ")"
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · edgefleet {esc(region)}</title>"
        '<link rel=stylesheet href="/static/dashboard.css">'
        '<script src="/static/dashboard.js" defer></script></head><body>'
        f"<header><strong>edgefleet</strong> <span class=muted>hub {esc(region)}</span>"
        f"<nav>{links}</nav><span class=who>{who}</span></header>"
        f"<main><h1>{esc(title)}</h1>{body}</main></body></html>"
    )


def error_page(status: int, message: str, *, region: str) -> str:
    return layout(f"Error {status}", f"<p class=error>{esc(message)}</p>", None, region=region)


def live(url: str, inner: str) -> str:
    """A section the script keeps current from the server-sent events at ``url``."""
    return f'<section id=live data-live="{esc(url)}">{inner}</section>'


# -- fleet ---------------------------------------------------------------------------------------
def _count_cells(c: Counts) -> str:
    cells = (
        (c.total, ""),
        (c.ready, "ok"),
        (c.not_ready, "bad" if c.not_ready else ""),
        (c.pending, ""),
        (c.unhealthy, "bad" if c.unhealthy else ""),
        (c.untrusted, "bad" if c.untrusted else ""),
        (c.noncompliant, "bad" if c.noncompliant else ""),
        (c.cordoned, ""),
        (c.out_of_sync, "warn" if c.out_of_sync else ""),
    )
    return "".join(f"<td class='num {cls}'>{n}</td>" for n, cls in cells)


COUNT_HEADS = (
    "devices", "Ready", "NotReady", "Pending", "unhealthy", "Untrusted", "noncompliant",
    "cordoned", "out of sync",
)  # fmt: skip


def fleet_fragment(summary: FleetSummary) -> str:
    c = summary.counts
    tiles = "".join(
        f"<div class='tile {cls}'><b data-count={esc(key)}>{n}</b><span>{esc(label)}</span></div>"
        for key, n, label, cls in (
            ("total", c.total, "devices", ""),
            ("ready", c.ready, "Ready", "ok"),
            ("notReady", c.not_ready, "NotReady", "bad" if c.not_ready else ""),
            ("pending", c.pending, "Pending", ""),
            ("unhealthy", c.unhealthy, "unhealthy", "bad" if c.unhealthy else ""),
            ("untrusted", c.untrusted, "Untrusted", "bad" if c.untrusted else ""),
            ("outOfSync", c.out_of_sync, "out of sync", "warn" if c.out_of_sync else ""),
        )
    )
    att = ", ".join(f"{esc(k)} {v}" for k, v in summary.attestation.items())
    policy = (
        "attestation required (SecurityBaseline)"
        if summary.require_attestation
        else "attestation not required"
    )
    heads = "".join(f"<th>{esc(h)}</th>" for h in ("region", "site", *COUNT_HEADS))
    rows = "".join(
        f"<tr><td>{esc(r)}</td><td>{esc(s)}</td>{_count_cells(g)}</tr>"
        for r, s, g in summary.groups
    )
    more = (
        f"<p class=muted>and {summary.more_groups} smaller groups not shown</p>"
        if summary.more_groups
        else ""
    )
    return (
        f"<div class=tiles>{tiles}</div>"
        f"<p>Attestation: {att}; {esc(policy)}. Cordoned {c.cordoned}, revoked {c.revoked}.</p>"
        f"<h2>By region and site</h2><table class=grid><thead><tr>{heads}</tr></thead>"
        f"<tbody>{rows}</tbody></table>{more}"
    )


# -- devices -------------------------------------------------------------------------------------
def _phase_class(phase: str) -> str:
    return {"Ready": "ok", "NotReady": "bad", "Failed": "bad", "Refused": "bad"}.get(phase, "")


def _select(name: str, value: str, options: Iterable[str]) -> str:
    opts = "".join(
        f"<option{' selected' if o == value else ''}>{esc(o)}</option>" for o in ("", *options)
    )
    return f"<label>{esc(name)} <select name={esc(name)}>{opts}</select></label>"


def devices_body(page: DevicePage, query: DeviceQuery) -> str:
    form = (
        "<form class=filters method=get action=/devices>"
        f'<label>name <input name=q value="{esc(query.text)}" maxlength=256></label>'
        f"{_select('phase', query.phase, [p.value for p in DevicePhase])}"
        f"{_select('attestation', query.attestation, [s.value for s in TrustState])}"
        f"{_select('health', query.health, ['healthy', 'unhealthy'])}"
        f'<label>labels <input name=selector value="{esc(query.selector)}" maxlength=256 '
        'placeholder="site=retail,tier!=lab"></label>'
        f"<input type=hidden name=per value={query.per_page}>"
        "<button>Filter</button></form>"
    )
    rows = "".join(
        "<tr>"
        f'<td><a href="/devices/{esc(seg(d.name))}">{esc(d.name)}</a></td>'
        f"<td class={_phase_class(d.phase.value)}>{esc(d.phase.value)}</td>"
        f"<td>{'yes' if d.health.schedulable else 'no: ' + esc('; '.join(d.health.reasons))}</td>"
        f"<td>{esc(d.attestation.state.value)}</td>"
        f"<td>{_agent(d)}</td>"
        f"<td>{len(d.workloads)}</td>"
        f"<td class=labels>{_labels(d.all_labels(), limit=6)}</td>"
        f"<td>{when(d.last_heartbeat)}</td>"
        "</tr>"
        for d in page.rows
    )
    heads = "".join(
        f"<th>{h}</th>"
        for h in (
            "name", "phase", "healthy", "attestation", "agent", "workloads", "labels", "heartbeat"
        )
    )  # fmt: skip
    pager = []
    if page.page > 1:
        pager.append(f'<a rel=prev href="{href("/devices", query.params(page=page.page - 1))}">'
                     "← previous</a>")  # fmt: skip
    pager.append(f"<span>page {page.page} of {page.pages} ({page.matched} devices match)</span>")
    if page.page < page.pages:
        pager.append(f'<a rel=next href="{href("/devices", query.params(page=page.page + 1))}">'
                     "next →</a>")  # fmt: skip
    empty = "" if page.rows else "<p class=muted>no device on this page</p>"
    return (
        f"{form}<table class=grid id=devices><thead><tr>{heads}</tr></thead>"
        f"<tbody>{rows}</tbody></table>{empty}<nav class=pager>{' '.join(pager)}</nav>"
    )


def _agent(d: Device) -> str:
    """edged's version; refused by the hub (outside its version window): marked, and why."""
    version = esc(d.agent_version or "unknown")
    if d.agent_refused:
        return f'<span class=bad title="{esc(d.agent_refused)}">{version} (refused)</span>'
    return version


def _labels(labels: Mapping[str, str], *, limit: int = MAX_ITEMS) -> str:
    items = sorted(labels.items())
    shown = "".join(f"<code>{esc(k)}={esc(v)}</code> " for k, v in items[:limit])
    return shown + (f"<span class=muted>+{len(items) - limit}</span>" if len(items) > limit else "")


def _events_table(events: Sequence[Mapping[str, Any]], *, table_id: str = "") -> str:
    rows = "".join(_event_row(event_json(ev)) for ev in reversed(events))
    ident = f" id={esc(table_id)}" if table_id else ""
    return (
        f"<table class=grid{ident}><thead><tr><th>time</th><th>type</th><th>object</th>"
        f"<th>reason</th><th>message</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _event_row(ev: Mapping[str, Any]) -> str:
    return (
        f"<tr class={'bad' if ev['type'] == 'Warning' else ''}><td>{when(ev['time'])}</td>"
        f"<td>{esc(ev['type'])}</td><td>{esc(ev['kind'])}/{esc(ev['name'])}</td>"
        f"<td>{esc(ev['reason'])}</td><td>{esc(ev['message'])}</td></tr>"
    )


def device_body(
    device: Device,
    desired: DesiredRecord | None,
    events: Sequence[Mapping[str, Any]],
) -> str:
    d = device
    facts = dict(d.facts)
    accelerators = facts.pop("accelerators", None)
    summary = (
        "<table class=kv>"
        f"<tr><th>phase</th><td class={_phase_class(d.phase.value)}>{esc(d.phase.value)}</td></tr>"
        f"<tr><th>last heartbeat</th><td>{when(d.last_heartbeat)}</td></tr>"
        f"<tr><th>enrolled</th><td>{when(d.enrolled_at)}</td></tr>"
        f"<tr><th>healthy</th><td>{'yes' if d.health.schedulable else 'no'} "
        f"{esc('; '.join(d.health.reasons))}</td></tr>"
        f"<tr><th>attestation</th><td>{esc(d.attestation.state.value)} "
        f"{esc('; '.join(d.attestation.reasons))} (verified {when(d.attestation.verified_at)})"
        "</td></tr>"
        f"<tr><th>agent</th><td>edged {esc(d.agent_version or 'unknown')}"
        f"{' refused: ' + esc(d.agent_refused) if d.agent_refused else ''}</td></tr>"
        f"<tr><th>cordoned</th><td>{'yes' if d.cordoned else 'no'}</td></tr>"
        f"<tr><th>revoked</th><td>{'yes' if d.revoked else 'no'}</td></tr>"
        f"<tr><th>generation</th><td>acknowledged {d.generation_acked} of "
        f"{desired.generation if desired else 0}</td></tr>"
        f"<tr><th>deployments</th><td>{esc(', '.join(desired.deployments) if desired else '')}"
        "</td></tr>"
        f"<tr><th>operator labels</th><td>{_labels(d.labels)}</td></tr>"
        f"<tr><th>reported labels</th><td>{_labels(d.reported_labels)}</td></tr>"
        "</table>"
    )
    workloads = []
    for name, w in sorted(d.workloads.items())[:MAX_ITEMS]:
        revs = "".join(
            f"<tr><td>{esc(r.model_version)}</td><td><code>{esc(r.sha256[:12])}</code></td>"
            f"<td class={_phase_class(r.phase.value)}>{esc(r.phase.value)}</td>"
            f"<td class=num>{r.ready_replicas}</td><td>{'yes' if r.wanted else ''}</td>"
            f"<td>{esc(r.reason)}</td><td>{esc(r.message)}</td></tr>"
            for r in w.revisions[:MAX_ITEMS]
        )
        conds = "".join(
            f"<tr><td>{esc(c.get('type', ''))}</td><td>{esc(c.get('status', ''))}</td>"
            f"<td>{esc(c.get('reason', ''))}</td><td>{esc(c.get('message', ''))}</td></tr>"
            for c in w.conditions[:MAX_ITEMS]
        )
        ended = w.last_termination
        last = (
            f"<p>last termination <b>{esc(ended.reason)}</b> ("
            + (f"signal {ended.signal}" if ended.signal else f"exit code {ended.exit_code}")
            + f") at {when(ended.finished_at)}, replica {esc(ended.replica)}: "
            f"{esc(ended.message)}; {w.restart_count} restarts</p>"
            if ended is not None
            else ""
        )
        workloads.append(
            f"<h3>{esc(name)}</h3><p>model version {esc(w.model_version)}, phase "
            f"{esc(w.phase or '—')}, replicas {w.ready_replicas}/{w.desired_replicas} ready</p>"
            f"{last}"
            "<table class=grid><thead><tr><th>version</th><th>sha256</th><th>phase</th>"
            "<th>ready</th><th>wanted</th><th>reason</th><th>message</th></tr></thead>"
            f"<tbody>{revs}</tbody></table>"
            "<table class=grid><thead><tr><th>condition</th><th>status</th><th>reason</th>"
            f"<th>message</th></tr></thead><tbody>{conds}</tbody></table>"
        )
    return (
        f"{summary}<h2>Workloads</h2>{''.join(workloads) or '<p class=muted>none</p>'}"
        f"<h2>Accelerators</h2>{value_html(accelerators) if accelerators else '<p>none</p>'}"
        f"<h2>Facts</h2>{value_html(facts)}"
        f"<h2>Recent events</h2>{_events_table(events)}"
    )


# -- deployments ---------------------------------------------------------------------------------
def deployments_body(rows: Sequence[Mapping[str, Any]], page: int = 1, pages_: int = 1) -> str:
    body = "".join(
        f'<tr><td><a href="/deployments/{esc(seg(r["name"]))}">{esc(r["name"])}</a></td>'
        f"<td>{esc(r['model'])}</td>"
        + "".join(
            f"<td class=num>{esc(r['status'].get(k, 0))}</td>"
            for k in ("desiredDevices", "updatedDevices", "readyDevices", "availableDevices")
        )
        + f"<td>{esc(r['status'].get('rollout', {}).get('phase', '—'))}</td></tr>"
        for r in rows
    )
    return (
        "<table class=grid id=deployments><thead><tr><th>name</th><th>model</th>"
        "<th>desired</th><th>updated</th><th>ready</th><th>available</th><th>rollout</th>"
        f"</tr></thead><tbody>{body}</tbody></table>{_pager('/deployments', page, pages_)}"
    )


def agent_upgrades_body(rows: Sequence[Mapping[str, Any]]) -> str:
    """Each AgentUpgrade (issue 32): version, phase, devices done of the pool, updating,
    refused, the canary step, then every failed device with its reason and every device sent
    back, as ``edgectl rollout status agentupgrade/NAME`` says them."""
    if not rows:
        return "<p class=muted>no AgentUpgrade applied</p>"
    table = "".join(
        f"<tr><td>{esc(r['name'])}</td><td>{esc(r['version'])}</td>"
        f"<td>{esc(r['status'].get('phase', '—'))}</td>"
        f"<td class=num>{esc(r['status'].get('doneDevices', 0))}/"
        f"{esc(r['status'].get('poolDevices', 0))}</td>"
        + "".join(
            f"<td class=num>{esc(n)}</td>"
            for n in (
                r["status"].get("updatingDevices", 0),
                max(  # in waves: the regions' failed devices, summed
                    len(r["status"].get("failedDevices", {})),
                    int(r["status"].get("failedCount", 0) or 0),
                ),
                len(r["status"].get("refused", {})),
            )
        )
        + f"<td>{esc(_upgrade_step(r['status']))}</td></tr>"
        for r in rows
    )
    details = "".join(
        f"<h2>{esc(r['name'])}</h2><p>{esc(r['status'].get('message', ''))}</p>"
        + "".join(
            f"<p class=warn>failed {esc(d)}: {esc(why)}</p>"
            for d, why in sorted(r["status"].get("failedDevices", {}).items())[:50]
        )
        + "".join(
            f"<p>sent back {esc(d)}: {esc(v)}</p>"
            for d, v in sorted(r["status"].get("rollbackDevices", {}).items())[:50]
        )
        for r in rows
        if r["status"].get("failedDevices") or r["status"].get("rollbackDevices")
    )
    return (
        "<table class=grid id=agentupgrades><thead><tr><th>name</th><th>version</th>"
        "<th>phase</th><th>done</th><th>updating</th><th>failed</th><th>refused</th>"
        f"<th>step</th></tr></thead><tbody>{table}</tbody></table>{details}"
    )


def _upgrade_step(status: Mapping[str, Any]) -> str:
    waves = int(status.get("waveCount", 0) or 0)
    if waves:  # at a root hub, in waves: which wave, and its regions sent the upgrade
        wave = int(status.get("wave", 0) or 0)
        sent = [
            r
            for row in status.get("waves", []) or []
            if isinstance(row, Mapping) and row.get("wave") == wave
            for r, v in sorted((row.get("regions") or {}).items())
            if isinstance(v, Mapping) and v.get("sent")
        ]
        where = "the remaining regions" if wave > waves else f"{wave} of {waves}"
        return f"wave {where}" + (f": {', '.join(sent[:10])}" if sent else "")
    count = status.get("stepCount", 0)
    if not count:
        return "—"
    if status.get("pastLastStep"):
        return "all"
    return f"{status.get('step')} of {count}"


def _pager(path: str, page: int, pages_: int) -> str:
    if pages_ <= 1 and page <= 1:
        return ""
    links = []
    if page > 1:
        links.append(f'<a rel=prev href="{href(path, {"page": str(page - 1)})}">← previous</a>')
    links.append(f"<span>page {page} of {pages_}</span>")
    if page < pages_:
        links.append(f'<a rel=next href="{href(path, {"page": str(page + 1)})}">next →</a>')
    return f"<nav class=pager>{' '.join(links)}</nav>"


def _bar(part: int, whole: int) -> str:
    pct = 0 if whole <= 0 else max(0, min(100, round(100 * part / whole)))
    return f"<span class=bar><span class=fill data-pct={pct}></span></span>"


def history_html(series: Mapping[str, Sequence[float]], thresholds: Mapping[str, float]) -> str:
    """One plot per figure recorded over time, its threshold dashed."""
    if not series:
        return "<p class=muted>figures appear here as they change</p>"
    plots = "".join(
        f"<div class=figure><h3>{esc(path)}</h3>"
        f"{plot_svg({'now': values}, thresholds.get(path))}</div>"
        for path, values in series.items()
    )
    return f"<div class=figures>{plots}</div>"


def deployment_fragment(
    status: Mapping[str, Any],
    revisions: Sequence[Mapping[str, Any]],
    series: Mapping[str, Sequence[float]] | None = None,
    thresholds: Mapping[str, float] | None = None,
    *,
    doc: Mapping[str, Any] | None = None,
    events: Sequence[Mapping[str, Any]] = (),
) -> str:
    """A deployment as ``edgectl describe deployment`` reads (``doc``: the object as
    ``edgectl get`` shows it): what it asks for, its devices, its rollout in words, versions,
    conditions, failing devices, revisions and its recent events; then its figures over
    time."""
    desired = int(status.get("desiredDevices", 0))
    counts = "".join(
        f"<tr><th>{esc(label)}</th><td class=num data-field={esc(key)}>"
        f"{esc(status.get(key, 0))}</td><td>{_bar(int(status.get(key, 0)), desired)}</td></tr>"
        for key, label in (
            ("desiredDevices", "desired"),
            ("updatedDevices", "updated"),
            ("readyDevices", "ready"),
            ("availableDevices", "available"),
        )
    )
    versions = "".join(
        f"<tr><td>{esc(v)}</td><td class=num>{esc(c.get('devices', 0))}</td>"
        f"<td class=num>{esc(c.get('ready', 0))}</td></tr>"
        for v, c in list(status.get("versions", {}).items())[:MAX_ITEMS]
    )
    conds = "".join(
        f"<tr class={'bad' if c.get('reason') == 'RevisionFailed' else ''}>"
        f"<td>{esc(c.get('type', ''))}</td><td>{esc(c.get('status', ''))}</td>"
        f"<td>{esc(c.get('reason', ''))}</td><td>{esc(c.get('message', ''))}</td></tr>"
        for c in status.get("conditions", [])[:MAX_ITEMS]
    )
    failing_all = list(status.get("failing", {}).items())
    rolled = status.get("rollout")
    if isinstance(rolled, Mapping) and rolled.get("phase") == "RolledBack":
        # the devices the rollout was rolled back for, as edgectl describe lists them
        failing_all += [
            (d, f"{why} (revision {rolled.get('revision')}, rolled back)")
            for d, why in sorted((rolled.get("failedDevices") or {}).items())
        ]
    failing = "".join(
        f'<tr><td><a href="/devices/{esc(seg(str(d)))}">{esc(d)}</a></td><td>{esc(r)}</td></tr>'
        for d, r in failing_all[:MAX_LISTED]
    )
    more = (
        f"<p class=muted>and {len(failing_all) - MAX_LISTED} more</p>"
        if len(failing_all) > MAX_LISTED
        else ""
    )
    rollout = status.get("rollout")
    rollout_html = "<p class=muted>no rollout</p>"
    if isinstance(rollout, Mapping):
        rollout_html = (
            f"<p class=rollout>revision {esc(rollout.get('revision', '?'))} "
            f"(stable {esc(rollout.get('stableRevision', '?'))}): "
            f"<b data-field=phase class={_rollout_class(rollout.get('phase'))}>"
            f"{esc(rollout.get('phase', '?'))}</b>, step "
            f"<b data-field=step>{esc(rollout.get('steps', 0))}</b>"
            f" {esc(rollout.get('reason', ''))} {esc(rollout.get('message', ''))}</p>"
            + rollout_facts(rollout)
            + "<details><summary>every field of status.rollout</summary>"
            + value_html(rollout)
            + "</details>"
        )
    revs = "".join(
        f"<tr><td class=num>{esc(r.get('number'))}</td><td>{esc(r.get('model'))}</td>"
        f"<td>{esc(r.get('role', ''))}</td><td class=num>{esc(r.get('devices', 0))}</td>"
        f"<td class=num>{esc(r.get('ready', 0))}</td><td>{when(r.get('createdAt'))}</td></tr>"
        for r in revisions
    )
    failing_html = (
        f"<table class=grid id=failing><tbody>{failing}</tbody></table>{more}"
        if failing
        else "<p class=muted id=failing>&lt;none&gt;</p>"
    )
    events_html = (
        _events_table(events, table_id="deployment-events")
        if events
        else "<p class=muted>&lt;none&gt;</p>"
    )
    return (
        (describe_html(doc) if doc is not None else "")
        + f"<table class=kv id=counts>{counts}</table>"
        f"<h2>Rollout</h2>{rollout_html}"
        "<h2>Versions serving</h2><table class=grid><thead><tr><th>version</th><th>devices</th>"
        f"<th>ready</th></tr></thead><tbody>{versions}</tbody></table>"
        "<h2>Conditions</h2><table class=grid id=conditions><thead><tr><th>type</th>"
        "<th>status</th><th>reason</th><th>message</th></tr></thead>"
        f"<tbody>{conds}</tbody></table>"
        f"<h2>Failing devices</h2>{failing_html}"
        "<h2>Revisions</h2><table class=grid id=revisions><thead><tr><th>revision</th>"
        "<th>model</th><th></th><th>devices serving its version</th><th>ready</th>"
        f"<th>created</th></tr></thead><tbody>{revs}</tbody></table>"
        f"<h2>Events</h2>{events_html}"
        f"<h2>Over time</h2>{history_html(series or {}, thresholds or {})}"
    )


def _rollout_class(phase: object) -> str:
    return {"RolledBack": "bad", "Aborted": "bad", "Paused": "warn", "Complete": "ok"}.get(
        str(phase), ""
    )


def _selector_text(placement: Mapping[str, Any]) -> str:
    """The node selector and match expressions as ``-l`` writes them, the way ``edgectl
    describe`` says them (edgectl.printing.selector_text): ``site=retail,tier in (a,b),!lab``."""
    parts = [f"{k}={v}" for k, v in sorted((placement.get("nodeSelector") or {}).items())]
    for e in (placement.get("matchExpressions") or [])[:MAX_ITEMS]:
        if not isinstance(e, Mapping):
            continue
        key, op = str(e.get("key", "")), str(e.get("operator", ""))
        values = ",".join(str(v) for v in e.get("values") or [])
        if op in ("In", "NotIn"):
            parts.append(f"{key} {op.lower()} ({values})")
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            parts.append(key)
    return ",".join(parts) or "<none>"


def describe_html(doc: Mapping[str, Any]) -> str:
    """What the deployment asks for, one fact a row, as ``edgectl describe`` says it."""
    meta = doc.get("metadata", {}) or {}
    spec = doc.get("spec", {}) or {}
    status = doc.get("status", {}) or {}
    model = spec.get("model", {}) or {}
    placement = spec.get("placement", {}) or {}
    replicas = spec.get("replicas", {}) or {}
    per = replicas.get("perDevice")
    rollout_spec = spec.get("rollout", {}) or {}
    canary = rollout_spec.get("canary") or {}
    steps = canary.get("steps") or []
    strategy = (
        f"maxSurge {rollout_spec.get('maxSurge', '25%')}, "
        f"maxUnavailable {rollout_spec.get('maxUnavailable', '25%')}"
    )
    if steps:
        strategy += f"; canary, {len(steps)} steps" + (
            ", with analysis" if canary.get("analysis") is not None else ""
        )
    rollout = status.get("rollout") or {}
    labels = ", ".join(f"{k}={v}" for k, v in sorted((meta.get("labels") or {}).items()))
    rows: list[tuple[str, object]] = [
        ("Name", meta.get("name", "")),
        ("Labels", labels or "<none>"),
        ("Model", f"{model.get('name', '?')} {model.get('version', '?')}"),
        (
            "Replicas",
            f"{per} per device"
            if per is not None
            else f"{replicas.get('total', '?')} across the fleet",
        ),
        ("Selector", _selector_text(placement)),
        ("Regions", ", ".join(placement.get("regions") or []) or "<any>"),
        ("Strategy", strategy),
        (
            "Devices",
            f"{status.get('desiredDevices', 0)} desired | {status.get('updatedDevices', 0)} "
            f"updated | {status.get('readyDevices', 0)} ready | "
            f"{status.get('availableDevices', 0)} available",
        ),
        ("Rollout", rollout_words(rollout) if rollout else "<none>"),
    ]
    if meta.get("creationTimestamp"):
        rows.insert(2, ("Created", meta["creationTimestamp"]))
    body = "".join(f"<tr><th>{esc(k)}:</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f"<table class='kv describe' id=describe>{body}</table>"


def rollout_words(rollout: Mapping[str, Any]) -> str:
    """``revision 3 (2.0.0) RolledBack (RevisionFailed), stable revision 2 (1.1.0)``, as
    ``edgectl describe`` says a rollout."""

    def rev(number: object, version: object) -> str:
        return f"revision {number}" + (f" ({version})" if version else "")

    line = f"{rev(rollout.get('revision'), rollout.get('version'))} {rollout.get('phase', '?')}"
    if rollout.get("reason"):
        line += f" ({rollout['reason']})"
    if rollout.get("stableRevision") != rollout.get("revision"):
        line += f", stable {rev(rollout.get('stableRevision'), rollout.get('stableVersion'))}"
    return line


def rollout_facts(rollout: Mapping[str, Any]) -> str:
    """The rollout's progress in words: devices moved, the canary step and its analysis'
    checks (the figures against their thresholds), and the devices it was rolled back for."""
    rows: list[tuple[str, str]] = []
    if "targetedDevices" in rollout:
        rows.append(
            (
                "Progress",
                f"{rollout.get('updatedDevices', 0)} of {rollout.get('targetedDevices', 0)} "
                f"devices on the new revision, {rollout.get('readyDevices', 0)} ready, "
                f"{rollout.get('updatingDevices', 0)} updating, "
                f"{rollout.get('unavailableDevices', 0)} unavailable (maxSurge "
                f"{rollout.get('maxSurge', '?')}, maxUnavailable "
                f"{rollout.get('maxUnavailable', '?')})",
            )
        )
    canary = rollout.get("canary")
    if isinstance(canary, Mapping) and canary.get("stepCount"):
        step = (
            "past the last step"
            if canary.get("pastLastStep")
            else f"step {canary.get('step')} of {canary.get('stepCount')}"
        )
        rows.append(
            (
                "Canary",
                f"{step}: weight {canary.get('weight', '?')}% "
                f"({canary.get('weightDevices', '?')} devices)",
            )
        )
        analysis = canary.get("analysis")
        if isinstance(analysis, Mapping):
            for check in (analysis.get("checks") or [])[:MAX_ITEMS]:
                if isinstance(check, Mapping):
                    verdict = "pass" if check.get("passed") else "FAIL"
                    rows.append(
                        (
                            f"Analysis {check.get('name', '?')}",
                            f"{verdict}: {check.get('message', '')}",
                        )
                    )
    for key, label in (("startedAt", "Started"), ("changedAt", "Changed")):
        if rollout.get(key):
            rows.append((label, str(rollout[key])))
    if rollout.get("message"):
        rows.append(("Message", str(rollout["message"])))
    if not rows:
        return ""
    body = "".join(f"<tr><th>{esc(k)}:</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f"<table class='kv describe' id=rollout-facts>{body}</table>"


# -- actions -------------------------------------------------------------------------------------
def flash_html(flash: tuple[bool, str] | None) -> str:
    """The outcome of the viewer's last action (shown once)."""
    if flash is None:
        return ""
    ok, text = flash
    return f"<p id=flash class='flash {'ok' if ok else 'bad'}' role=status>{esc(text)}</p>"


def actions_html(
    base: str,
    csrf: str,
    verbs: Iterable[Any],
    *,
    enabled: bool,
    kind: str = "ModelDeployment",
    title: str = "",
) -> str:
    """The action buttons of one rollout (``base``: its path, URL-quoted): each a POST form
    with the viewer's CSRF token. A verb this hub does not support yet is a disabled button
    saying so; none is a button that does nothing."""
    forms = []
    for verb in verbs:
        if not enabled or not verb.supported_for(kind):
            why = "not supported yet" if enabled else "this dashboard cannot act"
            forms.append(
                f"<span class=action><button type=button disabled data-verb={esc(verb.name)} "
                f'title="{esc(why)}">{esc(verb.label)}</button>'
                f" <small class=muted>{esc(why)}</small></span>"
            )
            continue
        extra = ""
        if verb.name == "promote":
            extra = "<label><input type=checkbox name=full value=1> full</label> "
        if verb.name == "undo":
            extra = (
                "<label>to revision <input name=to inputmode=numeric pattern='[0-9]{0,10}' "
                "size=4 maxlength=10 placeholder=stable></label> "
            )
        forms.append(
            f'<form class=action method=post action="{esc(base)}/actions/{esc(verb.name)}">'
            f'<input type=hidden name=csrf value="{esc(csrf)}">{extra}'
            f'<button data-verb={esc(verb.name)} title="{esc(verb.help)}">{esc(verb.label)}'
            "</button></form>"
        )
    head = f"<h2>{esc(title)}</h2>" if title else ""
    return f"{head}<div class=actions>{''.join(forms)}</div>"


# -- the landing page: deployments and rollouts in progress ---------------------------------------
def rollouts_overview(
    in_progress: Sequence[Mapping[str, Any]],
    deployments: Sequence[Mapping[str, Any]],
    more_deployments: int,
) -> str:
    """The rollouts moving now (ModelDeployments and AgentUpgrades), then the deployments
    with their rollout's phase."""
    moving = "".join(
        f"<tr><td>{esc(r['kind'])}</td>"
        f'<td><a href="{esc(r["href"])}">{esc(r["name"])}</a></td>'
        f"<td>{esc(r['what'])}</td>"
        f"<td class={_rollout_class(r['phase'])}>{esc(r['phase'])}</td>"
        f"<td>{esc(r['step'])}</td><td>{when(r['since'] or None)}</td>"
        f"<td>{esc(r['message'])}</td></tr>"
        for r in in_progress
    )
    moving_html = (
        "<table class=grid id=in-progress><thead><tr><th>kind</th><th>name</th><th>revision</th>"
        "<th>phase</th><th>step</th><th>since</th><th>message</th></tr></thead>"
        f"<tbody>{moving}</tbody></table>"
        if in_progress
        else "<p class=muted id=in-progress>no rollout in progress</p>"
    )
    deps = "".join(
        f'<tr><td><a href="/deployments/{esc(seg(r["name"]))}">{esc(r["name"])}</a></td>'
        f"<td>{esc(r['model'])}</td>"
        f"<td class=num>{esc(r['status'].get('readyDevices', 0))}/"
        f"{esc(r['status'].get('desiredDevices', 0))}</td>"
        f"<td class=num>{esc(r['status'].get('availableDevices', 0))}</td>"
        f"<td class={_rollout_class(r['status'].get('rollout', {}).get('phase'))}>"
        f"{esc(r['status'].get('rollout', {}).get('phase', '—'))}</td></tr>"
        for r in deployments
    )
    more = (
        f'<p class=muted>and {more_deployments} more: <a href="/deployments">all deployments</a>'
        "</p>"
        if more_deployments > 0
        else ""
    )
    deps_html = (
        "<table class=grid id=landing-deployments><thead><tr><th>name</th><th>model</th>"
        "<th>ready</th><th>available</th><th>rollout</th></tr></thead>"
        f"<tbody>{deps}</tbody></table>{more}"
        if deployments
        else "<p class=muted>no ModelDeployment applied</p>"
    )
    return f"<h2>Rollouts in progress</h2>{moving_html}<h2>Deployments</h2>{deps_html}"


# -- generic values (status, facts), with plots ---------------------------------------------------
def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _series(value: object) -> list[float] | None:
    """``value`` as a series to plot: a list of at least two numbers, or of ``[t, y]`` pairs
    or ``{"value": y}``-like objects (the last number of each)."""
    if not isinstance(value, list) or len(value) < 2:
        return None
    out: list[float] = []
    for item in value[:1000]:
        if _number(item):
            out.append(float(item))
        elif isinstance(item, list) and item and _number(item[-1]):
            out.append(float(item[-1]))
        elif isinstance(item, Mapping):
            nums = [v for k, v in item.items() if _number(v) and k not in ("time", "t", "at")]
            if not nums:
                return None
            out.append(float(nums[-1]))
        else:
            return None
    return out


def plot_svg(series: Mapping[str, Sequence[float]], threshold: float | None = None) -> str:
    """Lines of each series (the same x scale: sample index), and a dashed threshold."""
    values = [v for s in series.values() for v in s]
    if threshold is not None:
        values.append(threshold)
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    longest = max((len(s) for s in series.values()), default=2)

    def y(v: float) -> float:
        return round(PLOT_H - 4 - (v - low) / span * (PLOT_H - 8), 1)

    lines = []
    for i, (name, s) in enumerate(series.items()):
        step = (PLOT_W - 8) / max(1, longest - 1)
        points = " ".join(f"{round(4 + j * step, 1)},{y(v)}" for j, v in enumerate(s))
        lines.append(
            f'<polyline class="series s{i % 4}" points="{points}"><title>{esc(name)}: last '
            f"{esc(f'{s[-1]:g}')}</title></polyline>"
        )
    if threshold is not None:
        ty = y(threshold)
        lines.append(
            f'<line class=threshold x1=0 x2={PLOT_W} y1="{ty}" y2="{ty}"><title>threshold '
            f"{esc(f'{threshold:g}')}</title></line>"
        )
    legend = ", ".join(f"{esc(n)} {esc(f'{s[-1]:g}')}" for n, s in series.items() if s)
    if threshold is not None:
        legend += f"; threshold {esc(f'{threshold:g}')}"
    return (
        f'<figure class=plot><svg viewBox="0 0 {PLOT_W} {PLOT_H}" width={PLOT_W} '
        f'height={PLOT_H} role=img aria-label="{legend}">{"".join(lines)}</svg>'
        f"<figcaption>{legend}</figcaption></figure>"
    )


def _field_html(key: str, value: object, depth: int) -> str:
    """A field's value; ``...At`` fields holding seconds since the epoch as times."""
    if key.endswith("At") and _number(value) and float(value) > 0:  # type: ignore[arg-type]
        return when(float(value))  # type: ignore[arg-type]
    return value_html(value, depth)


def value_html(value: object, depth: int = 0) -> str:
    """Any JSON value, readable: objects as key/value tables (their series plotted together
    with their threshold), lists of objects as tables, lists of numbers as plots."""
    if depth > MAX_DEPTH:
        return "<span class=muted>…</span>"
    if isinstance(value, Mapping):
        items = list(value.items())[:MAX_ITEMS]
        series = {str(k): s for k, v in items if (s := _series(v)) is not None}
        threshold = next((float(value[k]) for k in THRESHOLD_KEYS if _number(value.get(k))), None)
        plot = plot_svg(series, threshold) if series else ""
        rows = "".join(
            f"<tr><th>{esc(k)}</th><td>{_field_html(str(k), v, depth + 1)}</td></tr>"
            for k, v in items
            if str(k) not in series
        )
        return f"{plot}<table class=kv>{rows}</table>" if rows else plot or "{}"
    if isinstance(value, list):
        series_one = _series(value)
        if series_one is not None:
            return plot_svg({"value": series_one})
        shown = value[:MAX_ITEMS]
        more = (
            f"<span class=muted>+{len(value) - MAX_ITEMS} more</span>"
            if len(value) > MAX_ITEMS
            else ""
        )
        if shown and all(isinstance(v, Mapping) for v in shown):
            keys: list[str] = []
            for v in shown:
                keys.extend(str(k) for k in v if str(k) not in keys)
            keys = keys[:20]
            head = "".join(f"<th>{esc(k)}</th>" for k in keys)
            body = "".join(
                "<tr>"
                + "".join(f"<td>{value_html(v.get(k, ''), depth + 1)}</td>" for k in keys)
                + "</tr>"
                for v in shown
            )
            table = f"<table class=grid><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
            return f"{table}</table>{more}"
        return ", ".join(value_html(v, depth + 1) for v in shown) + more
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if _number(value):
        return esc(f"{value:g}") if isinstance(value, float) else esc(value)
    return esc(value)


# -- events and models ---------------------------------------------------------------------------
def events_body(events: Sequence[Mapping[str, Any]], position: int) -> str:
    return (
        f"<p class=muted>Live: new events appear at the top. <span id=stream-state></span></p>"
        f'<div id=events-live data-stream="/events/stream" data-position={position}>'
        f"{_events_table(events, table_id='events')}</div>"
    )


def models_body(models: Sequence[ModelVersion], page: int = 1, pages_: int = 1) -> str:
    rows = "".join(
        f"<tr><td>{esc(m.name)}</td><td>{esc(m.version)}</td>"
        f"<td><code>{esc(m.sha256[:16])}</code></td><td class=num>{m.length}</td>"
        f"<td>{when(m.pushed_at)}</td>"
        f"<td>{''.join(f'<code>{esc(s)}</code> ' for s in m.signers) or 'unsigned?'}</td>"
        f"<td>{esc(', '.join(m.used_by))}</td></tr>"
        for m in models
    )
    return (
        "<table class=grid id=models><thead><tr><th>model</th><th>version</th><th>sha256</th>"
        "<th>bytes</th><th>pushed</th><th>signers (key ids)</th><th>used by</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{_pager('/models', page, pages_)}"
    )


# -- a canary against its stable revision, over time ---------------------------------------------
COMPARE_W, COMPARE_H = 520, 160
COMPARED = (
    # (figure, title, unit scale, unit, how the canary is held to its limit)
    ("errorRate", "error rate", 100.0, "%", "at most"),
    ("latencyP95Seconds", "latency p95", 1000.0, "ms", "at most"),
    ("accuracy", "accuracy on the validation set", 1.0, "", "at least"),
)
LIMIT_NAMES = {
    "errorRate": "stable + maxErrorRateIncrease",
    "latencyP95Seconds": "maxLatencyP95",
    "accuracy": "minAccuracy",
}


def _fmt(value: float | None, scale: float, unit: str) -> str:
    if value is None:
        return "—"
    return f"{value * scale:.4g}{(' ' + unit) if unit and unit != '%' else unit}"


def comparison_svg(
    figure: str,
    samples: Sequence[TimelineSample],
    scale: float = 1.0,
) -> str:
    """One figure of the canary and of the stable revision over time (x: the samples' times),
    with the limit the canary is held to drawn dashed (it moves with the stable revision's
    error rate). Missing values (nothing measured yet) leave gaps; ``data-*`` attributes say
    what is drawn (how many points per series, the latest limit)."""
    lines: dict[str, list[tuple[float, float]]] = {"canary": [], "stable": [], "threshold": []}
    for s in samples:
        for side, doc in (("canary", s.canary), ("stable", s.stable)):
            v = doc.get(figure)
            if _number(v):
                lines[side].append((s.at, float(v) * scale))  # type: ignore[arg-type]
        limit = s.limits.get(figure)
        if limit is not None and _number(limit):
            lines["threshold"].append((s.at, float(limit) * scale))
    times = [t for pts in lines.values() for t, _ in pts]
    values = [v for pts in lines.values() for _, v in pts]
    if not values:
        return "<p class=muted>nothing measured yet</p>"
    t0, t1 = min(times), max(times)
    low, high = min(0.0, *values), max(values)
    span_t, span_v = (t1 - t0) or 1.0, (high - low) or 1.0
    pad = 6

    def xy(t: float, v: float) -> str:
        x = pad + (t - t0) / span_t * (COMPARE_W - 2 * pad)
        y = COMPARE_H - pad - (v - low) / span_v * (COMPARE_H - 2 * pad)
        return f"{round(x, 1)},{round(y, 1)}"

    drawn = []
    for i, (series, pts) in enumerate(lines.items()):
        if not pts:
            continue
        cls = "threshold" if series == "threshold" else f"series s{i % 4}"
        last = f"{pts[-1][1]:.4g}"
        drawn.append(
            f'<polyline class="{cls}" data-series={series} data-points={len(pts)} '
            f'data-last="{esc(last)}" points="{" ".join(xy(t, v) for t, v in pts)}">'
            f"<title>{esc(series)}: last {esc(last)}</title></polyline>"
        )
    limit_now = lines["threshold"][-1][1] if lines["threshold"] else None
    attrs = f"data-figure={esc(figure)}" + (
        f' data-threshold="{esc(f"{limit_now:.6g}")}"' if limit_now is not None else ""
    )
    axis = (
        f"<text x={pad} y=12 class=axis>{esc(f'{high:.4g}')}</text>"
        f"<text x={pad} y={COMPARE_H - 8} class=axis>{esc(f'{low:.4g}')}</text>"
    )
    return (
        f'<svg class=compare {attrs} viewBox="0 0 {COMPARE_W} {COMPARE_H}" width={COMPARE_W} '
        f'height={COMPARE_H} role=img aria-label="{esc(figure)}">{axis}{"".join(drawn)}</svg>'
    )


def canary_fragment(
    name: str,
    samples: Sequence[TimelineSample],
    phase: str,
    message: str,
) -> str:
    """The comparison of a deployment's canary with its stable revision: the latest figures
    side by side, then each figure over time with its limit (one plot per figure)."""
    if not samples:
        return (
            f"<p class=muted>no canary analysis kept for {esc(name)}: it appears while a "
            "rollout with <code>spec.rollout.canary.analysis</code> runs</p>"
        )
    last = samples[-1]
    head = (
        f"<p class=rollout>revision <b data-field=canaryRevision>{last.revision}</b> against "
        f"stable revision <b data-field=stableRevision>{last.stable_revision}</b>: rollout "
        f"<b data-field=phase class={'bad' if phase == 'RolledBack' else ''}>{esc(phase)}</b>, "
        f"analysis <b data-field=verdict class={'bad' if last.verdict == 'Fail' else ''}>"
        f"{esc(last.verdict)}</b> at canary step {last.step + 1}. {esc(message)}</p>"
        f"<p class=muted>{len(samples)} samples from {when(samples[0].at)} to "
        f"{when(last.at)}, kept by the hub across restarts</p>"
    )
    rows = "".join(
        f"<tr data-figure={esc(fig)}><th>{esc(title)}</th>"
        f"<td class=num>{esc(_fmt(last.canary.get(fig), sc, unit))}</td>"
        f"<td class=num>{esc(_fmt(last.stable.get(fig), sc, unit))}</td>"
        f"<td>{esc(held)} {esc(_fmt(last.limits.get(fig), sc, unit))}"
        f" <span class=muted>({esc(LIMIT_NAMES[fig])})</span></td>"
        f"<td class={'bad' if last.verdicts.get(fig) == 'Fail' else ''}>"
        f"{esc(last.verdicts.get(fig, 'not checked'))}</td></tr>"
        for fig, title, sc, unit, held in COMPARED
    )
    counts = "".join(
        f"<tr><th>{esc(title)}</th><td class=num>{esc(_fmt(last.canary.get(fig), 1, ''))}</td>"
        f"<td class=num>{esc(_fmt(last.stable.get(fig), 1, ''))}</td><td></td><td></td></tr>"
        for fig, title in (("devices", "devices"), ("requests", "requests in the window"))
    )
    table = (
        "<table class=grid id=compare><thead><tr><th></th><th>canary</th><th>stable</th>"
        f"<th>limit</th><th>check</th></tr></thead><tbody>{rows}{counts}</tbody></table>"
    )
    plots = "".join(
        f"<div class=figure id=plot-{esc(fig)}><h3>{esc(title)}"
        f"{(' (' + esc(unit) + ')') if unit else ''}</h3>"
        f"{comparison_svg(fig, samples, sc)}</div>"
        for fig, title, sc, unit, _ in COMPARED
    )
    legend = (
        "<p class=legend><span class='key s0'>canary</span> <span class='key s1'>stable</span> "
        "<span class='key threshold'>limit</span></p>"
    )
    return f"{head}{table}<h2>Over time</h2>{legend}<div class=figures>{plots}</div>"
