"""``edgectl rollout status|history|pause|resume|promote|abort|restart|undo NAME``: a
deployment's rollout (Argo Rollouts' verbs), or an
AgentUpgrade's as ``agentupgrade/NAME`` (``au/NAME``; ``deployment/NAME`` is a deployment).

* ``status NAME [--watch] [--timeout D]``: the revision being rolled out and the stable one,
  the phase, the canary's current step and its analysis figures against their thresholds,
  a progress bar of the targeted devices (updated / ready / available), the devices skipped
  and failing with their reasons. With ``--watch`` it prints every change
  until the rollout ends: exit 0 when it is Complete, 1 when it was rolled back (the reason is
  printed), 1 as well when ``--timeout`` passes first. Without ``--watch``: the current view,
  exit 1 only when the rollout was rolled back. At a root hub, a deployment rolled out in
  waves (``spec.rollout.waves``) shows the waves instead: each wave with its state, its
  regions, what each is sent (the new or the stable revision) and its figures.
* ``history NAME``: the revisions kept, oldest first (the stable and the current one marked).
* ``pause NAME`` / ``resume NAME`` (after a rollback or an abort: roll the same revision out
  again), ``undo NAME [--to-revision N]`` (default: the stable revision, or the one before it).
* ``promote NAME [--full]``: past the canary pause the rollout is at (and the pauses right
  after it); ``--full``: past every remaining step, the analysis no longer rolling it back.
  ``abort NAME``: every device back on the stable revision until the deployment changes.
  ``restart NAME``: the Complete revision rolled out again with new workers, as a new
  revision of the same template (hub.decide.rolloutactions). Each is an event naming the
  admin who acted. For an AgentUpgrade these three are refused (not supported yet).

An AgentUpgrade's ``status`` shows its phase, canary step, the devices done, updating,
waiting, failed (each with its reason), refused and sent back; ``history`` its revisions
(version and commit settings); ``resume`` after a rollback retries the same version as a new
revision; ``undo`` applies the version of the revision before (or ``--to-revision N``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import orjson

from edgectl.client import AdminClient, load_admin_config
from edgectl.errors import EXIT_REFUSED, UsageError
from edgectl.resources import kind_of
from edgefleet.api.deployments import RESTARTED_AT
from edgefleet.configfiles import duration_option
from edgefleet.v1 import admin_pb2

BAR = 30
POLL_S = 0.5


def add_commands(sub: Any) -> None:
    rollout = sub.add_parser(
        "rollout", help="a deployment's (or agentupgrade/NAME's) rollout: status, history, undo..."
    )
    actions = rollout.add_subparsers(dest="rollout_cmd", required=True)
    status = actions.add_parser("status", help="where the rollout stands")
    status.add_argument("name")
    status.add_argument(
        "-w", "--watch", action="store_true", help="print every change until it ends"
    )
    status.add_argument(
        "--timeout",
        type=duration_option,
        default=None,
        help="with --watch: give up (exit 1) after this long, e.g. 10m",
    )
    history = actions.add_parser("history", help="the revisions kept")
    history.add_argument("name")
    for verb, text in (
        ("pause", "assign no more devices"),
        ("resume", "go on after a pause; after a rollback, retry the same revision"),
    ):
        p = actions.add_parser(verb, help=text)
        p.add_argument("name")
    promote = actions.add_parser(
        "promote", help="go past the canary pause the rollout is at (--full: every step)"
    )
    promote.add_argument("name")
    promote.add_argument(
        "--full",
        action="store_true",
        help="skip every remaining canary step; the analysis no longer rolls it back",
    )
    for verb, text in (
        ("abort", "back to the stable revision until the deployment changes (resume retries)"),
        ("restart", "roll the revision out again with new workers (a new revision)"),
    ):
        actions.add_parser(verb, help=text).add_argument("name")
    undo = actions.add_parser("undo", help="go back to an older revision (a new rollout)")
    undo.add_argument("name")
    undo.add_argument("--to-revision", type=int, default=0, metavar="N")


def run(args: argparse.Namespace) -> int | None:
    """Run a parsed ``rollout`` command (None when ``args`` is another command); errors are
    raised as edgectl's (:mod:`edgectl.errors`), printed as one ``error: ...`` line."""
    if args.command != "rollout":
        return None
    from edgectl.commands import default_config

    config = load_admin_config(args.config or default_config(), getattr(args, "context", None))
    try:
        with AdminClient(config) as client:
            return _run(client, args)
    except KeyboardInterrupt:
        return 0


UPGRADE = "AgentUpgrade"


def target_of(text: str) -> tuple[str, str]:
    """``NAME`` (a deployment), ``deployment/NAME`` or ``agentupgrade/NAME``: (kind, name)."""
    kind_text, slash, name = text.partition("/")
    if not slash:
        return "ModelDeployment", text
    return kind_of(kind_text, allow=("ModelDeployment", UPGRADE)), name


def _run(client: AdminClient, args: argparse.Namespace) -> int:
    cmd = args.rollout_cmd
    kind, name = target_of(args.name)
    if cmd == "status":
        return _status(client, kind, name, watch=args.watch, timeout=args.timeout)
    if cmd == "history":
        return _history(client, kind, name)
    if cmd == "undo":
        return _act(client, kind, name, admin_pb2.RolloutActionRequest.UNDO, args.to_revision)
    if kind == UPGRADE and cmd in ("promote", "abort", "restart"):
        raise UsageError(
            f"rollout {cmd} is not supported yet for an AgentUpgrade (agentupgrade/{name}): "
            "pause, resume and undo are"
        )
    action = {
        "pause": admin_pb2.RolloutActionRequest.PAUSE,
        "resume": admin_pb2.RolloutActionRequest.RESUME,
        "promote": admin_pb2.RolloutActionRequest.PROMOTE,
        "abort": admin_pb2.RolloutActionRequest.ABORT,
        "restart": admin_pb2.RolloutActionRequest.RESTART,
    }[cmd]
    return _act(client, kind, name, action, 0, full=getattr(args, "full", False))


def _act(
    client: AdminClient, kind: str, name: str, action: Any, to: int, *, full: bool = False
) -> int:
    request = admin_pb2.RolloutActionRequest(
        name=name, action=action, to_revision=to, kind="" if kind != UPGRADE else kind, full=full
    )
    response = client.call("RolloutAction", request)
    print(response.message)
    return 0


def _upgrade_history(client: AdminClient, name: str) -> int:
    request = admin_pb2.ListRevisionsRequest(name=name, kind=UPGRADE)
    response = client.call("ListRevisions", request)
    rollout = orjson.loads(response.rollout)
    rows = [("REVISION", "VERSION", "COMMIT-DEADLINE", "MAX-TRIES", "CREATED", "NOTE")]
    for raw in response.revisions:
        rev = orjson.loads(raw)
        notes = []
        if rev["number"] == rollout["revision"]:
            notes.append(rollout["phase"].lower())
        elif rev.get("outcome"):  # a root's upgrade in waves keeps each revision's outcome
            notes.append(str(rev["outcome"]))
        if rev.get("source"):
            notes.append(f"copy of {rev['source']}")
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rev["createdAt"]))
        rows.append(
            (
                str(rev["number"]),
                rev["version"],
                f"{rev['deadlineSeconds']}s",
                str(rev["maxTries"]),
                created,
                ", ".join(notes),
            )
        )
    print(_table(rows))
    return 0


def _history(client: AdminClient, kind: str, name: str) -> int:
    if kind == UPGRADE:
        return _upgrade_history(client, name)
    response = client.call("ListRevisions", admin_pb2.ListRevisionsRequest(name=name))
    rollout = orjson.loads(response.rollout)
    rows = [("REVISION", "MODEL", "VERSION", "CREATED", "OUTCOME", "NOTE")]
    restarted = ""
    why: list[str] = []
    for raw in response.revisions:
        rev = orjson.loads(raw)
        model = rev["manifest"]["spec"]["model"]
        notes = []
        if rev["number"] == rollout["stable"]:
            notes.append("stable")
        if rev["number"] == rollout["revision"] and rollout["revision"] != rollout["stable"]:
            notes.append("current")
        if rev.get("source"):
            notes.append(f"copy of {rev['source']}")
        at = (rev["manifest"].get("metadata", {}).get("annotations") or {}).get(RESTARTED_AT, "")
        if at and at != restarted and len(rows) > 1:
            notes.append(f"restarted {at}")
        restarted = at
        outcome = _outcome_of(rollout, rev["number"])
        text = ""
        if outcome is not None:
            text = _outcome_text(outcome)
            if outcome["phase"] in ("RolledBack", "Aborted") and outcome.get("message"):
                why.append(f"revision {rev['number']}: {outcome['message']}")
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rev["createdAt"]))
        rows.append(
            (str(rev["number"]), model["name"], model["version"], created, text, ", ".join(notes))
        )
    print(_table(rows))
    for line in why:
        print(line)
    return 0


def _outcome_text(outcome: dict[str, Any]) -> str:
    """``complete``, ``rolled back (RevisionFailed)``, ``aborted (Superseded)``..."""
    phase, reason = str(outcome["phase"]), str(outcome.get("reason", ""))
    if phase == "RolledBack" and reason == "Aborted":  # rollout abort
        return "aborted"
    text = {"RolledBack": "rolled back"}.get(phase, phase.lower())
    if phase not in ("Complete", "Progressing") and reason:
        text += f" ({reason})"
    return text


def _outcome_of(rollout: dict[str, Any], number: int) -> dict[str, Any] | None:
    """How revision ``number``'s rollout stands (the current one) or ended (an earlier one,
    ``outcomes`` of the rollout record; None: not known)."""
    if number == rollout["revision"]:
        return {
            "phase": rollout["phase"],
            "reason": rollout.get("reason", ""),
            "message": rollout.get("message", ""),
        }
    found: dict[str, Any] | None = (rollout.get("outcomes") or {}).get(str(number))
    return found


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def render(doc: dict[str, Any]) -> tuple[str, str]:
    """A deployment's rollout for a person, and its phase ("" when it has none)."""
    status = doc.get("status", {})
    rollout = status.get("rollout")
    name = doc["metadata"]["name"]
    if rollout is None:
        return f"{name}: no revision yet", ""
    if rollout.get("waves"):  # a root hub's rollout across its regions
        return _waves(name, rollout["waves"]), rollout["waves"]["phase"]
    version = doc["spec"]["model"]["version"]
    lines = [
        f"{name}: revision {rollout['revision']} ({version}), stable revision "
        f"{rollout['stableRevision']}: {rollout['phase']}"
        + (f" ({rollout['reason']})" if rollout.get("reason") else ""),
        f"  {rollout['message']}" if rollout.get("message") else "",
    ]
    lines += [  # a root's regions not done with this revision (hub.decide.regionrollout)
        f"  region {r}: {why}" for r, why in sorted(rollout.get("notCounted", {}).items())
    ]
    lines += _canary_lines(rollout)
    targeted = rollout.get("targetedDevices", status.get("desiredDevices", 0))
    for label, count in (
        ("updated", status.get("updatedDevices", 0)),
        ("ready", status.get("readyDevices", 0)),
        ("available", status.get("availableDevices", 0)),
    ):
        lines.append(f"  {label:<9} {_bar(count, targeted)} {count}/{targeted}")
    if rollout["phase"] in ("Progressing", "Paused"):
        lines.append(
            f"  updating {rollout.get('updatingDevices', 0)}, unavailable "
            f"{rollout.get('unavailableDevices', 0)} (at most maxSurge {rollout.get('maxSurge')} "
            f"+ maxUnavailable {rollout.get('maxUnavailable')} at once)"
        )
    lines += [
        f"  held {d} on revision {n} (switches within the budget)"
        for d, n in sorted(rollout.get("heldDevices", {}).items())
    ]
    lines += [f"  returning {d}" for d in rollout.get("returningDevices", [])]
    lines += [f"  skipped {d}: {why}" for d, why in sorted(rollout.get("skipped", {}).items())]
    lines += [f"  failing {d}: {why}" for d, why in sorted(status.get("failing", {}).items())]
    return "\n".join(line for line in lines if line), rollout["phase"]


def render_upgrade(doc: dict[str, Any]) -> tuple[str, str]:
    """An AgentUpgrade's rollout for a person, and its phase."""
    status = doc.get("status", {})
    name = doc["metadata"]["name"]
    phase = str(status.get("phase", ""))
    if "revision" not in status:
        return f"agentupgrade/{name}: no revision yet", ""
    lines = [
        f"agentupgrade/{name}: edged {status['version']} (revision {status['revision']}): "
        f"{phase}" + (f" ({status['reason']})" if status.get("reason") else ""),
        f"  {status['message']}" if status.get("message") else "",
    ]
    if "waveCount" in status:  # at a root hub, across its regions in waves
        lines += _upgrade_waves(status)
        return "\n".join(line for line in lines if line), phase
    if status.get("stepCount"):
        lines.append(
            f"  canary: past its {status['stepCount']} steps, every device"
            if status.get("pastLastStep")
            else f"  canary step {status['step']} of {status['stepCount']}: "
            f"{status['steps'][status['step'] - 1]} ({status.get('stepDevices', 0)} devices)"
        )
    pool = status.get("poolDevices", 0)
    lines.append(
        f"  done      {_bar(status.get('doneDevices', 0), pool)} "
        f"{status.get('doneDevices', 0)}/{pool}"
    )
    lines.append(
        f"  updating {status.get('updatingDevices', 0)} (at most maxUnavailable "
        f"{status.get('maxUnavailable')}), waiting {status.get('waitingDevices', 0)}, up to "
        f"date {status.get('upToDateDevices', 0)}, failure threshold "
        f"{status.get('failureThreshold')}"
    )
    lines += [f"  failed {d}: {why}" for d, why in sorted(status.get("failedDevices", {}).items())]
    lines += [f"  sent back {d}: {v}" for d, v in sorted(status.get("rollbackDevices", {}).items())]
    lines += [f"  held {d} at {v}" for d, v in sorted(status.get("heldDevices", {}).items())]
    lines += [
        f"  cannot send back {d}: {why}"
        for d, why in sorted(status.get("rollbackBlocked", {}).items())
    ]
    lines += [f"  refused {d}: {why}" for d, why in sorted(status.get("refused", {}).items())]
    lines += [f"  skipped {d}: {why}" for d, why in sorted(status.get("skipped", {}).items())]
    return "\n".join(line for line in lines if line), phase


def _waves(name: str, waves: dict[str, Any]) -> str:
    """A rollout in waves at a root hub: each wave, its regions, state and figures."""
    lines = [
        f"{name}: revision {waves['revision']} ({waves['version']}) across regions, stable "
        f"revision {waves['stableRevision']} ({waves['stableVersion']}): {waves['phase']}"
        + (f" ({waves['reason']})" if waves.get("reason") else ""),
        f"  {waves['message']}" if waves.get("message") else "",
    ]
    lines += [
        f"  condition {c['type']}={c['status']} ({c['reason']})"
        for c in waves.get("conditions", [])
        if c["status"] != "True"
    ]
    for row in waves["waves"]:
        if "pause" in row:
            what = "pause " + (row["pause"].get("duration") or "until rollout resume")
        elif "percent" in row:
            what = f"{row['percent']}% of the devices of " + (", ".join(row["regions"]) or "-")
        elif row.get("rest"):
            what = "the remaining regions " + (", ".join(row["regions"]) or "(none)")
        else:
            what = "regions " + ", ".join(row["regions"])
        label = "then" if row.get("rest") else f"wave {row['wave']}"
        lines.append(f"  {label} [{row['state']}]: {what}")
        for region, fig in row["regions"].items():
            desired = fig.get("desiredDevices")
            figures = (
                f"updated {fig['updatedDevices']}/{desired}, ready {fig['readyDevices']}, "
                f"available {fig['availableDevices']}, rollout "
                f"{fig.get('rollout', {}).get('phase') or '-'}"
                if desired is not None
                else "not reported yet"
            )
            reach = "" if fig.get("connected") else ", unreachable"
            if not fig.get("connected") and fig.get("reportAgeSeconds") is not None:
                reach += f" (last report {fig['reportAgeSeconds']:g} s ago)"
            lines.append(f"    {region:<16} sent {fig['sent']:<6} {figures}{reach}")
            lines += [f"      failing {d}: {why}" for d, why in fig.get("failing", {}).items()]
    analysis = waves.get("analysis")
    if analysis is not None and waves["phase"] in ("Progressing", "Paused"):
        lines.append(
            f"  analysis across regions over {analysis['windowSeconds']:g}s: {analysis['verdict']}"
        )
        for check in analysis["checks"]:
            lines.append(f"    {check['name']:<11} {check['verdict']:<5} {check['message']}")
    for h in waves.get("history", []):
        if h.get("outcome") == "Failed":
            lines.append(f"  wave {h['wave']} failed: {h['message']}")
    return "\n".join(line for line in lines if line)


def _canary_lines(rollout: dict[str, Any]) -> list[str]:
    """The canary's current step and the analysis figures against their thresholds."""
    canary = rollout.get("canary")
    if not canary:
        return []
    if canary.get("pastLastStep"):
        where = f"  canary: past its {canary['stepCount']} steps, the rest of the devices follow"
    else:
        step = canary["steps"][canary["step"] - 1]
        what = (
            f"{canary['weight']}% ({canary['weightDevices']} devices)"
            if isinstance(step, str)
            else "pause " + (step["pause"].get("duration") or "until rollout resume")
        )
        where = f"  canary step {canary['step']} of {canary['stepCount']}: {what}"
    lines = [where]
    analysis = canary.get("analysis")
    if analysis is not None and rollout["phase"] in ("Progressing", "Paused"):
        lines.append(
            f"  analysis over {analysis['windowSeconds']:g}s: {analysis['verdict']}"
            + (" (waiting for the window)" if analysis["verdict"] == "Pass" else "")
        )
        for check in analysis["checks"]:
            lines.append(f"    {check['name']:<11} {check['verdict']:<5} {check['message']}")
        for side in ("canary", "stable"):  # impossible figures (docs/rollouts.md)
            for device, why in (analysis.get(side, {}).get("excluded") or {}).items():
                lines.append(f"    left out    {device} ({side}): {why}")
    return lines


def _bar(count: int, total: int) -> str:
    filled = round(BAR * count / total) if total else 0
    return "[" + "#" * filled + "." * (BAR - filled) + "]"


def _upgrade_waves(status: dict[str, Any]) -> list[str]:
    """An AgentUpgrade's waves across regions: each wave, each region's figures."""
    lines = [f"  wave {status['wave']} of {status['waveCount']}"]
    for row in status.get("waves", []):
        lines.append(f"  {row['text']}:")
        for region, f in sorted(row.get("regions", {}).items()):
            if not f.get("sent"):
                lines.append(f"    {region}: not sent yet")
                continue
            where = f.get("phase") or "not reported"
            reach = "" if f.get("connected") else ", unreachable"
            lines.append(
                f"    {region}: {where}, {f.get('done', 0)}/{f.get('pool', 0)} done, "
                f"{f.get('updating', 0)} updating, {len(f.get('failed', {}))} failed{reach}"
            )
            lines += [f"      failed {d}: {why}" for d, why in sorted(f.get("failed", {}).items())]
    if status.get("failedRegion"):
        lines.append(f"  stopped by region {status['failedRegion']}")
        lines += [
            f"    failed {d}: {why}" for d, why in sorted(status.get("failedDevices", {}).items())
        ]
    return lines


def _status(
    client: AdminClient, kind: str, name: str, *, watch: bool, timeout: float | None
) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    last = ""
    while True:
        doc = client.get(kind, name)
        text, phase = render_upgrade(doc) if kind == UPGRADE else render(doc)
        if text != last:
            print(text, flush=True)
            last = text
        if phase == "RolledBack":
            if kind == UPGRADE:
                rollout = doc["status"]
            else:
                rollout = doc["status"]["rollout"]
                rollout = rollout.get("waves") or rollout
            print(
                f"rollout of {name} failed: rolled back ({rollout.get('reason', '')}): "
                f"{rollout.get('message', '')}",
                file=sys.stderr,
            )
            return EXIT_REFUSED
        if not watch or phase == "Complete":
            return 0
        if deadline is not None and time.monotonic() > deadline:
            print(f"rollout of {name} not finished after {timeout:g}s", file=sys.stderr)
            return EXIT_REFUSED
        time.sleep(POLL_S)
