"""How edgectl shows objects to a person: kubectl-like tables, ``-o name|json|yaml|jsonpath``,
and ``describe`` pages. Pure functions of the JSON documents the hub returns (and ``now``,
for ages). Times in documents are RFC 3339 strings (older hubs: epoch seconds; both read)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
import yaml

from edgectl import jsonpath
from edgefleet.deploymentstatus import serving_model
from edgefleet.devicestatus import termination_text
from edgefleet.timestamps import epoch_of

Row = list[str]
Doc = Mapping[str, Any]


def age(since: object, now: float) -> str:
    """``45s``, ``12m``, ``3h``, ``5d`` since an RFC 3339 time (or epoch seconds);
    ``<unknown>`` without a time."""
    seconds_since = epoch_of(since)
    if seconds_since is None:
        return "<unknown>"
    s = max(0, int(now - seconds_since))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def table(header: Sequence[str], rows: Sequence[Row]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip()
             for r in (list(header), *rows)]  # fmt: skip
    return "\n".join(lines)


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>"


def selector_text(placement: Mapping[str, Any]) -> str:
    """A deployment's ``spec.placement`` selector as ``-l`` writes one: ``site=retail``,
    ``tier in (a,b)``, ``tier notin (x)``, ``npu`` (Exists), ``!npu`` (DoesNotExist);
    ``<none>`` when it selects every device."""
    parts = [f"{k}={v}" for k, v in sorted(placement.get("nodeSelector", {}).items())]
    for e in placement.get("matchExpressions", []):
        key, op = str(e.get("key", "")), str(e.get("operator", ""))
        values = ",".join(str(v) for v in e.get("values", []))
        if op in ("In", "NotIn"):
            parts.append(f"{key} {op.lower()} ({values})")
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            parts.append(key)
    return ",".join(parts) or "<none>"


def _name(doc: Doc) -> str:
    return str(doc.get("metadata", {}).get("name", ""))


# -- rows per kind -------------------------------------------------------------------------------


def _device_status(doc: Doc) -> str:
    status = doc.get("status", {})
    parts = [status.get("phase", "Unknown")]
    if doc.get("spec", {}).get("cordoned"):
        parts.append("SchedulingDisabled")
    if status.get("revoked"):
        parts.append("Revoked")
    return ",".join(parts)


def _agent(status: Doc) -> str:
    """The AGENT column: edged's version, ``(refused)`` when outside the hub's window."""
    version = str(status.get("agentVersion") or "<unknown>")
    return f"{version}(refused)" if status.get("agentRefused") else version


def _device_row(doc: Doc, now: float, wide: bool) -> Row:
    status = doc.get("status", {})
    health = status.get("health", {})
    row = [
        _name(doc),
        str(status.get("region") or "<none>"),
        _device_status(doc),
        "ok" if health.get("schedulable", True) else ";".join(health.get("reasons", [])),
        str(status.get("attestation", {}).get("state", "Unknown")),
        str(len(status.get("deployments", []))),
        age(status.get("lastHeartbeat"), now),
    ]
    if wide:
        taints = [f"{t['key']}:{t['effect']}" for t in status.get("taints", [])]
        downloads = [f"{name}:{percent}" for name, _, percent, _ in downloads_of(status)]
        row += [
            _agent(status),
            f"{status.get('generationAcked', 0)}/{status.get('generationDesired', 0)}",
            _labels(doc.get("metadata", {}).get("labels", {})),
            ",".join(taints) or "<none>",
            ",".join(downloads) or "<none>",
        ]
    return row


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def downloads_of(status: Doc) -> list[tuple[str, str, str, str]]:
    """(workload, version, percent, "done of total") of every revision a device is
    downloading, from its reported workloads."""
    out = []
    for name, w in sorted(status.get("workloads", {}).items()):
        for r in w.get("revisions", []):
            d = r.get("download") or {}
            total = int(d.get("bytesTotal", 0))
            if r.get("phase") == "Downloading" and total:
                done = int(d.get("bytesDone", 0))
                out.append(
                    (
                        name,
                        str(r.get("modelVersion", "")),
                        f"{100 * done // total}%",
                        f"{_mib(done)} of {_mib(total)}",
                    )
                )
    return out


def _deployment_row(doc: Doc, now: float, wide: bool) -> Row:
    spec, status = doc.get("spec", {}), doc.get("status", {})
    regions = status.get("regions")
    row = [
        _name(doc),
        ",".join(regions) if regions else str(status.get("region") or "<none>"),
        serving_model(doc),
        str(status.get("desiredDevices", 0)),
        str(status.get("updatedDevices", 0)),
        str(status.get("readyDevices", 0)),
        str(status.get("availableDevices", 0)),
    ]
    if wide:
        placement = spec.get("placement", {})
        replicas = spec.get("replicas", {})
        per = replicas.get("perDevice")
        row += [
            f"{per}/device" if per is not None else f"{replicas.get('total')} total",
            selector_text(placement),
            ",".join(placement.get("regions", [])) or "<any>",
        ]
    return row


def _model_row(doc: Doc, now: float, wide: bool) -> Row:
    spec, status = doc.get("spec", {}), doc.get("status", {})
    row = [
        str(spec.get("name")),
        str(spec.get("version")),
        str(status.get("sha256", ""))[: 64 if wide else 12],
        str(status.get("length", "")),
        age(status.get("pushedAt"), now),
    ]
    return row


def _baseline_row(doc: Doc, now: float, wide: bool) -> Row:
    spec = doc.get("spec", {})
    devices = doc.get("status", {}).get("devices", {})
    row = [
        _name(doc),
        str(devices.get("compliant", 0)),
        str(devices.get("drifted", 0)),
        str(devices.get("unknown", 0)),
        str(spec.get("drift", {}).get("action", "alert")),
        str(spec.get("requireAttestation", False)).lower(),
    ]
    if wide:
        kinds = doc.get("status", {}).get("findingKinds", {})
        row += [
            str(devices.get("quarantined", 0)),
            ",".join(f"{k}={n}" for k, n in sorted(kinds.items())) or "<none>",
            str(len(spec.get("allowedCodeDigests", []))),
            str(len(spec.get("allowedConfigDigests", []))),
            str(len(spec.get("allowedModelDigests", []))),
        ]
    return row


def _secret_row(doc: Doc, now: float, wide: bool) -> Row:
    status = doc.get("status", {})  # names, keys and a version: the hub never shows a value
    spec = doc.get("spec", {})
    row = [
        _name(doc),
        ",".join(str(k) for k in status.get("keys", spec.get("keys", []))),
        str(status.get("version", "")),
        str(status.get("bytes", "")),
    ]
    if wide:
        row.append("true" if spec.get("requireTpm") is True else "false")
    return row


def _priority_class_row(doc: Doc, now: float, wide: bool) -> Row:
    spec = doc.get("spec", {})
    return [
        _name(doc),
        str(spec.get("value", 0)),
        str(spec.get("preemptionPolicy", "")),
        str(spec.get("description", "")),
    ]


def _model_config_row(doc: Doc, now: float, wide: bool) -> Row:
    spec = doc.get("spec", {})
    overrides = spec.get("overrides", [])
    row = [
        _name(doc),
        str(spec.get("model", "")),
        str(len(spec.get("data", {}))),
        str(len(spec.get("files", {}))),
        str(len(overrides)),
    ]
    if wide:
        row.append(
            ",".join(
                "devices" if "devices" in o else ",".join(o.get("selector", {})) for o in overrides
            )
            or "<none>"
        )
    return row


def _agent_upgrade_row(doc: Doc, now: float, wide: bool) -> Row:
    spec, status = doc.get("spec", {}), doc.get("status", {})
    pool = status.get("poolDevices", 0)
    steps = status.get("stepCount", 0)
    waves = status.get("waveCount", 0)  # at a root hub, in waves: the regions' figures summed
    step = (
        upgrade_wave_text(status)
        if waves
        else "-"
        if not steps
        else "all"
        if status.get("pastLastStep")
        else (f"{status.get('step')}/{steps}")
    )
    failed = max(len(status.get("failedDevices", {})), int(status.get("failedCount", 0) or 0))
    row = [
        _name(doc),
        str(spec.get("version", "")),
        str(status.get("phase", "<none>")),
        f"{status.get('doneDevices', 0)}/{pool}",
        str(status.get("updatingDevices", 0)),
        str(failed),
        step,
    ]
    if wide:
        selector = spec.get("selector", {})
        shown = [f"{k}={v}" for k, v in sorted(selector.get("matchLabels", {}).items())]
        shown += [str(e.get("key")) for e in selector.get("matchExpressions", [])]
        row += [
            ",".join(shown) or "<all>",
            str(status.get("revision", "<none>")),
            str(len(status.get("refused", {}))),
        ]
    return row


def upgrade_wave_text(status: Doc) -> str:
    """An AgentUpgrade in waves, where it stands: ``wave 2/3 (eu,us)``, the regions of the
    current wave sent the upgrade (the last wave: the regions no wave names)."""
    count = int(status.get("waveCount", 0) or 0)
    wave = int(status.get("wave", 0) or 0)
    where = "rest" if wave > count else f"{wave}/{count}"
    regions: list[str] = []
    for row in status.get("waves", []) or []:
        if isinstance(row, dict) and row.get("wave") == wave:
            shown = row.get("regions") or {}
            regions = [r for r, v in sorted(shown.items()) if isinstance(v, dict) and v.get("sent")]
    more = f" ({','.join(regions[:3])}{',...' if len(regions) > 3 else ''})" if regions else ""
    return f"wave {where}{more}"


def _token_row(doc: Doc, now: float, wide: bool) -> Row:
    spec, status = doc.get("spec", {}), doc.get("status", {})
    expires = epoch_of(spec.get("expires"))
    left = "<expired>" if expires is not None and expires <= now else age(now, expires or now)
    usage = "single-use" if spec.get("singleUse") else "reusable"
    if status.get("used"):
        usage += ",used"
    return [
        _name(doc),
        left,
        usage,
        str(spec.get("description", "")) or "<none>",
        _labels(spec.get("deviceLabels", {})),
    ]


def _expires_in(when: object, now: float) -> str:
    """``364d``, ``<expired>``, ``<unknown>``: the time left until ``when``."""
    at = epoch_of(when)
    if at is None:
        return "<unknown>"
    return "<expired>" if at <= now else age(now, at)


def _region_devices(status: Doc) -> str:
    devices = status.get("devices")
    if not devices:
        return "<none>"
    return f"{devices.get('ready', 0)}/{devices.get('total', 0)}"


def _region_row(doc: Doc, now: float, wide: bool) -> Row:
    status = doc.get("status", {})
    deployments = status.get("deployments")
    row = [
        _name(doc),
        "true" if status.get("connected") else "false",
        age(status.get("reportedAt"), now) if status.get("reportedAt") else "<none>",
        _region_devices(status),
        "<none>" if deployments is None else str(deployments),
    ]
    if wide:
        applied = status.get("generationApplied")
        row += [
            str(status.get("replica") or "<none>"),
            _expires_in(status.get("certificate", {}).get("notAfter"), now),
            "<unknown>" if applied is None else str(applied),
        ]
    return row


def _placement_row(doc: Doc, now: float, wide: bool) -> Row:
    spec, status = doc.get("spec", {}), doc.get("status", {})
    row = [
        str(spec.get("deployment", "")),
        str(spec.get("device", "")),
        str(status.get("revision") or "<none>"),
        str(status.get("version") or "<none>"),
        f"{status.get('readyReplicas', 0)}/{status.get('replicas', 0)}",
        str(status.get("phase", "")),
        str(status.get("devicePhase", "")),
    ]
    if wide:
        row += [",".join(status.get("serving", [])) or "<none>", str(status.get("reason", ""))]
    return row


def _generic_row(doc: Doc, now: float, wide: bool) -> Row:
    return [_name(doc), _labels(doc.get("metadata", {}).get("labels", {}))]


Columns = tuple[Sequence[str], Sequence[str], Callable[[Doc, float, bool], Row]]
COLUMNS: dict[str, Columns] = {
    "Device": (
        ("NAME", "REGION", "STATUS", "HEALTH", "ATTESTATION", "DEPLOYMENTS", "LAST-HEARTBEAT"),
        ("AGENT", "GENERATION", "LABELS", "TAINTS", "DOWNLOADS"),
        _device_row,
    ),
    "ModelDeployment": (
        ("NAME", "REGION", "MODEL", "DESIRED", "UP-TO-DATE", "READY", "AVAILABLE"),
        ("REPLICAS", "SELECTOR", "REGIONS"),
        _deployment_row,
    ),
    "Model": (("NAME", "VERSION", "SHA256", "BYTES", "PUSHED"), (), _model_row),
    "SecurityBaseline": (
        ("NAME", "COMPLIANT", "DRIFTED", "UNKNOWN", "DRIFT-ACTION", "REQUIRE-ATTESTATION"),
        ("QUARANTINED", "FINDINGS", "CODE-DIGESTS", "CONFIG-DIGESTS", "MODEL-DIGESTS"),
        _baseline_row,
    ),
    "Secret": (("NAME", "KEYS", "VERSION", "BYTES"), ("REQUIRE-TPM",), _secret_row),
    "PriorityClass": (
        ("NAME", "VALUE", "PREEMPTION-POLICY", "DESCRIPTION"),
        (),
        _priority_class_row,
    ),
    "AgentUpgrade": (
        ("NAME", "VERSION", "PHASE", "DONE", "UPDATING", "FAILED", "STEP"),
        ("SELECTOR", "REVISION", "REFUSED"),
        _agent_upgrade_row,
    ),
    "ModelConfig": (
        ("NAME", "MODEL", "KEYS", "FILES", "OVERRIDES"),
        ("OVERRIDDEN-BY",),
        _model_config_row,
    ),
    "BootstrapToken": (
        ("NAME", "EXPIRES-IN", "USAGE", "DESCRIPTION", "DEVICE-LABELS"),
        (),
        _token_row,
    ),
    "Placement": (
        ("DEPLOYMENT", "DEVICE", "REVISION", "VERSION", "READY", "PHASE", "DEVICE-STATUS"),
        ("SERVING", "REASON"),
        _placement_row,
    ),
    "Region": (
        ("NAME", "CONNECTED", "LAST-REPORT", "DEVICES", "DEPLOYMENTS"),
        ("REPLICA", "CERT-EXPIRES-IN", "GENERATION"),
        _region_row,
    ),
}
_GENERIC: Columns = (("NAME", "LABELS"), (), _generic_row)


UNAGED = ("Model", "Region", "Placement")
"""Kinds without an AGE column: a model's PUSHED is its age; a region is its last report; a
placement is computed when shown."""


def header_of(kind: str, *, wide: bool) -> list[str]:
    base, extra, _ = COLUMNS.get(kind, _GENERIC)
    aged = ("AGE",) if kind not in UNAGED else ()
    return [*base, *aged, *(extra if wide else ())]


def rows_of(kind: str, docs: Sequence[Doc], *, now: float, wide: bool) -> list[Row]:
    """Each object's row: its kind's columns, then AGE (kubectl's: since
    ``metadata.creationTimestamp``), then the wide columns."""
    base, _, row = COLUMNS.get(kind, _GENERIC)
    rows = [row(d, now, wide) for d in docs]
    if kind in UNAGED:
        return rows
    n = len(base)
    return [
        [*r[:n], age(d.get("metadata", {}).get("creationTimestamp"), now), *r[n:]]
        for r, d in zip(rows, docs, strict=True)
    ]


def objects_table(
    kind: str,
    docs: Sequence[Doc],
    *,
    now: float,
    wide: bool = False,
    headers: bool = True,
    show_labels: bool = False,
) -> str:
    if not docs:
        return "No resources found."
    header = header_of(kind, wide=wide)
    rows = rows_of(kind, docs, now=now, wide=wide)
    if show_labels and "LABELS" not in header:
        header.append("LABELS")
        rows = [
            [*r, _labels(d.get("metadata", {}).get("labels", {}))]
            for r, d in zip(rows, docs, strict=True)
        ]
    if not headers:
        return table([""] * len(header), rows).split("\n", 1)[1]
    return table(header, rows)


def name_of(doc: Doc) -> str:
    """``kind/name``, as ``-o name`` prints it."""
    return f"{str(doc.get('kind', '')).lower()}/{_name(doc)}"


def sort_key(path: str) -> Callable[[Doc], tuple[int, float, str]]:
    """How ``--sort-by PATH`` orders objects: missing values first, then numbers (and times)
    by value, then the rest as text."""

    def key(doc: Doc) -> tuple[int, float, str]:
        found = jsonpath.values(path.strip("{}"), doc)
        if not found or found[0] is None:
            return (0, 0.0, "")
        value = found[0]
        number = epoch_of(value)
        if number is not None:
            return (1, number, "")
        return (2, 0.0, value if isinstance(value, str) else orjson.dumps(value).decode())

    return key


def events_table(events: Sequence[Doc], *, now: float) -> str:
    if not events:
        return "No events found."
    rows = [
        [
            age(e.get("time"), now),
            str(e.get("type", "")),
            str(e.get("reason", "")),
            f"{str(e['object']['kind']).lower()}/{e['object']['name']}",
            str(e.get("message", "")),
        ]
        for e in events
    ]
    return table(("AGE", "TYPE", "REASON", "OBJECT", "MESSAGE"), rows)


# -- json / yaml ---------------------------------------------------------------------------------


def as_list(docs: Sequence[Doc]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": list(docs)}


def dump(doc: Any, output: str) -> str:
    if output == "json":
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    return yaml.safe_dump(doc, sort_keys=True, default_flow_style=False).rstrip()


# -- describe ------------------------------------------------------------------------------------


def _field(name: str, value: object) -> str:
    return f"{name + ':':<18}{value}"


def _multi(name: str, values: Sequence[str]) -> list[str]:
    if not values:
        return [_field(name, "<none>")]
    return [_field(name, values[0]), *(" " * 18 + v for v in values[1:])]


def _indented(text: str) -> list[str]:
    return ["  " + line for line in text.splitlines()]


def events_section(events: Sequence[Doc], now: float) -> list[str]:
    if not events:
        return ["Events:           <none>"]
    return ["Events:", *_indented(events_table(events, now=now))]


def _scalar(value: Any) -> str:
    if value is None:
        return "<none>"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def plain_lines(value: Any) -> list[str]:
    """A value for people, one fact a line: mappings as ``key: value`` (nested ones indented),
    lists of plain values joined by ", ", lists of mappings one ``- ...`` line per item."""
    if isinstance(value, Mapping):
        lines: list[str] = []
        for key, item in sorted(value.items()):
            inner = plain_lines(item)
            if isinstance(item, Mapping | list) and len(inner) > 1:
                lines += [f"{key}:", *("  " + line for line in inner)]
            else:
                lines.append(f"{key}: {inner[0] if inner else '<none>'}")
        return lines
    if isinstance(value, list):
        if all(not isinstance(v, Mapping | list) for v in value):
            return [", ".join(_scalar(v) for v in value) or "<none>"]
        out: list[str] = []
        for item in value:
            inner = plain_lines(item)
            out += ["- " + inner[0], *("  " + line for line in inner[1:])]
        return out
    return [_scalar(value)]


def _when(value: object, now: float) -> str:
    """``2026-11-30T21:05:09Z (12m ago)``; ``<never>`` without a time."""
    if value is None or epoch_of(value) is None:
        return "<never>"
    return f"{value} ({age(value, now)} ago)"


def _meta_lines(doc: Doc, now: float) -> list[str]:
    metadata = doc.get("metadata", {})
    labels = [f"{k}={v}" for k, v in sorted(metadata.get("labels", {}).items())]
    annotations = [f"{k}={v}" for k, v in sorted(metadata.get("annotations", {}).items())]
    lines = [_field("Name", _name(doc)), _field("Kind", doc.get("kind", ""))]
    lines += _multi("Labels", labels)
    if annotations:
        lines += _multi("Annotations", annotations)
    lines.append(_field("Created", _when(metadata.get("creationTimestamp"), now)))
    for key, label in (("uid", "UID"), ("resourceVersion", "Resource version")):
        if metadata.get(key):
            lines.append(_field(label, metadata[key]))
    return lines


def describe_object(doc: Doc, events: Sequence[Doc], *, now: float) -> str:
    """Any kind: its metadata, then spec and status one fact a line, then events."""
    lines = _meta_lines(doc, now)
    for section in ("spec", "status"):
        if doc.get(section):
            lines += [f"{section.capitalize()}:", *_indented("\n".join(plain_lines(doc[section])))]
    lines += events_section(events, now)
    return "\n".join(lines)


def describe_device(doc: Doc, events: Sequence[Doc], *, now: float) -> str:
    status = doc.get("status", {})
    health = status.get("health", {})
    attestation = status.get("attestation", {})
    lines = [
        *_meta_lines(doc, now),
        _field("Status", _device_status(doc)),
        _field("Last heartbeat", _when(status.get("lastHeartbeat"), now)),
        _field(
            "Health",
            "schedulable"
            if health.get("schedulable", True)
            else "unschedulable: " + "; ".join(health.get("reasons", [])),
        ),
        _field(
            "Attestation",
            " ".join([attestation.get("state", "Unknown"), *attestation.get("reasons", [])])
            + (f", verified {attestation['verifiedAt']}" if attestation.get("verifiedAt") else ""),
        ),
        _field(
            "Agent",
            f"edged {status.get('agentVersion') or '<unknown>'}"
            + (f", refused: {status['agentRefused']}" if status.get("agentRefused") else ""),
        ),
        _field(
            "Generation",
            f"desired {status.get('generationDesired', 0)}, "
            f"acknowledged {status.get('generationAcked', 0)}",
        ),
        *_multi(
            "Taints",
            [f"{t['key']}:{t['effect']} ({t.get('reason', '')})" for t in status.get("taints", [])],
        ),
        *_multi("Deployments", list(status.get("deployments", []))),
        *_multi(
            "Not running",
            [f"{d}: {why}" for d, why in sorted(status.get("notRunning", {}).items())],
        ),
    ]
    workloads = status.get("workloads", {})
    if workloads:
        rows = [
            [
                name,
                str(w.get("modelVersion", "")),
                f"{w.get('readyReplicas', 0)}/{w.get('desiredReplicas', 0)}",
                str(w.get("phase", "")),
            ]
            for name, w in sorted(workloads.items())
        ]
        lines += ["Workloads:", *_indented(table(("NAME", "VERSION", "READY", "PHASE"), rows))]
        ended = [
            f"{name}: {termination_text(w['lastTermination'])}, {w.get('restartCount', 0)} restarts"
            for name, w in sorted(workloads.items())
            if w.get("lastTermination")
        ]
        if ended:  # only when a worker ended unasked (an OOM kill, a crash)
            lines += _multi("Terminations", ended)
    else:
        lines.append(_field("Workloads", "<none>"))
    downloads = downloads_of(status)
    if downloads:
        lines += [
            "Downloads:",
            *_indented(
                table(("WORKLOAD", "VERSION", "PROGRESS", "BYTES"), [list(d) for d in downloads])
            ),
        ]
    lines += compliance_lines(status.get("compliance"))
    facts = status.get("facts", {})
    if facts:
        lines += ["Facts:", *_indented("\n".join(plain_lines(facts)))]
    else:
        lines.append(_field("Facts", "<none>"))
    lines += events_section(events, now)
    return "\n".join(lines)


def compliance_lines(compliance: Mapping[str, Any] | None) -> list[str]:
    """A device's drift report (``status.compliance``): compliant or not, the action in
    force, each finding with the remediation the action takes."""
    if not compliance or not compliance.get("checked"):
        return [_field("Compliance", "Unknown (not checked yet)")]
    action = str(compliance.get("action", "alert"))
    state = "Compliant" if compliance.get("compliant") else "Drifted"
    lines = [_field("Compliance", f"{state} (drift action {action})")]
    if compliance.get("quarantined"):
        lines.append(_field("Quarantined", compliance["quarantined"]))
    if not compliance.get("processesChecked"):
        lines.append(_field("Processes", "not checked (edged has no cgroup of its own)"))
    if compliance.get("opensWatched") is False:
        why = compliance.get("opensWatchReason") or "?"
        lines.append(_field("Opens", f"not watched ({why}); found only at each check"))
    findings = compliance.get("findings", [])
    if findings:
        rows = [
            [
                str(f.get("kind", "")),
                str(f.get("subject", "")),
                remedy(action, f),
                str(f.get("message", "")),
            ]
            for f in findings
        ]
        lines += [
            "Findings:",
            *_indented(table(("KIND", "SUBJECT", "REMEDIATION", "MESSAGE"), rows)),
        ]
    return lines


REMEDIES = {
    "ArtifactAdded": "moved to quarantine/",
    "ArtifactChanged": "checked, quarantined if rotten, workloads restarted",
    "ConfigChanged": "reported only",
    "StrayProcess": "killed",
    "ModelFileOpened": "process killed",
    "ListeningSocket": "process killed (a worker: restarted)",
}


def remedy(action: str, finding: Mapping[str, Any]) -> str:
    """What the drift action does about ``finding`` (edged/compliance/checking.py)."""
    if action == "quarantine":
        return "workloads stopped (quarantine)"
    if action == "restartWorkload":
        return REMEDIES.get(str(finding.get("kind", "")), "reported only")
    return "reported only (alert)"


def describe_deployment(
    doc: Doc,
    events: Sequence[Doc],
    *,
    now: float,
    placed: Sequence[Doc] = (),
    more_placed: bool = False,
) -> str:
    """``placed``: its Placements (the devices holding its replicas), ``more_placed``: whether
    there are more than those."""
    spec, status = doc.get("spec", {}), doc.get("status", {})
    model = spec.get("model", {})
    placement = spec.get("placement", {})
    replicas = spec.get("replicas", {})
    per = replicas.get("perDevice")
    lines = [
        *_meta_lines(doc, now),
        _field("Model", f"{model.get('name')} {model.get('version')}"),
        _field(
            "Replicas",
            f"{per} per device" if per is not None else f"{replicas.get('total')} across the fleet",
        ),
        _field("Selector", selector_text(placement)),
        _field("Regions", ", ".join(placement.get("regions", [])) or "<any>"),
        _field(
            "Devices",
            f"{status.get('desiredDevices', 0)} desired | {status.get('updatedDevices', 0)} "
            f"updated | {status.get('readyDevices', 0)} ready | "
            f"{status.get('availableDevices', 0)} available",
        ),
    ]
    config = status.get("config")
    if config:  # kind: ModelConfig, desired against reported (docs/model-config.md)
        lines.append(
            _field(
                "Config",
                f"ModelConfig {config.get('modelConfig')}: {config.get('runningDesired', 0)} of "
                f"{config.get('devices', 0)} devices run the desired config",
            )
        )
        lines += [f"  {d}: {why}" for d, why in sorted(config.get("notRunningDesired", {}).items())]
        if config.get("notRunningDevices"):
            lines.append(f"  ... {config['notRunningDevices']} devices do not, in all")
    versions = status.get("versions", {})
    if versions:
        rows = [[v, str(c["devices"]), str(c["ready"])] for v, c in sorted(versions.items())]
        lines += ["Versions:", *_indented(table(("VERSION", "DEVICES", "READY"), rows))]
    conditions = status.get("conditions", [])
    if conditions:
        rows = [[c["type"], c["status"], c["reason"], c.get("message", "")] for c in conditions]
        lines += [
            "Conditions:",
            *_indented(table(("TYPE", "STATUS", "REASON", "MESSAGE"), rows)),
        ]
    rollout = status.get("rollout") or {}
    if rollout:
        lines.append(_field("Rollout", rollout_line(rollout)))
    failing = [f"{d}: {why}" for d, why in sorted(status.get("failing", {}).items())]
    if rollout.get("phase") == "RolledBack":
        failing += [
            f"{d}: {why} (revision {rollout.get('revision')}, rolled back)"
            for d, why in sorted((rollout.get("failedDevices") or {}).items())
        ]
    lines += _multi("Failing devices", failing)
    name = str(doc.get("metadata", {}).get("name", ""))
    lines += placements_section(placed, more_placed, name)
    shown = status.get("terminations") or {}
    ended = [
        f"{d}: {termination_text(t['lastTermination'])}, {t.get('restartCount', 0)} restarts"
        for d, t in sorted(shown.items())
    ]
    more = int(status.get("terminatedDevices", len(shown))) - len(shown)
    if more > 0:  # the hub lists the newest only
        ended.append(f"and {more} more devices")
    if ended:  # only when a worker ended unasked somewhere (an OOM kill, a crash)
        lines += _multi("Terminations", ended)
    lines += events_section(events, now)
    return "\n".join(lines)


def placements_section(placed: Sequence[Doc], more: bool, name: str) -> list[str]:
    """``Placements:``: each device holding the deployment's replicas, with its revision,
    replicas ready of those asked, the phase there and why."""
    if not placed:
        return [_field("Placements", "<none>")]
    rows = []
    for p in placed:
        spec, status = p.get("spec", {}), p.get("status", {})
        revision = status.get("revision")
        rows.append(
            [
                str(spec.get("device", "")),
                f"{revision} ({status.get('version')})" if revision else "<none>",
                f"{status.get('readyReplicas', 0)}/{status.get('replicas', 0)}",
                str(status.get("phase", "")),
                str(status.get("reason", "")),
            ]
        )
    out = [
        "Placements:",
        *_indented(table(("DEVICE", "REVISION", "READY", "PHASE", "REASON"), rows)),
    ]
    if more:
        out.append(f"  and more: edgectl get placements --for deployment/{name}")
    return out


def rollout_line(rollout: Doc) -> str:
    """``revision 3 (2.0.0) RolledBack (RevisionFailed), stable revision 2 (1.1.0)``."""

    def rev(number: object, version: object) -> str:
        return f"revision {number}" + (f" ({version})" if version else "")

    line = f"{rev(rollout.get('revision'), rollout.get('version'))} {rollout.get('phase', '?')}"
    if rollout.get("reason"):
        line += f" ({rollout['reason']})"
    if rollout.get("stableRevision") != rollout.get("revision"):
        stable = rev(rollout.get("stableRevision"), rollout.get("stableVersion"))
        line += f", stable {stable}"
    return line


def describe_region(doc: Doc, events: Sequence[Doc], *, now: float) -> str:
    """A regional hub at its root: its link, last report, devices, generation, certificate."""
    status = doc.get("status", {})
    replica = status.get("replica")
    if status.get("connected"):
        where = "here" if status.get("streamsHere") else "to another root replica"
        link = f"yes, to {replica} ({where}) since {_when(status.get('connectedAt'), now)}"
    elif replica:
        link = f"no (last to {replica}, last seen {_when(status.get('lastSeenAt'), now)})"
    else:
        link = "no (never connected)"
    devices = status.get("devices")
    if devices:
        phases = ", ".join(f"{k} {n}" for k, n in sorted(devices.get("byPhase", {}).items()))
        shown = f"{devices.get('ready', 0)} ready of {devices.get('total', 0)}"
        shown += f" ({phases})" if phases else ""
    else:
        shown = "<unknown> (no report yet)"
    deployments = status.get("deployments")
    applied, sent = status.get("generationApplied"), status.get("generationSent")
    generation = f"applied {'<unknown>' if applied is None else applied}"
    if sent is not None:
        generation += f", sent {sent}"
    certificate = status.get("certificate", {})
    not_after = certificate.get("notAfter")
    left = _expires_in(not_after, now)
    if left == "<unknown>":
        expires = "<unknown> (enrolled at an older root)"
    else:
        expires = f"{not_after} ({'expired' if left == '<expired>' else 'in ' + left})"
    lines = [
        *_meta_lines(doc, now),
        _field("Connected", link),
        _field("Last report", _when(status.get("reportedAt"), now)),
        _field("Devices", shown),
        _field("Deployments", "<unknown>" if deployments is None else deployments),
        _field("Generation", generation),
        _field("Certificate", certificate.get("serial", "<none>")),
        _field("Expires", expires),
    ]
    if certificate.get("previousSerial"):
        lines.append(_field("Also accepted", certificate["previousSerial"]))
    lines += events_section(events, now)
    return "\n".join(lines)
