"""``edgectl explain`` of the kinds only the hub makes (edgefleet/api/shown.py) against what
a hub shows: every field of fully filled Device, Model, BootstrapToken, Region and Event documents,
made by the hub's own presenting code, is in the schema, and every field of the schema is
in one of them (nothing explained that is never shown). Pure."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from edgefleet.api.explaining import FieldSchema, explain
from edgefleet.v1 import federation_pb2
from hub.decide.devices import (
    AgentReport,
    Attestation,
    Device,
    DevicePhase,
    Health,
    RevisionPhase,
    RevisionReport,
    TrustState,
    WorkloadReport,
)
from hub.decide.placement import SecurityPolicy
from hub.decide.presentation import (
    device_object,
    fleet_compliance,
    model_object,
    token_object,
    with_store_metadata,
)
from hub.state import storekeys
from hub.state.regions import RegionState, Seen, region_key, region_object
from hub.state.tokens import TokenRecord
from hub.state.writer import _event

OPAQUE = (
    "<map[string]string>",
    "<map[string]value>",
    "<[]map[string]value>",
    "<map[string]integer>",
)


def _paths(doc: Any, schema: FieldSchema, prefix: str = "") -> Iterator[str]:
    """Every field path of ``doc``, walking the schema alongside: a name-keyed map
    (``<map[string]Object>``) is entered past its keys, opaque maps are not entered."""
    if isinstance(doc, list):
        for item in doc:
            yield from _paths(item, schema, prefix)
        return
    if not isinstance(doc, dict) or schema.type in OPAQUE:
        return
    if schema.type == "<map[string]Object>":
        for value in doc.values():
            yield from _paths(
                value, FieldSchema("", prefix, "<Object>", fields=schema.fields), prefix
            )
        return
    for key, value in doc.items():
        path = f"{prefix}.{key}" if prefix else key
        yield path
        child = schema.fields.get(key)
        if child is not None:
            yield from _paths(value, child, path)


def _schema_paths(node: FieldSchema) -> Iterator[str]:
    for child in node.fields.values():
        yield child.path
        yield from _schema_paths(child)


def _stamped(doc: dict[str, Any], key: str) -> dict[str, Any]:
    return with_store_metadata(doc, key=key, create_revision=3, mod_revision=9, created=1.0)


def _device() -> dict[str, Any]:
    full = RevisionReport(
        "2.0.0", "a" * 64, RevisionPhase.READY, 1, "r2", "Loaded", "ok", wanted=True,
        requests=10, errors=1, latency_p95_s=0.01, window_requests=5, accuracy=0.9,
        validation_samples=100, validation_reason="", validation_message="",
    )  # fmt: skip
    downloading = RevisionReport(
        "3.0.0", "b" * 64, RevisionPhase.DOWNLOADING, bytes_done=5, bytes_total=10,
        validation_reason="NoValidationSet", validation_message="none",
    )  # fmt: skip
    device = Device(
        name="dev-1",
        labels={"site": "a"},
        reported_labels={"arch": "x86"},
        cordoned=True,
        phase=DevicePhase.READY,
        last_heartbeat=5.0,
        health=Health(False, ("disk",)),
        attestation=Attestation(TrustState.UNTRUSTED, ("pcr",), 4.0, 3.0),
        facts={"cpus": 2},
        generation_acked=3,
        workloads={
            "det": WorkloadReport(
                "2.0.0",
                "r2",
                1,
                1,
                "Ready",
                ({"type": "Ready", "status": "True", "reason": "Ok", "message": "m"},),
                (full, downloading),
                {"min": 1},
                ({"replica": "det-0"},),
            )
        },
        certificate_serial="ab",
        enrolled_at=1.0,
        agent=AgentReport(
            "0.2.1",
            "0.2.0",
            "Trying",
            "0.2.1",
            "",
            "",
            1,
            "b",
            "x86_64",
            "cp311",
            True,
            "edged-next",
            2,
            9.0,
            10,
            10,
        ),
        compliance={
            "checked": True,
            "compliant": False,
            "action": "alert",
            "quarantined": "why",
            "findings": [{"kind": "StrayProcess", "subject": "7", "message": "m"}],
            "processesChecked": True,
            "opensWatched": True,
            "opensWatchReason": None,
        },
    )
    policy = SecurityPolicy(require_attestation=True)
    desired = storekeys.DesiredRecord(4, ("det",), "d")
    doc = device_object(device, policy, desired, {"other": "selector"})
    assert doc["status"]["taints"], "a taint with a reason and a value is shown"
    doc["status"]["taints"].append(
        {"key": "k", "value": "v", "effect": "NoSchedule", "reason": "r"}
    )
    return _stamped(doc, storekeys.device_key("dev-1"))


def _model() -> dict[str, Any]:
    record = storekeys.ModelRecord(
        "det", "1.0.0", "a" * 64, 10, b"{}", 1.0, {"validation.npz": "b" * 64}, b"{}"
    )
    return _stamped(model_object(record), storekeys.model_key("det", "1.0.0"))


def _token() -> dict[str, Any]:
    record = TokenRecord(
        id="abcdef", secret_sha256="x", created=1.0, expires=2.0, single_use=True, used=1.5,
        description="d", labels={"site": "a"}, device_labels=False, device_label_prefix="p/",
    )  # fmt: skip
    return _stamped(token_object(record), "/tokens/abcdef")


def _region() -> dict[str, Any]:
    state = RegionState("eu", "ab", 1.0, "aa", not_after=9.0)
    state.connected, state.connected_at, state.last_message = True, 2.0, 3.0
    state.generation_sent = 4
    report = federation_pb2.RegionReport(
        generation=4,
        deployments=[federation_pb2.RegionDeploymentStatus(name="det")],
        inventory=federation_pb2.RegionInventory(total=1, by_phase={"Ready": 1}),
        agent_upgrades=[
            federation_pb2.RegionAgentUpgradeStatus(
                name="up",
                version="1.0.1",
                phase="RolledBack",
                revision=1,
                reason="FailureThresholdReached",
                message="m",
                pool=1,
                failed_count=1,
                failed={"d": "CrashLoop"},
                root_revision=2,
            )
        ],
        agent_release_versions=["1.0.1"],
    )
    doc = region_object(state, Seen(report, 3.0, connected=True), now=5.0, here="hub")
    return _stamped(doc, region_key("eu"))


DOCS = {
    "Device": _device,
    "Model": _model,
    "BootstrapToken": _token,
    "Region": _region,
    "Event": lambda: _event("Device", "dev-1", "Normal", "Enrolled", "m"),
}


@pytest.mark.parametrize("kind", sorted(DOCS))
def test_every_field_the_hub_shows_is_explained_and_nothing_else(kind: str) -> None:
    schema = explain(kind)
    shown = set(_paths(DOCS[kind](), schema))
    declared = set(_schema_paths(schema))
    assert shown - declared == set(), "shown by the hub, not in edgefleet/api/shown.py"
    assert declared - shown == set(), "in edgefleet/api/shown.py, never shown by the hub"
    assert all(explain(kind, p).description for p in declared), "a field without a description"


def test_a_baselines_status_is_explained() -> None:
    status = fleet_compliance([Device(name="a")])
    schema = explain("SecurityBaseline", "status")
    assert set(_paths(status, schema, "status")) == set(_schema_paths(schema))
