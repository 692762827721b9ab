"""The security in force, with its baselines persisted in a real file: accepted, kept across a
restart, and heard of only when it changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edged.runtime.baselining import SecurityInForce
from edged.runtime.securing import DeviceSecurity
from edgefleet.api import SecurityBaseline, parse_manifest
from edgefleet.errors import StateError

DEVICE = DeviceSecurity(sandbox="landlock", edged_root=True)


def baseline(name: str, **spec: Any) -> SecurityBaseline:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "SecurityBaseline",
        "metadata": {"name": name},
        "spec": spec,
    }
    b = parse_manifest(doc)
    assert isinstance(b, SecurityBaseline)
    return b


def test_baselines_are_kept_across_a_restart_and_changes_are_heard_of(tmp_path: Path) -> None:
    path = tmp_path / "state" / "baselines.json"
    changes: list[DeviceSecurity] = []
    security = SecurityInForce(DEVICE, path, on_change=changes.append)
    assert security() == DEVICE and not path.exists()  # nothing accepted yet

    strict = baseline("strict", requireSandbox=True, drift={"action": "quarantine"})
    security.accept([strict])
    assert security().require_sandbox and security().drift_action == "quarantine"
    assert changes == [security()]
    security.accept([strict])  # the same again: nothing to do
    assert len(changes) == 1

    restarted = SecurityInForce(DEVICE, path, on_change=changes.append)
    assert restarted() == security()  # before any source is read
    assert len(changes) == 1

    restarted.accept([])  # the baseline was deleted
    assert restarted() == DEVICE and changes[-1] == DEVICE
    assert SecurityInForce(DEVICE, path, on_change=changes.append)() == DEVICE


def test_a_file_that_is_not_a_baselines_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    path.write_text('{"format": 99, "baselines": []}')
    with pytest.raises(StateError, match="not a baselines file"):
        SecurityInForce(DEVICE, path, on_change=lambda _: None)
