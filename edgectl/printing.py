"""How edgectl shows objects to a person: kubectl-like tables and ``describe`` pages. Pure
functions of the JSON documents the hub returns (and ``now``, for ages)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
import yaml

Row = list[str]
Doc = Mapping[str, Any]


def age(seconds_since: float | None, now: float) -> str:
    """``45s``, ``12m``, ``3h``, ``5d``; ``<unknown>`` without a time."""
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


def _device_row(doc: Doc, now: float, wide: bool) -> Row:
    status = doc.get("status", {})
    health = status.get("health", {})
    row = [
        _name(doc),
        _device_status(doc),
        "ok" if health.get("schedulable", True) else ";".join(health.get("reasons", [])),
        str(status.get("attestation", {}).get("state", "Unknown")),
        str(len(status.get("deployments", []))),
        age(status.get("lastHeartbeat"), now),
    ]
    if wide:
        taints = [f"{t['key']}:{t['effect']}" for t in status.get("taints", [])]
        row += [
            f"{status.get('generationAcked', 0)}/{status.get('generationDesired', 0)}",
            _labels(doc.get("metadata", {}).get("labels", {})),
            ",".join(taints) or "<none>",
        ]
    return row


def _deployment_row(doc: Doc, now: float, wide: bool) -> Row:
    spec, status = doc.get("spec", {}), doc.get("status", {})
    model = spec.get("model", {})
    row = [
        _name(doc),
        f"{model.get('name')}:{model.get('version')}",
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
            _labels(placement.get("nodeSelector", {})),
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
    return [
        _name(doc),
        str(spec.get("requireAttestation", False)).lower(),
        str(len(spec.get("allowedCodeDigests", []))),
        str(len(spec.get("allowedConfigDigests", []))),
        str(len(spec.get("allowedModelDigests", []))),
    ]


def _generic_row(doc: Doc, now: float, wide: bool) -> Row:
    return [_name(doc), _labels(doc.get("metadata", {}).get("labels", {}))]


Columns = tuple[Sequence[str], Sequence[str], Callable[[Doc, float, bool], Row]]
COLUMNS: dict[str, Columns] = {
    "Device": (
        ("NAME", "STATUS", "HEALTH", "ATTESTATION", "DEPLOYMENTS", "LAST-HEARTBEAT"),
        ("GENERATION", "LABELS", "TAINTS"),
        _device_row,
    ),
    "ModelDeployment": (
        ("NAME", "MODEL", "DESIRED", "UP-TO-DATE", "READY", "AVAILABLE"),
        ("REPLICAS", "SELECTOR", "REGIONS"),
        _deployment_row,
    ),
    "Model": (("NAME", "VERSION", "SHA256", "BYTES", "PUSHED"), (), _model_row),
    "SecurityBaseline": (
        ("NAME", "REQUIRE-ATTESTATION", "CODE-DIGESTS", "CONFIG-DIGESTS", "MODEL-DIGESTS"),
        (),
        _baseline_row,
    ),
}
_GENERIC: Columns = (("NAME", "LABELS"), (), _generic_row)


def header_of(kind: str, *, wide: bool) -> list[str]:
    base, extra, _ = COLUMNS.get(kind, _GENERIC)
    return [*base, *(extra if wide else ())]


def rows_of(kind: str, docs: Sequence[Doc], *, now: float, wide: bool) -> list[Row]:
    _, _, row = COLUMNS.get(kind, _GENERIC)
    return [row(d, now, wide) for d in docs]


def objects_table(kind: str, docs: Sequence[Doc], *, now: float, wide: bool = False) -> str:
    if not docs:
        return "No resources found."
    return table(header_of(kind, wide=wide), rows_of(kind, docs, now=now, wide=wide))


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


def describe_device(doc: Doc, events: Sequence[Doc], *, now: float) -> str:
    status = doc.get("status", {})
    health = status.get("health", {})
    attestation = status.get("attestation", {})
    labels = [f"{k}={v}" for k, v in sorted(doc.get("metadata", {}).get("labels", {}).items())]
    lines = [
        _field("Name", _name(doc)),
        *_multi("Labels", labels),
        _field("Status", _device_status(doc)),
        _field("Last heartbeat", age(status.get("lastHeartbeat"), now) + " ago"),
        _field(
            "Health",
            "schedulable"
            if health.get("schedulable", True)
            else "unschedulable: " + "; ".join(health.get("reasons", [])),
        ),
        _field(
            "Attestation",
            " ".join([attestation.get("state", "Unknown"), *attestation.get("reasons", [])]),
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
    else:
        lines.append(_field("Workloads", "<none>"))
    facts = [f"{k}: {v}" for k, v in sorted(status.get("facts", {}).items())]
    lines += _multi("Facts", facts)
    lines += events_section(events, now)
    return "\n".join(lines)


def describe_deployment(doc: Doc, events: Sequence[Doc], *, now: float) -> str:
    spec, status = doc.get("spec", {}), doc.get("status", {})
    model = spec.get("model", {})
    placement = spec.get("placement", {})
    replicas = spec.get("replicas", {})
    per = replicas.get("perDevice")
    labels = [f"{k}={v}" for k, v in sorted(doc.get("metadata", {}).get("labels", {}).items())]
    lines = [
        _field("Name", _name(doc)),
        *_multi("Labels", labels),
        _field("Model", f"{model.get('name')} {model.get('version')}"),
        _field("Replicas", f"{per} per device" if per is not None else f"{replicas.get('total')}"),
        _field("Node selector", _labels(placement.get("nodeSelector", {}))),
        _field("Regions", ", ".join(placement.get("regions", [])) or "<any>"),
        _field(
            "Devices",
            f"{status.get('desiredDevices', 0)} desired | {status.get('updatedDevices', 0)} "
            f"updated | {status.get('readyDevices', 0)} ready | "
            f"{status.get('availableDevices', 0)} available",
        ),
    ]
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
    failing = status.get("failing", {})
    lines += _multi("Failing devices", [f"{d}: {why}" for d, why in sorted(failing.items())])
    lines += events_section(events, now)
    return "\n".join(lines)
