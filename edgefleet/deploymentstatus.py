"""A ModelDeployment's status told the same way wherever a person reads it (``edgectl get``,
the hub's dashboard): pure functions of the object as the AdminService shows it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def serving_model(doc: Mapping[str, Any]) -> str:
    """The MODEL column: ``NAME:VERSION`` of what serves on the devices (several versions
    during a rollout, the most served first); after a rollback, the rejected version named
    beside it. Nothing serving yet (or an older hub): the version the deployment asks for."""
    spec, status = doc.get("spec", {}), doc.get("status", {})
    model = spec.get("model", {})
    counts = status.get("versions") or {}
    serving = sorted(
        (v for v, c in counts.items() if isinstance(c, Mapping) and c.get("devices")),
        key=lambda v: (-int(counts[v].get("devices", 0)), v),
    )
    rollout = status.get("rollout") or {}
    rolled_back = rollout.get("phase") == "RolledBack"
    if not serving:
        stable = rollout.get("stableVersion") if rolled_back else None
        serving = [str(stable or model.get("version"))]
    shown = f"{model.get('name')}:{','.join(serving)}"
    rejected = rollout.get("version") or model.get("version")
    if rolled_back and rejected not in serving:
        shown += f" ({rejected} rolled back)"
    return shown
