"""Pure: a device's health against DeviceHealthPolicy documents, with hysteresis.

``evaluate_health(policies, sample, accelerators, labels, previous)`` returns whether the
device is schedulable and why not. A numeric bound that failed in ``previous`` must be passed
by its hysteresis margin before it counts as passed again (85 °C with 5%: back at 80.75 °C),
so a value sitting at the threshold does not flap. No clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edged.discovery.hardware import Accelerator, HealthSample
from edged.discovery.providers import matches_accelerator
from edgefleet.api import DeviceHealthPolicy, DeviceHealthPolicySpec, ObjectMeta, format_memory

DEFAULT_POLICY = DeviceHealthPolicy(
    metadata=ObjectMeta(name="default"),
    spec=DeviceHealthPolicySpec(
        max_cpu_temperature_c=85.0, min_available_memory_bytes=64 << 20, hysteresis_percent=5
    ),
)
"""Used when no DeviceHealthPolicy is given: below 85 °C and with 64 MiB of RAM available."""


@dataclass(frozen=True, slots=True)
class HealthVerdict:
    schedulable: bool
    reasons: tuple[str, ...] = ()
    failing: frozenset[str] = frozenset()  # "<policy>/<check>" that failed: hysteresis state
    policies: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "schedulable": self.schedulable,
            "reasons": list(self.reasons),
            "policies": list(self.policies),
        }


def _at_least(value: float, bound: float, margin: float, was_failing: bool) -> bool:
    return value >= (bound + margin if was_failing else bound)


def _at_most(value: float, bound: float, margin: float, was_failing: bool) -> bool:
    return value <= (bound - margin if was_failing else bound)


def evaluate_health(
    policies: Sequence[DeviceHealthPolicy],
    sample: HealthSample,
    accelerators: Sequence[Accelerator],
    labels: Mapping[str, str],
    previous: HealthVerdict | None = None,
) -> HealthVerdict:
    """Schedulable iff every policy passes. Pure; tested as a table."""
    was = previous.failing if previous is not None else frozenset()
    reasons: list[str] = []
    failing: set[str] = set()
    for policy in policies:
        s = policy.spec
        share = s.hysteresis_percent / 100.0

        def check(name: str, ok: bool, reason: str, policy: DeviceHealthPolicy = policy) -> None:
            if not ok:
                failing.add(f"{policy.name}/{name}")
                reasons.append(f"{policy.name}: {reason}")

        def failed(name: str, policy: DeviceHealthPolicy = policy) -> bool:
            return f"{policy.name}/{name}" in was

        if s.min_uptime_s is not None:
            check(
                "uptime",
                sample.uptime_s >= s.min_uptime_s,
                f"up {sample.uptime_s:.0f}s, less than minUptime {s.min_uptime_s:g}s",
            )
        if s.min_available_memory_bytes is not None:
            bound = s.min_available_memory_bytes
            check(
                "memory",
                _at_least(sample.memory_available_bytes, bound, bound * share, failed("memory")),
                f"{format_memory(sample.memory_available_bytes)} of memory available, "
                f"minAvailableMemory is {format_memory(bound)}",
            )
        if s.min_disk_free_bytes is not None and sample.disk_free_bytes is not None:
            bound = s.min_disk_free_bytes
            check(
                "disk",
                _at_least(sample.disk_free_bytes, bound, bound * share, failed("disk")),
                f"{format_memory(sample.disk_free_bytes)} free on the data disk, "
                f"minDiskFree is {format_memory(bound)}",
            )
        if s.max_cpu_temperature_c is not None and sample.cpu_temperature_c is not None:
            bound_c = s.max_cpu_temperature_c
            check(
                "temperature",
                _at_most(
                    sample.cpu_temperature_c,
                    bound_c,
                    abs(bound_c) * share,
                    failed("temperature"),
                ),
                f"CPU at {sample.cpu_temperature_c:.1f} °C, maxCpuTemperature is {bound_c:g} °C",
            )
        for wanted in s.required_accelerators:
            check(
                f"accelerator:{wanted}",
                any(a.usable and matches_accelerator(a, wanted) for a in accelerators),
                f"no usable {wanted!r} accelerator",
            )
        for key, value in sorted(s.required_labels.items()):
            check(
                f"label:{key}",
                labels.get(key) == value,
                f"label {key}={value} required, device has "
                + (f"{key}={labels[key]}" if key in labels else f"no {key} label"),
            )
    return HealthVerdict(
        schedulable=not failing,
        reasons=tuple(reasons),
        failing=frozenset(failing),
        policies=tuple(p.name for p in policies),
    )
