"""Pure: which udev records are accelerators, and one :class:`Accelerator` per physical device.

``classify(record)`` looks at one record (a render node, an ``accel`` node, a PCI or USB
device...); ``merge(records)`` groups what was classified by physical device, so that a GPU's
PCI device, render node and ``/dev/nvidia0`` become one accelerator with all its nodes, and
decides whether it is usable now. No I/O: records carry what the effects side read.

Recognised (see docs/edged.md, "Discovery"):

* GPUs: ``drm`` render nodes on a PCI device of NVIDIA (0x10de), AMD (0x1002) or Intel
  (0x8086); NVIDIA PCI display devices (their nodes, ``/dev/nvidia*``, are not in udev);
  NVIDIA Jetson/Tegra integrated GPUs (platform devices, driver ``gk20a``/``gv11b``/``ga10b``/
  ``nvgpu`` or ``OF_COMPATIBLE`` ``nvidia,*-gpu``/``nvidia,gv11b``...; render nodes of ``tegra``).
* NPUs: the ``accel`` subsystem (Intel NPU ``intel_vpu``, Qualcomm ``qaic``, AMD ``amdxdna``),
  Hailo (``hailo_chardev`` / ``hailo*`` nodes, PCI vendor 0x1e60), Rockchip ``rknpu``.
* TPUs: Google Coral PCIe (``apex`` subsystem, PCI 1ac1:089a) and USB (1a6e:089a, 18d1:9302).
* VPUs: Intel Movidius USB sticks (03e7:2150, 03e7:2485, 03e7:f63b).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from edged.discovery.hardware import Accelerator, AcceleratorClass, DeviceRecord

GPU, NPU, TPU, VPU = (
    AcceleratorClass.GPU,
    AcceleratorClass.NPU,
    AcceleratorClass.TPU,
    AcceleratorClass.VPU,
)

PCI_VENDORS = {0x10DE: "nvidia", 0x1002: "amd", 0x8086: "intel", 0x1E60: "hailo", 0x1AC1: "google"}
PCI_VENDORS_QUALCOMM = 0x17CB
JETSON_DRIVERS = frozenset({"gk20a", "gm20b", "gp10b", "gv11b", "ga10b", "nvgpu", "tegra"})
_JETSON_COMPATIBLE = re.compile(r"nvidia,(tegra\w*-gpu|gk20a|gm20b|gp10b|gv11b|ga10b)")
ACCEL_DRIVERS = {
    "intel_vpu": ("intel", "Intel NPU"),
    "qaic": ("qualcomm", "Qualcomm Cloud AI"),
    "amdxdna": ("amd", "AMD XDNA NPU"),
    "habanalabs": ("intel", "Habana Gaudi"),
    "rknpu": ("rockchip", "Rockchip NPU"),
}
USB_IDS: dict[tuple[int, int], tuple[AcceleratorClass, str, str]] = {
    (0x1A6E, 0x089A): (TPU, "google", "Coral USB Accelerator (before firmware load)"),
    (0x18D1, 0x9302): (TPU, "google", "Coral USB Accelerator"),
    (0x03E7, 0x2150): (VPU, "intel", "Movidius Neural Compute Stick (Myriad 2)"),
    (0x03E7, 0x2485): (VPU, "intel", "Movidius Neural Compute Stick 2 (Myriad X)"),
    (0x03E7, 0xF63B): (VPU, "intel", "Movidius Myriad X (booted)"),
}


_Found = Callable[[AcceleratorClass, str, str, int, tuple[str, ...]], "Finding"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One record recognised as (a part of) an accelerator."""

    physical: str
    cls: AcceleratorClass
    vendor: str
    model: str
    driver: str
    nodes: tuple[str, ...]
    memory_bytes: int | None
    rank: int  # which finding names the accelerator when several are merged (higher wins)


def _pci_model(r: DeviceRecord, fallback: str) -> str:
    if r.model:
        return r.model
    if r.pci_vendor is not None and r.pci_device is not None:
        return f"{fallback} [{r.pci_vendor:04x}:{r.pci_device:04x}]"
    return fallback


def _is_jetson(r: DeviceRecord) -> bool:
    return (r.physical_driver or r.driver) in JETSON_DRIVERS or any(
        _JETSON_COMPATIBLE.fullmatch(c) for c in r.of_compatible
    )


def classify(r: DeviceRecord) -> Finding | None:
    """The accelerator part ``r`` is, or ``None``. Pure."""
    driver = r.physical_driver or r.driver
    physical = r.physical or r.sys_path
    nodes = tuple(n for n in (r.devnode, *r.extra_nodes) if n)

    def found(
        cls: AcceleratorClass, vendor: str, model: str, rank: int, node_list: tuple[str, ...]
    ) -> Finding:
        return Finding(physical, cls, vendor, model, driver, node_list, r.memory_bytes, rank)

    sub = r.subsystem
    if sub == "drm":
        if not r.sys_name.startswith("renderD"):
            return None
        if driver == "rknpu" or any("rknpu" in c for c in r.of_compatible):
            return found(NPU, "rockchip", "Rockchip NPU", 2, nodes)
        vendor = PCI_VENDORS.get(r.pci_vendor) if r.pci_vendor is not None else None
        if vendor in ("nvidia", "amd", "intel"):
            assert vendor is not None
            return found(GPU, vendor, _pci_model(r, f"{vendor.upper()} GPU"), 2, nodes)
        if r.pci_vendor is None and _is_jetson(r):
            return found(GPU, "nvidia", "NVIDIA Jetson integrated GPU", 2, nodes)
        return None
    if sub == "accel":
        vendor, model = ACCEL_DRIVERS.get(driver, ("", ""))
        if not vendor:
            vendor = PCI_VENDORS.get(r.pci_vendor or -1, "")
            if r.pci_vendor == PCI_VENDORS_QUALCOMM:
                vendor = "qualcomm"
            model = _pci_model(r, "NPU")
        return found(NPU, vendor or "unknown", model, 3, nodes)
    if sub == "apex":
        return found(TPU, "google", "Coral Edge TPU (PCIe)", 3, nodes)
    if sub in ("hailo_chardev", "hailo") or (sub == "misc" and r.sys_name.startswith("hailo")):
        return found(NPU, "hailo", _pci_model(r, "Hailo AI accelerator"), 3, nodes)
    if sub == "misc" and r.sys_name == "rknpu":
        return found(NPU, "rockchip", "Rockchip NPU", 3, nodes)
    if sub == "pci":
        return _classify_pci(r, found, nodes)
    if sub == "usb" and r.devtype == "usb_device":
        if r.usb_vendor is None or r.usb_product is None:
            return None
        known = USB_IDS.get((r.usb_vendor, r.usb_product))
        if known is None:
            return None
        cls, vendor, model = known
        # USB accelerators are driven from user space (libusb): no kernel driver to bind.
        return Finding(physical, cls, vendor, model, "usb", nodes, None, 3)
    if sub == "platform":
        if _is_jetson(r):
            return found(GPU, "nvidia", "NVIDIA Jetson integrated GPU", 1, nodes)
        if any("rknpu" in c for c in r.of_compatible):
            return found(NPU, "rockchip", "Rockchip NPU", 1, nodes)
    return None


def _classify_pci(r: DeviceRecord, found: _Found, nodes: tuple[str, ...]) -> Finding | None:
    """PCI devices: the parent of the nodes; found alone, it means "no driver bound" etc."""
    base = (r.pci_class or 0) >> 16
    sub = ((r.pci_class or 0) >> 8) & 0xFF
    vendor = PCI_VENDORS.get(r.pci_vendor or -1)
    if vendor == "hailo":
        return found(NPU, "hailo", _pci_model(r, "Hailo AI accelerator"), 1, ())
    if vendor == "google" and r.pci_device == 0x089A:
        return found(TPU, "google", "Coral Edge TPU (PCIe)", 1, ())
    if vendor == "nvidia" and base == 0x03:
        # The NVIDIA driver's nodes (/dev/nvidia0, /dev/nvidiactl) are not udev devices.
        return found(GPU, "nvidia", _pci_model(r, "NVIDIA GPU"), 1, nodes)
    if vendor in ("amd", "intel") and base == 0x03:
        return found(GPU, vendor, _pci_model(r, f"{vendor.upper()} GPU"), 1, ())
    if base == 0x12 and sub == 0x00 and (vendor or r.pci_vendor == PCI_VENDORS_QUALCOMM):
        # Processing accelerators: Intel NPU, Qualcomm AI 100, AMD XDNA...
        name = vendor or "qualcomm"
        return found(NPU, name, _pci_model(r, f"{name.capitalize()} NPU"), 1, ())
    return None


def merge(records: Iterable[DeviceRecord]) -> list[Accelerator]:
    """One accelerator per physical device, with all its nodes; usable or why not. Pure."""
    groups: dict[str, list[tuple[Finding, DeviceRecord]]] = {}
    for r in records:
        f = classify(r)
        if f is not None:
            groups.setdefault(f.physical, []).append((f, r))
    out = []
    for physical, items in sorted(groups.items()):
        best = max(items, key=lambda fr: fr[0].rank)[0]
        nodes = tuple(sorted({n for f, _ in items for n in f.nodes}))
        access: dict[str, bool | None] = {}
        for _, r in items:
            access.update(r.node_access)
        driver = next((f.driver for f, _ in items if f.driver), "")
        memory = max((f.memory_bytes for f, _ in items if f.memory_bytes), default=None)
        problems = _problems(driver, nodes, access)
        out.append(
            Accelerator(
                id=physical.rsplit("/", 1)[-1],
                cls=best.cls,
                vendor=best.vendor,
                model=best.model,
                driver=driver,
                nodes=nodes,
                memory_bytes=memory,
                usable=not problems,
                problems=problems,
                sys_path=physical,
            )
        )
    return out


def _problems(
    driver: str, nodes: tuple[str, ...], access: dict[str, bool | None]
) -> tuple[str, ...]:
    problems = []
    if not driver:
        problems.append("no kernel driver is bound to the device")
    if not nodes and driver:
        problems.append(f"no device node (is the {driver} driver fully loaded?)")
    for node in nodes:
        ok = access.get(node)
        if ok is None:
            problems.append(f"{node} does not exist")
        elif not ok:
            problems.append(
                f"{node}: edged's user may not read and write it "
                "(install packaging/udev/70-edgefleet-accelerators.rules)"
            )
    return tuple(problems)
