"""The ``DeviceHealthPolicy`` kind: when discovery calls a device healthy (uptime, memory,
temperature, disk, accelerators, labels, with hysteresis)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from edgefleet.api.fieldsyntax import plain_number
from edgefleet.api.meta import (
    ObjectMeta,
    SpecObject,
    label_key,
    label_value,
)
from edgefleet.api.quantities import (
    format_duration,
    format_memory,
    parse_duration,
    parse_memory,
    parse_percent,
)
from edgefleet.api.validating import (
    Reader,
    number_in,
    within,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceHealthPolicySpec:
    """``spec`` of a DeviceHealthPolicy: when the device is fit to take workloads.

    Unset bounds are not checked. ``hysteresis_percent`` widens a bound once the device is out
    of it: it is back only past the bound by that share (85 °C, 5%: back at 80.75 °C or less).
    """

    min_uptime_s: float | None = None
    min_available_memory_bytes: int | None = None
    max_cpu_temperature_c: float | None = None
    min_disk_free_bytes: int | None = None
    required_accelerators: tuple[str, ...] = ()
    required_labels: Mapping[str, str] = field(default_factory=dict)
    hysteresis_percent: int = 5

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.min_uptime_s is not None:
            out["minUptime"] = format_duration(self.min_uptime_s)
        if self.min_available_memory_bytes is not None:
            out["minAvailableMemory"] = format_memory(self.min_available_memory_bytes)
        if self.max_cpu_temperature_c is not None:
            out["maxCpuTemperature"] = plain_number(self.max_cpu_temperature_c)
        if self.min_disk_free_bytes is not None:
            out["minDiskFree"] = format_memory(self.min_disk_free_bytes)
        if self.required_accelerators:
            out["requiredAccelerators"] = list(self.required_accelerators)
        if self.required_labels:
            out["requiredLabels"] = dict(sorted(self.required_labels.items()))
        out["hysteresis"] = f"{self.hysteresis_percent}%"
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceHealthPolicy(SpecObject):
    """When this device reports itself schedulable (evaluated by edged; nothing is killed)."""

    KIND: ClassVar[str] = "DeviceHealthPolicy"

    metadata: ObjectMeta
    spec: DeviceHealthPolicySpec


_celsius = number_in(-50, 200)


_hysteresis = within(parse_percent, lambda v: "must be at most 50%" if v > 50 else None)


def read_device_health_policy(metadata: ObjectMeta, r: Reader | None) -> DeviceHealthPolicy:
    if r is None:
        return DeviceHealthPolicy(metadata=metadata, spec=DeviceHealthPolicySpec())
    spec = DeviceHealthPolicySpec(
        min_uptime_s=r.optional("minUptime", parse_duration, None),
        min_available_memory_bytes=r.optional("minAvailableMemory", parse_memory, None),
        max_cpu_temperature_c=r.optional("maxCpuTemperature", _celsius, None),
        min_disk_free_bytes=r.optional("minDiskFree", parse_memory, None),
        required_accelerators=tuple(
            r.list_of("requiredAccelerators", label_value, unique=True) or ()
        ),
        required_labels=r.string_map("requiredLabels", label_key, label_value) or {},
        hysteresis_percent=r.optional("hysteresis", _hysteresis, 5),
    )
    return DeviceHealthPolicy(metadata=metadata, spec=spec)
