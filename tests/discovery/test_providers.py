"""Provider mapping and selection: pure functions, tested as tables."""

from __future__ import annotations

import pytest

from edged.discovery.hardware import Accelerator, AcceleratorClass
from edged.discovery.providers import providers_for, select_providers

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TRT = "TensorrtExecutionProvider"
OV = "OpenVINOExecutionProvider"
ROCM = "ROCMExecutionProvider"
RKNPU = "RknpuExecutionProvider"
XNN = "XnnpackExecutionProvider"
ALL = (CPU, CUDA, TRT, OV, ROCM, RKNPU, XNN, "MIGraphXExecutionProvider", "QNNExecutionProvider")


def acc(vendor: str, cls: str, usable: bool = True, id: str = "a0") -> Accelerator:
    return Accelerator(
        id=id,
        cls=AcceleratorClass(cls),
        vendor=vendor,
        model="m",
        driver="d",
        usable=usable,
        problems=() if usable else ("/dev/x does not exist",),
    )


NV, AMD, INTEL_NPU, INTEL_GPU = (
    acc("nvidia", "gpu"),
    acc("amd", "gpu"),
    acc("intel", "npu"),
    acc("intel", "gpu"),
)
HAILO, CORAL, RK = acc("hailo", "npu"), acc("google", "tpu"), acc("rockchip", "npu")


@pytest.mark.parametrize(
    ("accelerator", "available", "enabled"),
    [
        (NV, ALL, [(CUDA, True), (TRT, True)]),
        (NV, (CPU,), [(CUDA, False), (TRT, False)]),
        (AMD, ALL, [(ROCM, True), ("MIGraphXExecutionProvider", True)]),
        (INTEL_NPU, ALL, [(OV, True)]),
        (INTEL_GPU, ALL, [(OV, True)]),
        (acc("intel", "vpu"), ALL, [(OV, True)]),
        (RK, ALL, [(RKNPU, True)]),
        (acc("qualcomm", "npu"), ALL, [("QNNExecutionProvider", True)]),
        (HAILO, ALL, []),
        (CORAL, ALL, []),
    ],
    ids=lambda v: v.kind if isinstance(v, Accelerator) else None,
)
def test_providers_enabled_by_each_accelerator(
    accelerator: Accelerator, available: tuple[str, ...], enabled: list[tuple[str, bool]]
) -> None:
    assert list(providers_for(accelerator, available)) == enabled


# name, preferred, resources.accelerator, accelerators, ORT available, chosen, fell back, reason
SELECT = [
    ("cpu only", [CPU], None, [], ALL, [CPU], False, ""),
    ("cuda with a gpu", [CUDA, CPU], None, [NV], ALL, [CUDA, CPU], False, ""),
    ("cuda without a gpu falls back", [CUDA, CPU], None, [], ALL, [CPU], True, "none found"),
    (
        "cuda, gpu unusable",
        [CUDA, CPU],
        None,
        [acc("nvidia", "gpu", False)],
        ALL,
        [CPU],
        True,
        "not usable (a0: /dev/x does not exist)",
    ),
    ("cuda without fallback cannot run", [CUDA], None, [], ALL, [], False, "needs an NVIDIA GPU"),
    ("jetson enables cuda", [TRT, CUDA, CPU], None, [NV], ALL, [TRT, CUDA, CPU], False, ""),
    (
        "ort build lacks cuda",
        [CUDA, CPU],
        None,
        [NV],
        (CPU,),
        [CPU],
        True,
        "not in this onnxruntime build",
    ),
    ("amd gpu does not enable cuda", [CUDA, ROCM, CPU], None, [AMD], ALL, [ROCM, CPU], True, ""),
    ("openvino on intel npu", [OV, CPU], None, [INTEL_NPU], ALL, [OV, CPU], False, ""),
    (
        "openvino needs an intel device, not the cpu",
        [OV],
        None,
        [],
        ALL,
        [],
        False,
        "Intel GPU, NPU or VPU",
    ),
    ("device-free providers need no device", [XNN, CPU], None, [], ALL, [XNN, CPU], False, ""),
    ("device-free but not in ort", [XNN, CPU], None, [], (CPU,), [CPU], True, "not in this"),
    ("accelerator class present", [OV, CPU], "npu", [INTEL_NPU], ALL, [OV, CPU], False, ""),
    (
        "accelerator class absent, fallback allowed",
        [OV, CPU],
        "npu",
        [INTEL_GPU],
        ALL,
        [CPU],
        True,
        "resources.accelerator 'npu': no usable one (none found)",
    ),
    ("accelerator class absent, no fallback", [OV], "npu", [], ALL, [], False, "npu"),
    ("accelerator by vendor", [CUDA, CPU], "nvidia", [NV, INTEL_NPU], ALL, [CUDA, CPU], False, ""),
    ("accelerator by kind", [CUDA, CPU], "nvidia-gpu", [NV], ALL, [CUDA, CPU], False, ""),
    (
        "hailo requested: no ORT provider, CPU allowed",
        [CPU],
        "hailo",
        [HAILO],
        ALL,
        [CPU],
        False,
        "",
    ),
    (
        "requested npu does not enable the gpu's cuda",
        [CUDA, CPU],
        "npu",
        [NV, INTEL_NPU],
        ALL,
        [CPU],
        True,
        "not enabled by a 'npu' accelerator",
    ),
    ("rknpu", [RKNPU, CPU], None, [RK], ALL, [RKNPU, CPU], False, ""),
    (
        "never on linux",
        ["CoreMLExecutionProvider", CPU],
        None,
        [],
        (*ALL, "CoreMLExecutionProvider"),
        [CPU],
        True,
        "does not run on Linux",
    ),
    (
        "unknown provider offered by ort",
        ["VitisAIExecutionProvider", CPU],
        None,
        [],
        ("VitisAIExecutionProvider", CPU),
        ["VitisAIExecutionProvider", CPU],
        False,
        "",
    ),
]


@pytest.mark.parametrize(
    ("case", "preferred", "wanted", "accelerators", "available", "chosen", "fell_back", "reason"),
    SELECT,
    ids=[s[0] for s in SELECT],
)
def test_select_providers(
    case: str,
    preferred: list[str],
    wanted: str | None,
    accelerators: list[Accelerator],
    available: tuple[str, ...],
    chosen: list[str],
    fell_back: bool,
    reason: str,
) -> None:
    sel = select_providers(preferred, wanted, accelerators, available)
    assert list(sel.providers) == chosen
    assert sel.fell_back is fell_back
    assert sel.runnable is bool(chosen)
    assert reason in sel.message
    if chosen == list(preferred):
        assert sel.message == ""
