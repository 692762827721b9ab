"""``edged doctor``: what hardware, execution providers and health this device has, and what is
missing. Works without a running edged: it enumerates udev itself and asks onnxruntime.

:func:`build_report` is pure (data in, report out); :func:`gather` does the reading;
:func:`render_report` writes it for a person.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edged.discovery.hardware import Accelerator, DeviceFacts, HealthSample
from edged.discovery.health import DEFAULT_POLICY, evaluate_health
from edged.discovery.labelling import discovered_labels, merge_labels
from edged.discovery.providers import VENDOR_RUNTIME_ONLY, providers_for
from edgefleet.api import DeviceHealthPolicy, load_manifest_file
from edgefleet.errors import ValidationError


def build_report(
    *,
    facts: DeviceFacts,
    sample: HealthSample,
    accelerators: Sequence[Accelerator],
    available: Sequence[str],
    onnxruntime: str,
    policies: Sequence[DeviceHealthPolicy],
    operator_labels: dict[str, str],
    problems: Sequence[str] = (),
) -> dict[str, Any]:
    """The doctor's report as data (also the ``-o json`` output). Pure."""
    labels = merge_labels(discovered_labels(facts, accelerators), operator_labels)
    missing = list(problems)
    items = []
    for acc in accelerators:
        eps = providers_for(acc, available)
        note = VENDOR_RUNTIME_ONLY.get(acc.vendor, "") if not eps else ""
        for problem in acc.problems:
            missing.append(f"{acc.kind} {acc.id}: {problem}")
        for name, offered in eps:
            if not offered:
                missing.append(
                    f"{acc.kind} {acc.id}: enables {name}, but this onnxruntime build lacks it"
                )
        items.append(
            {
                **acc.to_json(),
                "executionProviders": [{"name": n, "inOnnxRuntime": ok} for n, ok in eps],
                "note": note,
            }
        )
    verdict = evaluate_health(policies or (DEFAULT_POLICY,), sample, accelerators, labels)
    return {
        "facts": facts.to_json(),
        "accelerators": items,
        "onnxruntime": {"version": onnxruntime, "providers": list(available)},
        "labels": labels,
        "health": {**verdict.to_json(), "sample": sample.to_json()},
        "missing": missing,
    }


def read_policies(directory: Path | None) -> tuple[list[DeviceHealthPolicy], list[str]]:
    """DeviceHealthPolicy documents of a static manifests directory, and the files' problems."""
    if directory is None:
        return [], []
    policies: list[DeviceHealthPolicy] = []
    problems: list[str] = []
    for path in sorted(directory.glob("*")):
        if path.suffix not in (".yaml", ".yml", ".json") or path.name.startswith("."):
            continue
        try:
            policies += [m for m in load_manifest_file(path) if isinstance(m, DeviceHealthPolicy)]
        except ValidationError as exc:
            problems.append(f"manifest {exc}")
    return policies, problems


def gather(data_dir: Path, manifests: Path | None) -> dict[str, Any]:
    """Enumerate, sample and ask onnxruntime (imported here: doctor is not the daemon)."""
    from edged.discovery.classifying import merge
    from edged.discovery.discovering import read_operator_labels
    from edged.discovery.inventory import read_facts, read_sample
    from edged.discovery.udev import UdevError, read_records

    problems: list[str] = []
    try:
        accelerators = merge(read_records())
    except UdevError as exc:
        accelerators, problems = [], [str(exc)]
    try:
        import onnxruntime as ort

        ort.set_default_logger_severity(3)  # its own device probing warns about odd sysfs
        available, version = list(ort.get_available_providers()), str(ort.__version__)
    except ImportError as exc:
        available, version = [], "not installed"
        problems.append(f"onnxruntime cannot be imported: {exc}")
    policies, policy_problems = read_policies(manifests)
    sample_dir = data_dir if data_dir.exists() else Path("/")
    return build_report(
        facts=read_facts(),
        sample=read_sample(sample_dir),
        accelerators=accelerators,
        available=available,
        onnxruntime=version,
        policies=policies,
        operator_labels=read_operator_labels(data_dir / "labels.json"),
        problems=problems + policy_problems,
    )


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return str(n)


def render_report(report: dict[str, Any]) -> str:
    f = report["facts"]
    s = report["health"]["sample"]
    out = [
        f"device: {f['arch']}, {f['cpuCount']} CPUs, {_size(f['memoryTotalBytes'])} RAM, "
        f"{f['os']} {f['kernel']}",
        f"onnxruntime {report['onnxruntime']['version']}: "
        + (", ".join(report["onnxruntime"]["providers"]) or "no providers"),
        "",
        "accelerators:" if report["accelerators"] else "accelerators: none found",
    ]
    for a in report["accelerators"]:
        state = "usable" if a["usable"] else "NOT USABLE"
        out.append(
            f"  {a['class']} {a['vendor']} {a['model']} ({a['id']}), "
            f"driver {a['driver'] or '-'}, {', '.join(a['nodes']) or 'no node'}"
            + (f", {_size(a['memoryBytes'])}" if a["memoryBytes"] else "")
            + f": {state}"
        )
        for p in a["problems"]:
            out.append(f"    problem: {p}")
        for ep in a["executionProviders"]:
            has = "in this onnxruntime" if ep["inOnnxRuntime"] else "NOT in this onnxruntime build"
            out.append(f"    enables {ep['name']} ({has})")
        if a["note"]:
            out.append(f"    {a['note']}")
    temp = s["cpuTemperatureCelsius"]
    health = report["health"]
    out += [
        "",
        f"health: up {s['uptimeSeconds']:.0f}s, {_size(s['memoryAvailableBytes'])} RAM available, "
        f"{_size(s['diskFreeBytes'])} free in the data dir, CPU "
        + (f"{temp:.0f} °C" if temp is not None else "temperature unknown")
        + f", load {' '.join(str(x) for x in s['load'])}"
        + (f", battery {s['batteryPercent']:.0f}%" if s["batteryPercent"] is not None else ""),
        f"policy {', '.join(health['policies'])}: "
        + ("schedulable" if health["schedulable"] else "NOT schedulable"),
    ]
    out += [f"  {r}" for r in health["reasons"]]
    out.append("labels: " + ", ".join(f"{k}={v}" for k, v in report["labels"].items()))
    if report["missing"]:
        out += ["", "missing:"] + [f"  - {m}" for m in report["missing"]]
    else:
        out += ["", "nothing missing"]
    return "\n".join(out)
