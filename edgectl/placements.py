"""Where a deployment's replicas are: ``edgectl get placements [--for deployment/NAME]``,
``edgectl get devices --for deployment/NAME`` and the ``Placements`` of ``describe
deployment``. The hub shows a *Placement* per (deployment, device) it sends the deployment or
that still reports it (``hub/decide/placementview.py``), labelled ``deployment`` and
``device``: ``--for deployment/NAME`` is the selector ``deployment=NAME``."""

from __future__ import annotations

import argparse
from typing import Any

import orjson

from edgectl.client import DEFAULT_CHUNK_SIZE, AdminClient
from edgectl.errors import UsageError
from edgectl.resources import PLACEMENT, Ref, kind_of
from edgefleet.v1 import admin_pb2

FOR_KINDS = ("Device", PLACEMENT)
"""What ``get --for deployment/NAME`` lists besides events."""
DESCRIBED = 50
"""Placements ``describe deployment`` lists (then: how many more, and the command for all)."""


def deployment_of(text: str) -> str:
    """The NAME of ``deployment/NAME`` (any alias of deployments); UsageError otherwise."""
    kind_text, slash, name = text.partition("/")
    if not slash or not name or not kind_text:
        raise UsageError(f"--for must be deployment/NAME, got {text!r}")
    kind_of(kind_text, allow=("ModelDeployment",))
    return name


def check_for(args: argparse.Namespace, kind: str, refs: list[Ref]) -> None:
    """The usage errors of ``get devices|placements --for deployment/NAME``."""
    if kind not in FOR_KINDS:
        raise UsageError(
            "get: --for applies to events, devices and placements (get events --for TYPE/NAME, "
            "get devices|placements --for deployment/NAME)"
        )
    deployment_of(args.for_object)
    if refs:
        raise UsageError("get: --for does not apply with names (give names or --for)")
    if args.watch:
        raise UsageError("get: -w/--watch does not apply with --for (get them again)")


def listed_for(
    client: AdminClient, kind: str, target: str, selector: str, chunk_size: int | None
) -> list[dict[str, Any]]:
    """The devices or placements of deployment ``target`` (``deployment/NAME``), matching
    ``selector`` (the devices' labels, or the placements')."""
    name = deployment_of(target)
    chunk = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
    if kind == PLACEMENT:
        wanted = f"deployment={name}" + (f",{selector}" if selector else "")
        docs, _ = client.list_objects(PLACEMENT, wanted, chunk_size=chunk)
        return docs
    placed = {
        d["spec"]["device"]
        for d in client.list_objects(PLACEMENT, f"deployment={name}", chunk_size=chunk)[0]
    }
    if not placed:
        client.get("ModelDeployment", name)  # NOT_FOUND when there is no such deployment
        return []
    devices, _ = client.list_objects("Device", selector, chunk_size=chunk)
    return [d for d in devices if d["metadata"]["name"] in placed]


def of_deployment(client: AdminClient, name: str) -> tuple[list[dict[str, Any]], bool]:
    """Deployment ``name``'s first :data:`DESCRIBED` placements, for ``describe``, and
    whether there are more."""
    request = admin_pb2.ListRequest(
        kind=PLACEMENT, label_selector=f"deployment={name}", limit=DESCRIBED
    )
    response = client.call("List", request)
    return [orjson.loads(i.json) for i in response.items], bool(response.continue_token)
