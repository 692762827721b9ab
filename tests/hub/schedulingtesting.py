"""Scheduler inputs for its table and property tests: a fixed now, deployments, nodes, and a
hypothesis strategy of fleets."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from edgefleet.api import ModelDeployment, TaintEffect, parse_manifest
from hub.decide.devices import Taint
from hub.decide.placement import (
    REGION_LABEL,
    TAINT_UNSCHEDULABLE,
    ZONE_LABEL,
)
from hub.decide.schedule import (
    Node,
    accelerator_slots,
)

NOW = 1000.0


GiB = 1024**3


def dep(name: str, total: int | None = 1, **spec: Any) -> ModelDeployment:
    doc: dict[str, Any] = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": name, "version": "1.0.0"}, **spec},
    }
    if total is not None and "replicas" not in spec:
        doc["spec"]["replicas"] = {"total": total}
    out = parse_manifest(doc)
    assert isinstance(out, ModelDeployment)
    return out


def node(name: str, cpu: int = 4000, mem: int = 4 * GiB, **kw: Any) -> Node:
    labels = {REGION_LABEL: "eu-central", **kw.pop("labels", {})}
    kw.setdefault("last_heartbeat", NOW)
    return Node(
        name, labels, cpu_millis=cpu, memory_bytes=mem, accelerators=accelerator_slots(labels), **kw
    )


ZONES = ["z1", "z2", "z3"]


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[ModelDeployment], list[Node], dict[str, list[str]]]:
    n = draw(st.integers(1, 8))
    nodes = []
    for i in range(n):
        labels = {ZONE_LABEL: draw(st.sampled_from(ZONES))}
        if draw(st.booleans()):
            labels["accelerator.gpu"] = str(draw(st.integers(1, 2)))
        if draw(st.booleans()):
            labels["site"] = "retail"
        taints = (
            (Taint(TAINT_UNSCHEDULABLE, TaintEffect.NO_SCHEDULE),)
            if draw(st.integers(0, 5)) == 0
            else ()
        )
        nodes.append(
            node(
                f"n{i}",
                cpu=draw(st.sampled_from([1000, 2000, 4000])),
                mem=draw(st.sampled_from([1, 2, 4])) * GiB,
                labels=labels,
                taints=taints,
            )
        )
    deps = []
    for j in range(draw(st.integers(1, 6))):
        spec: dict[str, Any] = {
            "resources": {
                "cpu": draw(st.sampled_from(["250m", "500m", "1", "2"])),
                "memory": draw(st.sampled_from(["256Mi", "1Gi"])),
            },
            "priority": draw(st.integers(0, 3)),
        }
        if draw(st.booleans()):
            spec["resources"]["accelerator"] = "gpu"
        placement: dict[str, Any] = {}
        if draw(st.booleans()):
            placement["nodeSelector"] = {"site": "retail"}
        if draw(st.booleans()):
            placement["topologySpread"] = {"key": ZONE_LABEL}
        if draw(st.integers(0, 3)) == 0:
            placement["zones"] = draw(st.lists(st.sampled_from(ZONES), min_size=1, unique=True))
        if j > 0 and draw(st.integers(0, 3)) == 0:
            placement["deploymentAntiAffinity"] = ["d0"]
        spec["placement"] = placement
        deps.append(dep(f"d{j}", draw(st.integers(0, 5)), **spec))
    current = {
        d.metadata.name: draw(
            st.lists(st.sampled_from([x.name for x in nodes]), unique=True, max_size=3)
        )
        for d in deps
        if draw(st.booleans())
    }
    return deps, nodes, current
