"""What the deciders get from the state wing: a :class:`hub.decide.fleetview.FleetView` made from
the cache (:func:`snapshot_of`). hub.decide reads plain data, never the cache or the store."""

from __future__ import annotations

from hub.decide.fleetview import FleetView
from hub.state.cache import Cache


def snapshot_of(cache: Cache) -> FleetView:
    """The fleet as ``cache`` holds it now, for one decision: its tables, not copies (costs
    nothing per device); the caller changes the cache only after the decision."""
    return FleetView(
        devices=cache.devices,
        stored=cache.stored,
        deployments=cache.deployments,
        models=cache.models,
        desired=cache.desired,
        trust_roots=cache.trust_roots,
        revisions=cache.revisions,
        rollouts=cache.rollouts,
        sent_placements=cache.sent_placements,
        secrets=cache.secrets,
        agent_upgrades=cache.agent_upgrades,
        agent_releases=cache.agent_releases,
    )
