"""Health policy: a pure function with hysteresis, tested as tables; labels."""

from __future__ import annotations

from typing import Any

import pytest

from edged.discovery.hardware import (
    Accelerator,
    AcceleratorClass,
    DeviceFacts,
    HealthSample,
    normalize_arch,
)
from edged.discovery.health import HealthVerdict, evaluate_health
from edged.discovery.labelling import discovered_labels, merge_labels
from edgefleet.api import DeviceHealthPolicy, DeviceHealthPolicySpec, ObjectMeta

MiB = 1 << 20


def policy(**kw: Any) -> DeviceHealthPolicy:
    return DeviceHealthPolicy(metadata=ObjectMeta(name="p"), spec=DeviceHealthPolicySpec(**kw))


def sample(**kw: Any) -> HealthSample:
    base: dict[str, Any] = {"uptime_s": 3600.0, "memory_available_bytes": 1024 * MiB}
    base.update(kw)
    return HealthSample(**base)


NPU = Accelerator(
    id="0", cls=AcceleratorClass.NPU, vendor="hailo", model="", driver="h", usable=True
)
TEMP = {"max_cpu_temperature_c": 80.0}  # 5% hysteresis: back at 76 °C or less

# case, policy, temperatures in order, expected schedulable after each
SEQUENCES = [
    ("below stays in", TEMP, [70, 75, 79.9, 80], [True, True, True, True]),
    ("above goes out", TEMP, [79, 80.1], [True, False]),
    ("at the threshold after out stays out", TEMP, [81, 80, 79, 77, 76.5], [False] * 5),
    ("back only past the margin", TEMP, [81, 78, 76, 77, 80], [False, False, True, True, True]),
    ("no flapping around the threshold", TEMP, [80.2, 79.8, 80.2, 79.8], [False] * 4),
    (
        "zero hysteresis flaps",
        {**TEMP, "hysteresis_percent": 0},
        [81, 80, 81],
        [False, True, False],
    ),
]


@pytest.mark.parametrize(
    ("case", "spec", "temps", "expected"), SEQUENCES, ids=[s[0] for s in SEQUENCES]
)
def test_temperature_hysteresis(
    case: str, spec: dict[str, Any], temps: list[float], expected: list[bool]
) -> None:
    p = policy(**spec)
    verdict: HealthVerdict | None = None
    got = []
    for t in temps:
        verdict = evaluate_health([p], sample(cpu_temperature_c=t), [], {}, verdict)
        got.append(verdict.schedulable)
    assert got == expected


def test_memory_hysteresis() -> None:
    p = policy(min_available_memory_bytes=100 * MiB, hysteresis_percent=10)
    v = evaluate_health([p], sample(memory_available_bytes=99 * MiB), [], {})
    assert not v.schedulable
    assert v.reasons == ("p: 99Mi of memory available, minAvailableMemory is 100Mi",)
    v = evaluate_health([p], sample(memory_available_bytes=105 * MiB), [], {}, v)
    assert not v.schedulable
    v = evaluate_health([p], sample(memory_available_bytes=110 * MiB), [], {}, v)
    assert v.schedulable


CHECKS = [
    ("empty policy", {}, sample(), True, ""),
    ("young device", {"min_uptime_s": 600}, sample(uptime_s=30), False, "minUptime"),
    ("unknown temperature is not a failure", TEMP, sample(), True, ""),
    ("disk", {"min_disk_free_bytes": 10 * MiB}, sample(disk_free_bytes=MiB), False, "minDiskFree"),
    ("required accelerator present", {"required_accelerators": ("npu",)}, sample(), True, ""),
    (
        "required accelerator absent",
        {"required_accelerators": ("gpu",)},
        sample(),
        False,
        "no usable 'gpu'",
    ),
    ("required label", {"required_labels": {"site": "a"}}, sample(), True, ""),
    (
        "required label differs",
        {"required_labels": {"zone": "b"}},
        sample(),
        False,
        "device has no zone label",
    ),
]


@pytest.mark.parametrize(("case", "spec", "s", "ok", "reason"), CHECKS, ids=[c[0] for c in CHECKS])
def test_checks(case: str, spec: dict[str, Any], s: HealthSample, ok: bool, reason: str) -> None:
    v = evaluate_health([policy(**spec)], s, [NPU], {"site": "a"})
    assert v.schedulable is ok
    assert reason in " ".join(v.reasons)


def test_every_policy_must_pass() -> None:
    a = policy(max_cpu_temperature_c=90.0)
    b = DeviceHealthPolicy(
        metadata=ObjectMeta(name="strict"),
        spec=DeviceHealthPolicySpec(max_cpu_temperature_c=60.0),
    )
    v = evaluate_health([a, b], sample(cpu_temperature_c=70.0), [], {})
    assert not v.schedulable
    assert v.reasons == ("strict: CPU at 70.0 °C, maxCpuTemperature is 60 °C",)


@pytest.mark.parametrize(
    ("machine", "arch"),
    [("x86_64", "amd64"), ("aarch64", "arm64"), ("armv7l", "armhf"), ("riscv64", "riscv64")],
)
def test_arch(machine: str, arch: str) -> None:
    assert normalize_arch(machine) == arch


def test_labels() -> None:
    facts = DeviceFacts(arch="arm64", cpu_count=4, memory_total_bytes=1)
    gpu = Accelerator(
        id="1", cls=AcceleratorClass.GPU, vendor="nvidia", model="", driver="x", usable=True
    )
    broken = Accelerator(
        id="2", cls=AcceleratorClass.TPU, vendor="google", model="", driver="", usable=False
    )
    labels = discovered_labels(facts, [NPU, gpu, broken])
    assert labels == {
        "arch": "arm64",
        "os": "linux",
        "accelerator": "gpu",
        "accelerator.vendor": "nvidia",
        "accelerator.kind": "nvidia-gpu",
        "accelerator.gpu": "1",
        "accelerator.npu": "1",
    }
    assert discovered_labels(facts, [broken]) == {"arch": "arm64", "os": "linux"}
    merged = merge_labels(labels, {"site": "x", "arch": "cfg"}, {"arch": "enrolled"})
    assert merged["arch"] == "enrolled"
    assert merged["site"] == "x"
