"""Which precision variant a workload serves now: ``choose_precision`` (pure).

Wanted, in order: ``power.lowBattery``'s precision while the device runs on battery below
its charge; else the precision of the ``power.schedule`` window the device's local time is in
(``from`` inclusive, ``to`` exclusive, a window may wrap past midnight; the first listed
wins); else ``runtime.precision``; else fp32 (the artifact's model file). A wanted precision
the artifact has no variant for is not served: the workload keeps what it would serve without
it (the next rule down that the artifact has), and a ``PrecisionAvailable=False`` condition
names what is missing. Not fatal.

The planner makes the chosen variant part of the revision (``DesiredWorkload.revision_with``),
so a switch of precision is the same zero-downtime switch as a version change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from edged.reconcile.model import PrecisionChoice
from edgefleet.api.conditions import Condition, ConditionStatus
from edgefleet.api.deployments import ModelDeploymentSpec, PowerWindow
from edgefleet.artifacts.variants import BASE_PRECISION

DAY_S = 86400.0
BATTERY_RECHECK_S = 60.0  # a low-battery rule: look at the battery this often


@dataclass(frozen=True, slots=True)
class PowerState:
    """What the device's power looks like now: its local time of day (seconds since local
    midnight) and its battery (``on_battery`` False: on mains, or no battery at all)."""

    local_seconds: float
    on_battery: bool = False
    battery_percent: float | None = None


def _edges(w: PowerWindow) -> tuple[float, float]:
    return (w.start.hour * 3600 + w.start.minute * 60.0, w.end.hour * 3600 + w.end.minute * 60.0)


def in_window(w: PowerWindow, local_seconds: float) -> bool:
    start, end = _edges(w)
    if start < end:
        return start <= local_seconds < end
    return local_seconds >= start or local_seconds < end  # wraps past midnight


def seconds_to_next_edge(windows: tuple[PowerWindow, ...], local_seconds: float) -> float | None:
    """Seconds until the next ``from`` or ``to`` of any window (None: no windows)."""
    best: float | None = None
    for w in windows:
        for edge in _edges(w):
            ahead = (edge - local_seconds) % DAY_S or DAY_S
            best = ahead if best is None else min(best, ahead)
    return best


def choose_precision(
    spec: ModelDeploymentSpec, variants: Mapping[str, str], power: PowerState
) -> PrecisionChoice:
    """The variant to serve now (``variants``: precision -> sha256, fp32 always present)."""
    rules: list[tuple[str, str, str]] = []  # (precision, reason, message), most wanted first
    waits: list[float] = []
    if spec.power is not None:
        low = spec.power.low_battery
        if low is not None:
            waits.append(BATTERY_RECHECK_S)
            if (
                power.on_battery
                and power.battery_percent is not None
                and power.battery_percent < low.below_percent
            ):
                rules.append(
                    (
                        low.precision.value,
                        "LowBattery",
                        f"on battery at {power.battery_percent:.0f}% (below {low.below_percent}%)",
                    )
                )
        edge = seconds_to_next_edge(spec.power.schedule, power.local_seconds)
        if edge is not None:
            waits.append(edge)
        for w in spec.power.schedule:
            if in_window(w, power.local_seconds):
                span = f"{w.start.strftime('%H:%M')}-{w.end.strftime('%H:%M')}"
                rules.append((w.precision.value, "PowerWindow", f"power window {span}"))
                break
    if spec.runtime.precision is not None:
        rules.append((spec.runtime.precision.value, "Requested", "runtime.precision"))
    rules.append((BASE_PRECISION, "Default", "the artifact's model file"))

    missing: list[tuple[str, str]] = []
    for precision, reason, message in rules:
        sha = variants.get(precision)
        if sha is None:
            missing.append((precision, message))
            continue
        conditions: tuple[Condition, ...] = ()
        if missing:
            have = ", ".join(p for p in ("fp32", "fp16", "int8") if p in variants)
            wanted = "; ".join(f"{p} ({why})" for p, why in missing)
            conditions = (
                Condition(
                    "PrecisionAvailable",
                    ConditionStatus.FALSE,
                    "VariantMissing",
                    f"the artifact has no variant for {wanted}; it has {have}; "
                    f"serving {precision} ({message})",
                ),
            )
        return PrecisionChoice(
            precision, sha, reason, message, conditions, min(waits) if waits else None
        )
    raise AssertionError("fp32 is always a variant")  # pragma: no cover
