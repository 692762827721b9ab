"""Pure: the labels a device publishes about itself, merged with the operator's labels.

Discovered labels: ``arch`` (amd64, arm64...), ``os``, and for usable accelerators
``accelerator`` (the class of the first one, in the order gpu, npu, tpu, vpu),
``accelerator.vendor``, ``accelerator.kind`` (``nvidia-gpu``) and ``accelerator.<class>`` (the
count of that class). Operator labels (``D/labels.json``, written at enrollment, then
``[device.labels]`` in edged.toml) win over discovered ones with the same key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from edged.discovery.hardware import Accelerator, AcceleratorClass, DeviceFacts

CLASS_ORDER = (
    AcceleratorClass.GPU,
    AcceleratorClass.NPU,
    AcceleratorClass.TPU,
    AcceleratorClass.VPU,
)


def discovered_labels(facts: DeviceFacts, accelerators: Sequence[Accelerator]) -> dict[str, str]:
    labels = {"arch": facts.arch, "os": facts.os}
    usable = sorted(
        (a for a in accelerators if a.usable), key=lambda a: (CLASS_ORDER.index(a.cls), a.id)
    )
    if usable:
        first = usable[0]
        labels["accelerator"] = first.cls.value
        labels["accelerator.vendor"] = first.vendor
        labels["accelerator.kind"] = first.kind
        for cls in CLASS_ORDER:
            count = sum(1 for a in usable if a.cls is cls)
            if count:
                labels[f"accelerator.{cls.value}"] = str(count)
    return labels


def merge_labels(discovered: Mapping[str, str], *operator: Mapping[str, str]) -> dict[str, str]:
    """Discovered labels, overridden by each operator mapping in turn."""
    out = dict(discovered)
    for labels in operator:
        out.update(labels)
    return dict(sorted(out.items()))
