"""Effects: reading accelerators from udev with pyudev, and following hotplug.

:func:`read_records` enumerates the subsystems accelerators live in and turns each candidate
into a :class:`DeviceRecord` (a pure snapshot: ids, driver, nodes and whether edged's user may
read and write them). :class:`UdevWatch` puts a udev monitor's socket into the asyncio loop
(``loop.add_reader``): no thread, no polling. pyudev is imported here only.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from typing import Any

from edged.discovery.classifying import JETSON_DRIVERS, PCI_VENDORS, USB_IDS
from edged.discovery.hardware import DeviceRecord
from edgefleet.errors import EdgefleetError
from edgefleet.logs import get_logger

log = get_logger(__name__)

SUBSYSTEMS = ("drm", "accel", "apex", "hailo_chardev", "misc", "pci", "usb", "platform")
_USB_VENDORS = {v for v, _ in USB_IDS}
_JETSON_NODES = ("/dev/nvhost-ctrl-gpu", "/dev/nvhost-gpu", "/dev/nvmap")


class UdevError(EdgefleetError):
    """udev cannot be read or followed (no /sys, no netlink socket in this container...)."""


def _hex(value: object) -> int | None:
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else str(value)
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None


def _decimal(value: object) -> int | None:
    text = value.decode() if isinstance(value, bytes) else str(value or "")
    return int(text.strip()) if text.strip().isdigit() else None


def node_access(node: str) -> bool | None:
    """``None`` if ``node`` does not exist, else whether edged's user may read and write it."""
    if not os.path.exists(node):
        return None
    return os.access(node, os.R_OK | os.W_OK)


def _attr(device: Any, name: str) -> Any:
    try:
        return device.attributes.get(name)
    except (KeyError, OSError, UnicodeDecodeError):
        return None


def _pci_ids(pci: Any) -> tuple[int | None, int | None, int | None]:
    props = pci.properties
    vendor = device = None
    pci_id = props.get("PCI_ID", "")
    if ":" in pci_id:
        left, right = pci_id.split(":", 1)
        vendor, device = _hex(left), _hex(right)
    if vendor is None:
        vendor, device = _hex(_attr(pci, "vendor")), _hex(_attr(pci, "device"))
    pci_class = _hex(props.get("PCI_CLASS")) or _hex(_attr(pci, "class"))
    return vendor, device, pci_class


def _candidate(device: Any) -> bool:
    """A cheap filter (udev properties only) before a record is built."""
    sub = device.subsystem
    name = device.sys_name
    props = device.properties
    if sub == "drm":
        return bool(name.startswith("renderD"))
    if sub in ("accel", "apex", "hailo_chardev"):
        return True
    if sub == "misc":
        return bool(name.startswith("hailo") or name == "rknpu")
    if sub == "pci":
        vendor = _hex(props.get("PCI_ID", ":").split(":")[0])
        cls = (_hex(props.get("PCI_CLASS")) or 0) >> 16
        return (vendor in PCI_VENDORS and (cls in (0x03, 0x12) or vendor in (0x1E60, 0x1AC1))) or (
            vendor == 0x17CB and cls == 0x12
        )
    if sub == "usb":
        product = props.get("PRODUCT", "")
        return props.get("DEVTYPE") == "usb_device" and _hex(product.split("/")[0]) in _USB_VENDORS
    if sub == "platform":
        driver = props.get("DRIVER", "")
        return (
            driver in JETSON_DRIVERS
            or driver == "rknpu"
            or (
                "OF_COMPATIBLE_0" in props
                and any(
                    ("gpu" in v or "rknpu" in v or v.startswith("nvidia,g"))
                    for k, v in props.items()
                    if k.startswith("OF_COMPATIBLE_") and k != "OF_COMPATIBLE_N"
                )
            )
        )
    return False


def _record(device: Any, nvidia_index: dict[str, int]) -> DeviceRecord:
    props = device.properties
    pci = device if device.subsystem == "pci" else device.find_parent("pci")
    vendor = dev_id = pci_class = None
    physical = physical_driver = model = ""
    memory = None
    if pci is not None:
        vendor, dev_id, pci_class = _pci_ids(pci)
        physical, physical_driver = pci.sys_path, pci.driver or ""
        model = pci.properties.get("ID_MODEL_FROM_DATABASE", "")
        if vendor == 0x1002:
            memory = _decimal(_attr(pci, "mem_info_vram_total"))
    usb_vendor = usb_product = None
    if device.subsystem == "usb":
        parts = props.get("PRODUCT", "").split("/")
        if len(parts) >= 2:
            usb_vendor, usb_product = _hex(parts[0]), _hex(parts[1])
        physical = device.sys_path
        model = props.get("ID_MODEL_FROM_DATABASE", "")
    platform = device if device.subsystem == "platform" else None
    if platform is None and pci is None:
        platform = device.find_parent("platform")
    compatible: tuple[str, ...] = ()
    if platform is not None:
        pprops = platform.properties
        compatible = tuple(
            pprops[k]
            for k in sorted(pprops)
            if k.startswith("OF_COMPATIBLE_") and k != "OF_COMPATIBLE_N"
        )
        if not physical:
            physical, physical_driver = platform.sys_path, platform.driver or ""
    extra: list[str] = []
    if device.subsystem == "pci" and vendor == 0x10DE and physical_driver == "nvidia":
        extra = ["/dev/nvidiactl", f"/dev/nvidia{nvidia_index.get(device.sys_path, 0)}"]
    elif device.subsystem == "platform" and (physical_driver or "") in JETSON_DRIVERS:
        extra = [n for n in _JETSON_NODES if os.path.exists(n)] or [_JETSON_NODES[0]]
    devnode = device.device_node or ""
    nodes = [n for n in (devnode, *extra) if n]
    return DeviceRecord(
        sys_path=device.sys_path,
        subsystem=device.subsystem or "",
        sys_name=device.sys_name,
        devtype=device.device_type or "",
        driver=device.driver or "",
        devnode=devnode,
        physical=physical,
        physical_driver=physical_driver,
        pci_vendor=vendor,
        pci_device=dev_id,
        pci_class=pci_class,
        usb_vendor=usb_vendor,
        usb_product=usb_product,
        of_compatible=compatible,
        model=model,
        memory_bytes=memory,
        extra_nodes=tuple(extra),
        node_access={n: node_access(n) for n in nodes},
    )


def read_records(context: Any = None) -> list[DeviceRecord]:
    """Every udev device that may be (part of) an accelerator, as records."""
    try:
        import pyudev

        ctx = context or pyudev.Context()
        devices: list[Any] = []
        for sub in SUBSYSTEMS:
            devices.extend(d for d in ctx.list_devices(subsystem=sub) if _candidate(d))
        nvidia = sorted(
            d.sys_path
            for d in devices
            if d.subsystem == "pci" and d.properties.get("PCI_ID", "").upper().startswith("10DE:")
        )
        index = {path: i for i, path in enumerate(nvidia)}
        return [_record(d, index) for d in devices]
    except (ImportError, OSError) as exc:  # pyudev.DeviceNotFoundError is a LookupError
        raise UdevError(f"cannot read udev: {exc}") from exc


class UdevWatch:
    """A udev monitor on the asyncio loop; calls ``on_event(action, sys_path)`` per event."""

    def __init__(
        self, on_event: Callable[[str, str], None], subsystems: Iterable[str] = SUBSYSTEMS
    ):
        self._on_event = on_event
        self._subsystems = tuple(subsystems)
        self._monitor: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        try:
            import pyudev

            monitor = pyudev.Monitor.from_netlink(pyudev.Context())
            for sub in self._subsystems:
                monitor.filter_by(sub)
            monitor.start()
        except (ImportError, OSError, ValueError) as exc:
            raise UdevError(f"cannot follow udev events: {exc}") from exc
        self._monitor = monitor
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(monitor.fileno(), self._readable)

    def _readable(self) -> None:
        monitor = self._monitor
        while monitor is not None:
            try:
                device = monitor.poll(timeout=0)
            except OSError as exc:
                log.warning("udev monitor read failed", error=str(exc))
                return
            if device is None:
                return
            self._on_event(device.action or "change", device.sys_path)

    def stop(self) -> None:
        if self._monitor is not None and self._loop is not None:
            self._loop.remove_reader(self._monitor.fileno())
            self._monitor = None
