"""The desired-state bound, for every path that changes a device's desired state.

A device can receive a desired state of at most :data:`hub.decide.desired.MAX_DESIRED_STATE_BYTES`
(gRPC's message limit); a larger one is never sent, and the device stops receiving updates.

* **Placements** (the scheduler, and through it rescheduling, the fleet autoscaler's totals and
  moves): :func:`state_bound` gives the scheduler, per device, the bytes its state takes
  without ``replicas.total`` placements and, per deployment, what one replica adds
  (:class:`hub.decide.schedule.StateBound`); a placement that would exceed the bound is not made,
  and the deployment's ``Scheduled`` condition names the devices it would have overfilled.
* **Applies** (:func:`refused_devices`): an apply is refused only when it makes some device's
  state larger than the bound, or larger still on a device already over it, naming those
  devices. A device already over the bound never blocks an apply that does not grow it.

Pure over a :class:`hub.decide.fleetview.FleetView` (no I/O, no clock); tested as tables in
``tests/hub/test_hub_bounding.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hub.decide.desired import (
    MAX_DESIRED_STATE_BYTES,
    FleetPolicies,
    build_desired,
    replica_wire_size,
    wire_size,
    wire_size_bound,
)
from hub.decide.fleetview import FleetView
from hub.decide.nodes import StateBound
from hub.decide.revisions import Revision, template_hash


def unmade_revisions(view: FleetView, names: Iterable[str]) -> dict[str, Revision]:
    """For each deployment of ``names`` the rollout controller has made no revision of yet,
    the revision it will make (its manifest as applied): counted before it exists."""
    out: dict[str, Revision] = {}
    for name in names:
        if view.revisions.get(name):
            continue
        stored = view.stored.get(("ModelDeployment", name))
        if stored is not None:
            manifest = stored.manifest
            out[name] = Revision(name, 0, template_hash(manifest), manifest, 0.0)
    return out


def state_bound(
    view: FleetView, *, region: str, limit: int = MAX_DESIRED_STATE_BYTES
) -> StateBound | None:
    """What the scheduler must keep within ``limit`` (pure over ``view``); None when no
    device's state could exceed it even with every deployment on it (the common case: costs
    deployments x revisions, not devices)."""
    fleet = FleetPolicies.of(view)
    totals = [n for n, d in view.deployments.items() if d.spec.replicas.per_device is None]
    planned = unmade_revisions(view, totals)
    if wire_size_bound(view, fleet, planned=planned) <= limit:
        return None
    base: dict[str, int] = {}
    for name, device in view.devices.items():
        previous = view.desired.get(name)
        content = build_desired(
            device,
            view,
            previous=frozenset(previous.deployments) if previous else frozenset(),
            region=region,
            fleet=fleet,
            placements={},  # without any replicas.total placement: those are the scheduler's
        )
        base[name] = wire_size(content)
    replica = {
        name: replica_wire_size(view, fleet, name, planned=planned.get(name)) for name in totals
    }
    return StateBound(limit, base, replica)


def refused_devices(
    before: Mapping[str, int], after: Mapping[str, int], limit: int = MAX_DESIRED_STATE_BYTES
) -> list[tuple[str, int]]:
    """The devices an apply may not change as it would (pure): those whose desired state it
    makes larger than ``limit``, or larger still when already over it. ``before`` and
    ``after``: each device's state size without and with the apply (a device missing from
    ``before`` had none). By name, with the size after."""
    return [
        (name, size)
        for name, size in sorted(after.items())
        if size > limit and size > before.get(name, 0)
    ]


def grown_past_bound(
    view: FleetView,
    trial: FleetView,
    *,
    planned: Mapping[str, Revision],
    region: str,
    limit: int = MAX_DESIRED_STATE_BYTES,
) -> list[tuple[str, int]]:
    """The devices whose desired state an apply would make too large (:func:`refused_devices`),
    with their sizes after it (pure over the views). ``view``: as it is; ``trial``: with the
    apply's objects; ``planned``: its new revisions, counted on every device they reach (the
    worst case of a rollout). A ``replicas.total`` deployment counts where it is placed now:
    the scheduler places it anywhere else only where it fits (:func:`state_bound`)."""
    fleet = FleetPolicies.of(trial)
    if wire_size_bound(trial, fleet, planned=planned) <= limit:
        return []  # no device's state can be larger: not built device by device
    fleet_now = FleetPolicies.of(view)
    before: dict[str, int] = {}
    after: dict[str, int] = {}
    for name, device in sorted(view.devices.items()):
        record = view.desired.get(name)
        previous = frozenset(record.deployments) if record else frozenset()
        content = build_desired(
            device,
            trial,
            previous=previous,
            region=region,
            fleet=fleet,
            planned=planned,
            placements=view.sent_placements,
        )
        after[name] = wire_size(content)
        if after[name] > limit:  # was it as large before the apply?
            now = build_desired(device, view, previous=previous, region=region, fleet=fleet_now)
            before[name] = wire_size(now)
    return refused_devices(before, after, limit)
