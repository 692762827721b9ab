"""Applying a slice from the root (docs/federation.md): what the link writes, as one store
transaction (:func:`plan_apply`, pure, over :func:`hub.decide.regionslice.plan_apply`), a
slice's records mapped from protobuf (:func:`model_from`) and checked (:func:`check_slice`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from edgefleet.api import parse_manifest
from edgefleet.v1 import federation_pb2
from hub.decide import agentrelay, regionslice
from hub.decide.regionslice import StoredValue
from hub.state import storekeys
from hub.state.store import Compare, Delete, Op, Put

STATE_KEY = "/federation/state"
MAX_ARTIFACT_BYTES = 16 * 2**30


@dataclass(frozen=True, slots=True)
class ApplyPlan:
    """One transaction that makes the region's store hold the slice."""

    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]
    put_objects: tuple[Mapping[str, Any], ...]
    dropped_objects: tuple[tuple[str, str], ...]
    put_models: tuple[storekeys.ModelRecord, ...]
    dropped_models: tuple[tuple[str, str], ...] = ()  # root-owned models no longer used


def model_from(m: federation_pb2.FederatedModel) -> storekeys.ModelRecord:
    return storekeys.ModelRecord(
        name=m.name,
        version=m.version,
        sha256=m.sha256,
        length=m.length,
        envelope=bytes(m.envelope),
        pushed_at=m.pushed_at,
        extras=dict(m.extras),
        rollback_allowance=bytes(m.rollback_allowance),
    )


def plan_apply(
    generation: int,
    digest: str,
    objects: Sequence[Mapping[str, Any]],
    models: Sequence[storekeys.ModelRecord],
    stored_objects: Mapping[str, StoredValue],
    stored_models: Mapping[str, StoredValue],
    now: float,
    kept: Collection[tuple[str, str]] = frozenset(),
) -> ApplyPlan:
    """:func:`hub.decide.regionslice.plan_apply` (pure: what the slice adds, changes and
    drops) as the store's transaction, ``/federation/state`` last."""
    plan = regionslice.plan_apply(
        generation, digest, objects, models, stored_objects, stored_models, now, kept
    )
    return ApplyPlan(
        tuple(Compare(w.key, w.expected) for w in plan.writes),
        (
            *(Put(w.key, w.value) if w.value is not None else Delete(w.key) for w in plan.writes),
            Put(STATE_KEY, plan.state),
        ),
        plan.put_objects,
        plan.dropped_objects,
        plan.put_models,
        plan.dropped_models,
    )


def check_slice(message: federation_pb2.RegionSlice) -> list[str]:
    """Problems of a slice from the root (bounded and well-formed; every object parses)."""
    problems: list[str] = []
    if len(message.objects) > regionslice.MAX_SLICE_OBJECTS:
        problems.append(f"slice.objects: at most {regionslice.MAX_SLICE_OBJECTS}")
        return problems
    for i, raw in enumerate(message.objects):
        try:
            doc = orjson.loads(raw)
            if doc.get("kind") not in regionslice.FEDERATED_KINDS:
                problems.append(f"slice.objects[{i}].kind: {doc.get('kind')!r} is not federated")
                continue
            if doc["kind"] in ("ModelDeployment", "AgentUpgrade", "ModelConfig"):
                parse_manifest(dict(doc))
        except Exception as exc:  # a manifest the region cannot take
            problems.append(f"slice.objects[{i}]: {exc}")
    for i, m in enumerate(message.models):
        if len(m.sha256) != 64 or m.length > MAX_ARTIFACT_BYTES:
            problems.append(f"slice.models[{i}]: bad sha256 or length")
    if len(message.agent_release_versions) > agentrelay.MAX_WANTED:
        problems.append(f"slice.agent_release_versions: at most {agentrelay.MAX_WANTED}")
    for i, v in enumerate(message.agent_release_versions[: agentrelay.MAX_WANTED]):
        if not v or len(v) > agentrelay.MAX_VERSION:
            problems.append(f"slice.agent_release_versions[{i}]: empty or too long")
    return problems
