"""Pure: which ONNX Runtime execution providers the hardware enables, and each workload's choice.

Rules (documented in docs/edged.md, "Discovery"):

* Providers that need no device (CPU, XNNPACK, DNNL, ACL, ArmNN, Azure) are usable whenever the
  onnxruntime build offers them.
* CUDA and TensorRT need a usable NVIDIA GPU (discrete or Jetson); ROCm and MIGraphX an AMD
  GPU; OpenVINO an Intel GPU, NPU or VPU (OpenVINO also runs on CPUs, but a spec that lists it
  asks for the accelerator: list ``CPUExecutionProvider`` after it to allow the CPU); Rknpu a
  Rockchip NPU; QNN a Qualcomm NPU. CoreML, DirectML and NNAPI never run on a Linux device.
* Coral (Edge TPU) and Hailo enable no execution provider: their vendor runtimes serve them.
* A provider this table does not know is usable when the onnxruntime build offers it.

A spec's ``runtime.executionProviders`` is the ordered set of allowed providers; falling back
to any later entry is allowed, so CPU fallback is allowed iff ``CPUExecutionProvider`` is
listed. ``resources.accelerator`` (a class such as ``npu``, a vendor such as ``hailo``, or a
kind such as ``nvidia-gpu``) must match a usable accelerator, else only providers that need no
device may run, and only if the list allows them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from edged.discovery.hardware import Accelerator, AcceleratorClass

CPU = "CPUExecutionProvider"
DEVICE_FREE = frozenset(
    {
        CPU,
        "XnnpackExecutionProvider",
        "DnnlExecutionProvider",
        "ACLExecutionProvider",
        "ArmNNExecutionProvider",
        "AzureExecutionProvider",
    }
)
# provider -> (vendor, classes) pairs of accelerators that enable it
NEEDS: dict[str, tuple[tuple[str, frozenset[AcceleratorClass]], ...]] = {
    "CUDAExecutionProvider": (("nvidia", frozenset({AcceleratorClass.GPU})),),
    "TensorrtExecutionProvider": (("nvidia", frozenset({AcceleratorClass.GPU})),),
    "ROCMExecutionProvider": (("amd", frozenset({AcceleratorClass.GPU})),),
    "MIGraphXExecutionProvider": (("amd", frozenset({AcceleratorClass.GPU})),),
    "OpenVINOExecutionProvider": (
        ("intel", frozenset({AcceleratorClass.GPU, AcceleratorClass.NPU, AcceleratorClass.VPU})),
    ),
    "RknpuExecutionProvider": (("rockchip", frozenset({AcceleratorClass.NPU})),),
    "QNNExecutionProvider": (("qualcomm", frozenset({AcceleratorClass.NPU})),),
}
NEVER_ON_LINUX = frozenset(
    {"CoreMLExecutionProvider", "DmlExecutionProvider", "NnapiExecutionProvider"}
)
VENDOR_RUNTIME_ONLY = {
    "google": "no ONNX Runtime execution provider; use the vendor runtime (Edge TPU / PyCoral)",
    "hailo": "no ONNX Runtime execution provider; use the vendor runtime (HailoRT)",
}
_WHAT = {
    "nvidia": "an NVIDIA GPU",
    "amd": "an AMD GPU",
    "intel": "an Intel GPU, NPU or VPU",
    "rockchip": "a Rockchip NPU",
    "qualcomm": "a Qualcomm NPU",
}


def _enables(acc: Accelerator, provider: str) -> bool:
    return any(acc.vendor == v and acc.cls in classes for v, classes in NEEDS.get(provider, ()))


def providers_for(acc: Accelerator, available: Collection[str]) -> tuple[tuple[str, bool], ...]:
    """The providers ``acc`` enables, each with whether the onnxruntime build offers it. Pure."""
    return tuple((p, p in available) for p in NEEDS if _enables(acc, p))


def matches_accelerator(acc: Accelerator, wanted: str) -> bool:
    """``resources.accelerator``: a class (``npu``), a vendor (``hailo``) or a kind."""
    return wanted in (acc.cls.value, acc.vendor, acc.kind)


def provider_blocker(
    provider: str, accelerators: Sequence[Accelerator], available: Collection[str]
) -> str | None:
    """Why ``provider`` cannot be used on this device now, or ``None`` if it can. Pure."""
    if provider in NEVER_ON_LINUX:
        return f"{provider} does not run on Linux"
    if provider not in available:
        return f"{provider} is not in this onnxruntime build"
    needs = NEEDS.get(provider)
    if needs is None:
        return None
    present = [a for a in accelerators if _enables(a, provider)]
    if any(a.usable for a in present):
        return None
    vendor = needs[0][0]
    if not present:
        return f"{provider} needs {_WHAT.get(vendor, vendor)}; none found"
    why = "; ".join(f"{a.id}: {', '.join(a.problems)}" for a in present)
    return f"{provider} needs {_WHAT.get(vendor, vendor)}; not usable ({why})"


@dataclass(frozen=True, slots=True)
class ProviderSelection:
    """The providers a workload runs with (empty: it cannot run here) and why not its first."""

    providers: tuple[str, ...]
    preferred: tuple[str, ...]  # the spec's list
    reasons: tuple[str, ...] = ()  # one per skipped provider or unmet accelerator request

    @property
    def runnable(self) -> bool:
        return bool(self.providers)

    @property
    def fell_back(self) -> bool:
        return bool(self.providers) and self.providers[0] != self.preferred[0]

    @property
    def message(self) -> str:
        return "; ".join(self.reasons)


def select_providers(
    preferred: Sequence[str],
    accelerator: str | None,
    accelerators: Sequence[Accelerator],
    available: Collection[str],
) -> ProviderSelection:
    """The usable providers of ``preferred``, in its order. Pure; tested as a table.

    ``accelerator`` is ``resources.accelerator``; when no usable accelerator matches it, only
    providers that need no device remain allowed (the spec's fallback), with a reason.
    """
    reasons: list[str] = []
    allowed = list(preferred)
    if accelerator:
        if not any(a.usable and matches_accelerator(a, accelerator) for a in accelerators):
            present = [a for a in accelerators if matches_accelerator(a, accelerator)]
            detail = (
                "; ".join(f"{a.id}: {', '.join(a.problems)}" for a in present)
                if present
                else "none found"
            )
            reasons.append(f"resources.accelerator {accelerator!r}: no usable one ({detail})")
            allowed = [p for p in allowed if p in DEVICE_FREE]
        else:
            # Device-gated providers must be enabled by a matching accelerator.
            usable = [a for a in accelerators if a.usable and matches_accelerator(a, accelerator)]
            allowed = [p for p in allowed if p not in NEEDS or any(_enables(a, p) for a in usable)]
    chosen = []
    for p in preferred:
        blocker = provider_blocker(p, accelerators, available)
        if p not in allowed:
            if blocker is None and accelerator:
                reasons.append(f"{p} is not enabled by a {accelerator!r} accelerator")
            elif blocker is not None:
                reasons.append(blocker)
            continue
        if blocker is not None:
            reasons.append(blocker)
            continue
        chosen.append(p)
    return ProviderSelection(tuple(chosen), tuple(preferred), tuple(reasons))
