"""``edgectl describe modelconfig NAME --device DEVICE``: the config a device gets, merged as
the hub merges it (:func:`edgefleet.api.modelconfigs.merge_for_device`, over the labels the
hub shows for the device), each value with the step it came from. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from edgefleet.api import parse_manifest
from edgefleet.api.modelconfigs import ModelConfig, merge_for_device


def describe_for_device(config_doc: Mapping[str, Any], device_doc: Mapping[str, Any]) -> str:
    """The merged result for one device: the steps in order, then every value and its source."""
    config = parse_manifest({k: v for k, v in config_doc.items() if k != "status"})
    assert isinstance(config, ModelConfig)
    device = str(device_doc.get("metadata", {}).get("name", ""))
    labels = dict(device_doc.get("metadata", {}).get("labels", {}))
    merged = merge_for_device(config, device, labels)
    lines = [
        f"ModelConfig:  {config.name} (model {config.spec.model})",
        f"Device:       {device}",
        "Labels:       " + (",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>"),
        f"Digest:       {merged.digest()}",
        "Merged in this order (the last wins):",
        *(f"  {i + 1}. {step}" for i, step in enumerate(merged.steps)),
        "Values:",
    ]
    width = max((len(p) for p in merged.sources), default=0)
    for path, source in merged.sources.items():
        value = _value_at(merged.document(), path)
        lines.append(f"  {path.ljust(width)}  = {value}   <- {source}")
    if not merged.sources:
        lines.append("  <none>")
    return "\n".join(lines)


def _value_at(document: Mapping[str, Any], path: str) -> str:
    """The value at a leaf path (``data.zones``, ``data["a b"][0]`` never: leaves are keys)."""
    value: Any = document
    for part in _split(path):
        value = value.get(part) if isinstance(value, Mapping) else None
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _split(path: str) -> list[str]:
    """``data.a["b.c"].d`` -> ``["data", "a", "b.c", "d"]`` (as ``field_path`` writes it)."""
    parts: list[str] = []
    i = 0
    while i < len(path):
        if path[i] == ".":
            i += 1
        elif path[i] == "[":
            decoder = json.JSONDecoder()
            key, end = decoder.raw_decode(path, i + 1)
            parts.append(str(key))
            i = end + 1
        else:
            j = i
            while j < len(path) and path[j] not in ".[":
                j += 1
            parts.append(path[i:j])
            i = j
    return parts
