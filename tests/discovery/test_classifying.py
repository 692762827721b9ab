"""Classification: real pyudev on umockdev testbeds (one per accelerator kind), and a table."""

from __future__ import annotations

from typing import Any

import pytest
from umockdevs import discover

from edged.discovery.classifying import merge
from edged.discovery.hardware import DeviceRecord

pytestmark = pytest.mark.usefixtures("umockdev")

# file, extra /dev nodes, [(class, vendor, driver, nodes, usable, model contains)]
CASES: list[tuple[str, tuple[str, ...], list[tuple[str, str, str, list[str], bool, str]]]] = [
    (
        "nvidia-dgpu.umockdev",
        ("/dev/nvidia0", "/dev/nvidiactl"),
        [
            (
                "gpu",
                "nvidia",
                "nvidia",
                ["/dev/dri/renderD128", "/dev/nvidia0", "/dev/nvidiactl"],
                True,
                "RTX 3090",
            )
        ],
    ),
    (
        "nvidia-dgpu.umockdev",
        (),  # the driver's nodes are missing (nvidia-modprobe did not run)
        [
            (
                "gpu",
                "nvidia",
                "nvidia",
                ["/dev/dri/renderD128", "/dev/nvidia0", "/dev/nvidiactl"],
                False,
                "RTX",
            )
        ],
    ),
    ("amd-gpu.umockdev", (), [("gpu", "amd", "amdgpu", ["/dev/dri/renderD129"], True, "6800")]),
    ("intel-gpu.umockdev", (), [("gpu", "intel", "i915", ["/dev/dri/renderD130"], True, "Iris")]),
    ("jetson.umockdev", (), [("gpu", "nvidia", "gv11b", ["/dev/nvhost-ctrl-gpu"], True, "Jetson")]),
    ("intel-npu.umockdev", (), [("npu", "intel", "intel_vpu", ["/dev/accel/accel0"], True, "NPU")]),
    ("coral-pcie.umockdev", (), [("tpu", "google", "apex", ["/dev/apex_0"], True, "Edge TPU")]),
    (
        "coral-usb.umockdev",
        (),
        [
            ("tpu", "google", "usb", ["/dev/bus/usb/001/002"], True, "Coral USB"),
            ("tpu", "google", "usb", ["/dev/bus/usb/001/003"], True, "Coral USB"),
        ],
    ),
    ("hailo.umockdev", (), [("npu", "hailo", "hailo_pci", ["/dev/hailo0"], True, "Hailo-8")]),
    ("hailo-nodriver.umockdev", (), [("npu", "hailo", "", [], False, "Hailo")]),
    (
        "rockchip-npu.umockdev",
        (),
        [("npu", "rockchip", "RKNPU", ["/dev/dri/renderD129"], True, "Rockchip")],
    ),
    (
        "movidius.umockdev",
        (),
        [
            ("vpu", "intel", "usb", ["/dev/bus/usb/001/004"], True, "Myriad 2"),
            ("vpu", "intel", "usb", ["/dev/bus/usb/001/005"], True, "Myriad X"),
            ("vpu", "intel", "usb", ["/dev/bus/usb/001/006"], True, "booted"),
        ],
    ),
]


@pytest.mark.parametrize(("file", "touch", "expected"), CASES, ids=[c[0] for c in CASES])
def test_each_kind_is_recognised_through_udev(
    file: str, touch: tuple[str, ...], expected: list[Any]
) -> None:
    found = discover(file, touch=touch)
    got = [
        (a["class"], a["vendor"], a["driver"], a["nodes"], a["usable"], a["model"]) for a in found
    ]
    assert len(got) == len(expected), found
    for g, (cls, vendor, driver, nodes, usable, model) in zip(got, expected, strict=True):
        assert g[:5] == (cls, vendor, driver, nodes, usable), found
        assert model in g[5]


def test_amd_vram_and_why_not_usable() -> None:
    (amd,) = discover("amd-gpu.umockdev")
    assert amd["memoryBytes"] == 17163091968
    (nv,) = discover("nvidia-dgpu.umockdev")
    assert nv["problems"] == ["/dev/nvidia0 does not exist", "/dev/nvidiactl does not exist"]
    (hailo,) = discover("hailo-nodriver.umockdev")
    assert hailo["problems"] == ["no kernel driver is bound to the device"]


def test_several_kinds_at_once() -> None:
    found = discover("intel-npu.umockdev", "hailo.umockdev", "coral-usb.umockdev")
    assert sorted(a["vendor"] for a in found) == ["google", "google", "hailo", "intel"]


def _rec(**kw: Any) -> DeviceRecord:
    kw.setdefault("sys_path", "/sys/devices/x/" + kw.get("sys_name", "dev"))
    return DeviceRecord(**kw)


PCI = "/sys/devices/pci0000:00/0000:01:00.0"
TABLE: list[tuple[str, list[DeviceRecord], list[tuple[str, str, bool]]]] = [
    (
        "render node of an unknown vendor is not an accelerator",
        [_rec(subsystem="drm", sys_name="renderD128", physical=PCI, pci_vendor=0x1AF4)],
        [],
    ),
    (
        "card nodes are ignored (render nodes suffice)",
        [_rec(subsystem="drm", sys_name="card0", physical=PCI, pci_vendor=0x1002)],
        [],
    ),
    (
        "node without permission for edged's user",
        [
            _rec(
                subsystem="accel",
                sys_name="accel0",
                devnode="/dev/accel/accel0",
                physical=PCI,
                physical_driver="intel_vpu",
                node_access={"/dev/accel/accel0": False},
            )
        ],
        [("intel-npu", "/dev/accel/accel0: edged's user may not read and write it", False)],
    ),
    (
        "pci device and render node merge into one accelerator",
        [
            _rec(
                subsystem="pci",
                sys_path=PCI,
                pci_vendor=0x1002,
                pci_device=0x73BF,
                pci_class=0x030000,
                physical=PCI,
                physical_driver="amdgpu",
            ),
            _rec(
                subsystem="drm",
                sys_name="renderD128",
                devnode="/dev/dri/renderD128",
                physical=PCI,
                physical_driver="amdgpu",
                pci_vendor=0x1002,
                node_access={"/dev/dri/renderD128": True},
            ),
        ],
        [("amd-gpu", "", True)],
    ),
    (
        "accel device of an unknown driver is an NPU of its PCI vendor",
        [
            _rec(
                subsystem="accel",
                sys_name="accel0",
                devnode="/dev/accel/accel0",
                physical=PCI,
                physical_driver="qaic",
                node_access={"/dev/accel/accel0": True},
            )
        ],
        [("qualcomm-npu", "", True)],
    ),
    (
        "a USB device of another vendor is not an accelerator",
        [_rec(subsystem="usb", devtype="usb_device", usb_vendor=0x046D, usb_product=0xC52B)],
        [],
    ),
    (
        "Tegra GPU by OF_COMPATIBLE, no driver bound",
        [
            _rec(
                subsystem="platform",
                sys_name="17000000.gpu",
                of_compatible=("nvidia,tegra194-gpu",),
                extra_nodes=("/dev/nvhost-ctrl-gpu",),
                node_access={"/dev/nvhost-ctrl-gpu": None},
            )
        ],
        [("nvidia-gpu", "no kernel driver is bound to the device", False)],
    ),
]


@pytest.mark.parametrize(("case", "records", "expected"), TABLE, ids=[t[0] for t in TABLE])
def test_merge_table(
    case: str, records: list[DeviceRecord], expected: list[tuple[str, str, bool]]
) -> None:
    got = merge(records)
    assert len(got) == len(expected), got
    for acc, (kind, problem, usable) in zip(got, expected, strict=True):
        assert acc.kind == kind
        assert acc.usable is usable
        if problem:
            assert any(problem in p for p in acc.problems), acc.problems
