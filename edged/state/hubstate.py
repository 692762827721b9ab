"""The desired state edged last accepted from the hub, in ``<data-dir>/state/hub.json``.

Written atomically once a state from the hub is accepted (:func:`save_hub_state`): its
generation, the manifests and the signed metadata as the hub sent them, the workloads with their
artifacts' digests, the health policies, and per workload what it ran before its current
artifact (the envelope as accepted then and the workload: going back needs no download). Read
at start (:func:`load_hub_state`), so a restart serves the same state without the hub.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from edged.state import formats
from edged.state.merging import HUB_SOURCE
from edged.trust.tufchecking import envelope_subject
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import DeviceHealthPolicy, ModelDeployment, SecurityBaseline, parse_manifest
from edgefleet.api.baselines import parse_security_baseline
from edgefleet.errors import StateError, ValidationError
from edgefleet.persisting import read_json, write_json_atomic


@dataclass(slots=True)
class AcceptedHubState:
    generation: int = 0
    manifests: list[bytes] = field(default_factory=list)
    metadata: list[bytes] = field(default_factory=list)
    workloads: dict[WorkloadName, DesiredWorkload] = field(default_factory=dict)
    policies: tuple[DeviceHealthPolicy, ...] = ()
    # per workload, what it ran before its current artifact: the envelope as accepted then,
    # and the workload (its artifact stays in the store: going back needs no download)
    previous: dict[WorkloadName, tuple[bytes, DesiredWorkload]] = field(default_factory=dict)

    @property
    def held(self) -> set[str]:
        """Artifacts kept for going back to the previous version (not garbage)."""
        out = set()
        for _, w in self.previous.values():
            out.add(w.sha256)
            out.update(w.extras.values())
        return out


def previous_of(
    acc: AcceptedHubState, workloads: dict[WorkloadName, DesiredWorkload]
) -> dict[WorkloadName, tuple[bytes, DesiredWorkload]]:
    """What each workload ran before: kept while it runs the same artifact, replaced by the
    accepted one when that changes, dropped with the workload."""
    envelopes = {s: e for e in acc.metadata if (s := envelope_subject(e)) is not None}
    out = {}
    for name, new in workloads.items():
        old = acc.workloads.get(name)
        model = old.deployment.spec.model if old is not None else None
        env = envelopes.get((model.name, model.version)) if model is not None else None
        if old is not None and old.sha256 != new.sha256 and env is not None:
            out[name] = (env, old)
        elif name in acc.previous and acc.previous[name][1].sha256 != new.sha256:
            out[name] = acc.previous[name]
    return out


def baselines_of(manifests: list[bytes]) -> tuple[SecurityBaseline, ...]:
    """The SecurityBaselines among a desired state's manifests (bad ones are reported with
    the state's other problems)."""
    found = []
    for raw in manifests:
        try:
            doc = orjson.loads(raw)
            if isinstance(doc, dict) and doc.get("kind") == SecurityBaseline.KIND:
                found.append(parse_security_baseline(doc))
        except (ValueError, ValidationError):
            continue
    return tuple(found)


def _workload(item: Any) -> DesiredWorkload:
    dep = parse_manifest(item["deployment"])
    assert isinstance(dep, ModelDeployment)
    return DesiredWorkload(
        dep,
        str(item["sha256"]),
        HUB_SOURCE,
        {str(k): str(v) for k, v in item.get("extras", {}).items()},
    )


NAME = "state/hub.json"  # its formats: edged.state.formats


def load_hub_state(path: Path) -> AcceptedHubState:
    """The state persisted at ``path``; an empty one (generation 0) when there is none.
    StateError when the file is not a hub state."""
    doc = read_json(path)
    if doc is None:
        return AcceptedHubState()
    if not isinstance(doc, dict) or not formats.readable(NAME, doc.get("format", 0)):
        raise StateError(f"{path}: a hub state format this release does not read")
    try:
        workloads = {}
        for item in doc["workloads"]:
            w = _workload(item)
            workloads[w.name] = w
        policies = []
        for item in doc.get("policies", []):
            pol = parse_manifest(item)
            assert isinstance(pol, DeviceHealthPolicy)
            policies.append(pol)
        previous = {}
        for item in doc.get("previous", []):
            held = _workload(item)
            previous[held.name] = (str(item["envelope"]).encode(), held)
        return AcceptedHubState(
            int(doc["generation"]),
            [m.encode() for m in doc.get("manifests", [])],
            [m.encode() for m in doc.get("metadata", [])],
            workloads,
            tuple(policies),
            previous,
        )
    except (KeyError, TypeError, ValueError, AssertionError, ValidationError) as exc:
        raise StateError(f"{path} is not a hub state: {exc}") from None


def save_hub_state(path: Path, acc: AcceptedHubState) -> None:
    """Persist ``acc`` at ``path`` (atomically)."""
    fmt = formats.write_format(NAME)
    write_json_atomic(
        path,
        {
            **({"format": fmt} if fmt else {}),  # format 0 has no field
            "generation": acc.generation,
            "manifests": [m.decode() for m in acc.manifests],
            "metadata": [m.decode() for m in acc.metadata],
            "workloads": [
                {
                    "deployment": w.deployment.to_dict(),
                    "sha256": w.sha256,
                    "extras": dict(sorted(w.extras.items())),
                }
                for _, w in sorted(acc.workloads.items())
            ],
            "policies": [p.to_dict() for p in acc.policies],
            "previous": [
                {
                    "envelope": env.decode(),
                    "deployment": w.deployment.to_dict(),
                    "sha256": w.sha256,
                    "extras": dict(sorted(w.extras.items())),
                }
                for _, (env, w) in sorted(acc.previous.items())
            ],
        },
    )
