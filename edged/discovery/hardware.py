"""Pure data about the device's hardware: udev records, accelerators, facts, health samples."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class AcceleratorClass(StrEnum):
    GPU = "gpu"
    NPU = "npu"
    TPU = "tpu"
    VPU = "vpu"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceRecord:
    """What discovery reads of one udev device (and its parents): a snapshot, no pyudev.

    ``physical`` is the sysfs path of the physical device (the PCI or USB device, or the
    platform device) that nodes of several subsystems belong to. ``node_access`` says, for each
    device node, whether edged's user can read and write it (``None``: the node is missing).
    """

    sys_path: str
    subsystem: str
    sys_name: str = ""
    devtype: str = ""
    driver: str = ""
    devnode: str = ""
    physical: str = ""
    physical_driver: str = ""
    pci_vendor: int | None = None
    pci_device: int | None = None
    pci_class: int | None = None
    usb_vendor: int | None = None
    usb_product: int | None = None
    of_compatible: tuple[str, ...] = ()
    model: str = ""  # from the hwdb, when udev knows it
    memory_bytes: int | None = None
    extra_nodes: tuple[str, ...] = ()  # nodes outside udev (e.g. /dev/nvidia0, /dev/nvidiactl)
    node_access: Mapping[str, bool | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Accelerator:
    """One accelerator: a physical device with its nodes, merged from every udev record of it."""

    id: str  # stable within a boot: the physical device's sysfs name, e.g. "0000:01:00.0"
    cls: AcceleratorClass
    vendor: str  # nvidia | amd | intel | google | hailo | rockchip | qualcomm
    model: str
    driver: str  # "" when no driver is bound
    nodes: tuple[str, ...] = ()
    memory_bytes: int | None = None
    usable: bool = False
    problems: tuple[str, ...] = ()  # why it is not usable, for status and doctor
    sys_path: str = ""

    @property
    def kind(self) -> str:
        """``nvidia-gpu``, ``hailo-npu``: vendor and class, as in the ``accelerator`` label."""
        return f"{self.vendor}-{self.cls.value}"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "class": self.cls.value,
            "vendor": self.vendor,
            "model": self.model,
            "driver": self.driver,
            "nodes": list(self.nodes),
            "memoryBytes": self.memory_bytes,
            "usable": self.usable,
            "problems": list(self.problems),
            "sysPath": self.sys_path,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceFacts:
    """What does not change while edged runs."""

    arch: str  # amd64 | arm64 | armhf | riscv64 | ...
    cpu_count: int
    memory_total_bytes: int
    kernel: str = ""
    os: str = "linux"

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "cpuCount": self.cpu_count,
            "memoryTotalBytes": self.memory_total_bytes,
            "kernel": self.kernel,
            "os": self.os,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthSample:
    """One look at the device's health; ``None`` where the device cannot tell."""

    uptime_s: float
    memory_available_bytes: int
    disk_free_bytes: int | None = None
    cpu_temperature_c: float | None = None
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)
    battery_percent: float | None = None
    on_battery: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "uptimeSeconds": round(self.uptime_s, 1),
            "memoryAvailableBytes": self.memory_available_bytes,
            "diskFreeBytes": self.disk_free_bytes,
            "cpuTemperatureCelsius": self.cpu_temperature_c,
            "load": [round(x, 2) for x in self.load],
            "batteryPercent": self.battery_percent,
            "onBattery": self.on_battery,
        }


_ARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "armhf",
    "armv6l": "armel",
    "i686": "386",
    "i386": "386",
    "riscv64": "riscv64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
}


def normalize_arch(machine: str) -> str:
    """``platform.machine()`` in the names of Debian and Go: x86_64 -> amd64, aarch64 -> arm64."""
    return _ARCH.get(machine.lower(), machine.lower() or "unknown")
