"""The dashboard's rollout pages and the console's actions (docs/dashboard.md): the
ModelDeployments and AgentUpgrades lists, a deployment's page (read like ``edgectl describe``,
its rollout, figures over time and events), the action buttons an admin posts
(:mod:`~hub.api.dashboard.actions` performs them) and the outcome shown once, the landing
page's rollouts in progress, and a canary against its stable revision over time. Rendered as
:mod:`~hub.api.dashboard.pages` renders, every value escaped with its :func:`esc`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hub.api.dashboard.pages import (
    MAX_ITEMS,
    esc,
    events_table,
    is_number,
    pager,
    plot_svg,
    seg,
    value_html,
    when,
)
from hub.api.dashboard.views import MAX_LISTED, MAX_REASONS, DeploymentPlacements
from hub.decide.analysis import TimelineSample


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
        f"</tr></thead><tbody>{body}</tbody></table>{pager('/deployments', page, pages_)}"
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
    placements: DeploymentPlacements | None = None,
) -> str:
    """A deployment as ``edgectl describe deployment`` reads (``doc``: the object as
    ``edgectl get`` shows it): what it asks for, its devices, its rollout in words, versions,
    conditions, failing devices, its placements and why devices were left out, revisions and
    its recent events; then its figures over time."""
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
        events_table(events, table_id="deployment-events")
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
        + (placements_html(placements) if placements is not None else "")
        + "<h2>Revisions</h2>"
        "<table class=grid id=revisions><table class=grid id=revisions><thead><tr><th>revision</th>"
        "<th>model</th><th></th><th>devices serving its version</th><th>ready</th>"
        f"<th>created</th></tr></thead><tbody>{revs}</tbody></table>"
        f"<h2>Events</h2>{events_html}"
        f"<h2>Over time</h2>{history_html(series or {}, thresholds or {})}"
    )


def placements_html(p: DeploymentPlacements) -> str:
    """``Placements``, as ``edgectl describe deployment`` lists them: each device holding the
    deployment's replicas (the first :data:`MAX_LISTED`, then how many more), with the
    revision it is sent, replicas ready of those asked, the phase there and why; then, for a
    ``replicas.total`` deployment, why the scheduler left devices out (the reasons of its
    last pass, the first :data:`MAX_REASONS`, then how many more)."""
    rows = "".join(
        f'<tr><td><a href="/devices/{esc(seg(x.device))}">{esc(x.device)}</a></td>'
        f"<td>{esc(f'{x.revision} ({x.version})' if x.revision else '<none>')}</td>"
        f"<td class=num>{esc(x.ready)}/{esc(x.replicas)}</td>"
        f"<td class={_placement_class(x.phase)}>{esc(x.phase)}</td>"
        f"<td>{esc(x.device_phase)}</td><td>{esc(x.reason)}</td></tr>"
        for x in p.shown
    )
    more = (
        f"<p class=muted id=placements-more>and {p.more} more: <code>edgectl get placements "
        f"--for deployment/{esc(p.deployment)}</code></p>"
        if p.more > 0
        else ""
    )
    placed = (
        f"<p class=muted>{p.placed} devices sent it, {p.total - p.placed} leaving</p>"
        "<table class=grid id=placements><thead><tr><th>device</th><th>revision</th>"
        "<th>ready</th><th>phase</th><th>device status</th><th>reason</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{more}"
        if p.total
        else "<p class=muted id=placements>&lt;none&gt;</p>"
    )
    return f"<h2>Placements</h2>{placed}<h2>Devices left out</h2>{left_out_html(p)}"


def left_out_html(p: DeploymentPlacements) -> str:
    """Why devices were left out: the scheduler's explanation of a ``replicas.total``
    deployment, its reasons (devices left out by each filter, each device counted once) and
    notes, at most :data:`MAX_REASONS` of each."""
    if not p.scheduled:
        return (
            "<p class=muted id=left-out>replicas.perDevice: every device its selector and "
            "regions match is sent it (the scheduler places replicas.total only)</p>"
        )
    ex = p.explanation
    if ex is None:
        return "<p class=muted id=left-out>the scheduler has not placed it yet</p>"
    left = sum(n for _, n in ex.reasons)
    head = f"{ex.placed}/{ex.wanted} replicas placed"
    if not ex.complete:
        head += f"; {ex.devices - left}/{ex.devices} devices fit"
    rows = "".join(
        f"<tr><td>{esc(why)}</td><td class=num>{esc(n)}</td></tr>"
        for why, n in ex.reasons[:MAX_REASONS]
    )
    hidden = ex.reasons[MAX_REASONS:]
    more = (
        f"<p class=muted id=left-out-more>and {len(hidden)} more reasons "
        f"({sum(n for _, n in hidden)} devices)</p>"
        if hidden
        else ""
    )
    table = (
        "<table class=grid id=left-out-reasons><thead><tr><th>why left out</th><th>devices</th>"
        f"</tr></thead><tbody>{rows}</tbody></table>{more}"
        if rows
        else ""
    )
    notes = "".join(f"<li>{esc(n)}</li>" for n in ex.notes[:MAX_REASONS])
    if len(ex.notes) > MAX_REASONS:
        notes += f"<li class=muted>and {len(ex.notes) - MAX_REASONS} more</li>"
    return f"<p id=left-out class={'ok' if ex.complete else 'warn'}>{esc(head)}</p>{table}" + (
        f"<ul id=left-out-notes>{notes}</ul>" if notes else ""
    )


def _placement_class(phase: str) -> str:
    return {"Ready": "ok", "Failed": "bad", "Refused": "bad", "Leaving": "muted"}.get(phase, "")


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
            if is_number(v):
                lines[side].append((s.at, float(v) * scale))  # type: ignore[arg-type]
        limit = s.limits.get(figure)
        if limit is not None and is_number(limit):
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
