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
    Counts,
    DevicePage,
    DeviceQuery,
    FleetSummary,
    ModelVersion,
    event_json,
)
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


def events_table(events: Sequence[Mapping[str, Any]], *, table_id: str = "") -> str:
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
        f"<h2>Recent events</h2>{events_table(events)}"
    )


def pager(path: str, page: int, pages_: int) -> str:
    if pages_ <= 1 and page <= 1:
        return ""
    links = []
    if page > 1:
        links.append(f'<a rel=prev href="{href(path, {"page": str(page - 1)})}">← previous</a>')
    links.append(f"<span>page {page} of {pages_}</span>")
    if page < pages_:
        links.append(f'<a rel=next href="{href(path, {"page": str(page + 1)})}">next →</a>')
    return f"<nav class=pager>{' '.join(links)}</nav>"


# -- generic values (status, facts), with plots ---------------------------------------------------
def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _series(value: object) -> list[float] | None:
    """``value`` as a series to plot: a list of at least two numbers, or of ``[t, y]`` pairs
    or ``{"value": y}``-like objects (the last number of each)."""
    if not isinstance(value, list) or len(value) < 2:
        return None
    out: list[float] = []
    for item in value[:1000]:
        if is_number(item):
            out.append(float(item))
        elif isinstance(item, list) and item and is_number(item[-1]):
            out.append(float(item[-1]))
        elif isinstance(item, Mapping):
            nums = [v for k, v in item.items() if is_number(v) and k not in ("time", "t", "at")]
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
    if key.endswith("At") and is_number(value) and float(value) > 0:  # type: ignore[arg-type]
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
        threshold = next((float(value[k]) for k in THRESHOLD_KEYS if is_number(value.get(k))), None)
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
    if is_number(value):
        return esc(f"{value:g}") if isinstance(value, float) else esc(value)
    return esc(value)


# -- events and models ---------------------------------------------------------------------------
def events_body(events: Sequence[Mapping[str, Any]], position: int) -> str:
    return (
        f"<p class=muted>Live: new events appear at the top. <span id=stream-state></span></p>"
        f'<div id=events-live data-stream="/events/stream" data-position={position}>'
        f"{events_table(events, table_id='events')}</div>"
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
        f"<tbody>{rows}</tbody></table>{pager('/models', page, pages_)}"
    )
