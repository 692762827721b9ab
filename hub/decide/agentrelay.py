"""Which edged releases a regional hub fetches from its root, and when (docs/agent-updates.md
"Waves by region"): pure, tested as data (tests/hub/test_agentrelay.py); applied by
:mod:`hub.controllers.parentlink.agentrelay`.

* the root names, in each region's slice, the versions its AgentUpgrades in waves roll out
  (:func:`wanted_versions`: every region runs each such upgrade, in its wave or in the rest);
* the region fetches a version it holds no release of (:func:`due`), one fetch at a time,
  each version at most once per try; a version it holds is asked again every
  :data:`RECHECK_HELD_S` (naming the releases it holds, which the root does not send again:
  a platform pushed at the root later reaches the region too); a try that failed (the root
  away, a timeout, a release the region's own checks refuse) is tried again after a backoff
  that doubles from :data:`RETRY_FIRST_S` to :data:`RETRY_MAX_S` (the root's TUF metadata
  may reach the region after the slice);
* a version the slice no longer names is forgotten (its attempts and refusal).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

_T = TypeVar("_T")

MAX_WANTED = 64
"""Versions a slice names at most (as a report's ``agent_release_versions``)."""
MAX_VERSION = 128
MAX_REFUSALS = 16
"""Refusals a region reports at most; each cut to :data:`MAX_REFUSAL_TEXT`."""
MAX_REFUSAL_TEXT = 512
RETRY_FIRST_S = 2.0
RETRY_MAX_S = 60.0
RECHECK_HELD_S = 300.0


def wanted_versions(objects: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The versions of the root's AgentUpgrades in waves (``spec.rollout.waves``), sorted, at
    most :data:`MAX_WANTED` (the newest names last: the highest kept when cut)."""
    out: set[str] = set()
    for o in objects:
        if o.get("kind") != "AgentUpgrade":
            continue
        spec = o.get("spec") or {}
        rollout = spec.get("rollout") or {}
        version = spec.get("version")
        waves = isinstance(rollout, Mapping) and rollout.get("waves")
        if waves and isinstance(version, str) and 0 < len(version) <= MAX_VERSION:
            out.add(version)
    return tuple(sorted(out)[-MAX_WANTED:])


@dataclass(frozen=True, slots=True)
class Attempt:
    """The tries of one version that did not end with it held."""

    failures: int = 0
    retry_at: float = 0.0
    reason: str = ""  # "Reason: message" of the last failure
    refused: bool = False  # the region's own checks refused the root's release


def due(
    wanted: Iterable[str],
    held: Iterable[str],
    attempts: Mapping[str, Attempt],
    now: float,
    checked: Mapping[str, float] | None = None,
) -> str | None:
    """The one version to fetch now, not waiting out a backoff: first a wanted version not
    held (the lowest first), else a held one last asked (``checked``: when) more than
    :data:`RECHECK_HELD_S` ago or never; None when none is."""
    have = set(held)
    checked = checked or {}

    def ready(version: str) -> bool:
        attempt = attempts.get(version)
        return attempt is None or attempt.retry_at <= now

    versions = sorted(set(wanted))
    for version in versions:
        if version not in have and ready(version):
            return version
    for version in versions:
        last = checked.get(version)
        stale = last is None or now - last >= RECHECK_HELD_S
        if version in have and stale and ready(version):
            return version
    return None


def failed(
    attempt: Attempt | None, reason: str, now: float, *, refused: bool, jitter: float = 1.0
) -> Attempt:
    """The attempt after a failed try: the next try after the doubled backoff (``jitter`` in
    (0, 1] scales it: the caller's random draw)."""
    failures = (attempt.failures if attempt is not None else 0) + 1
    delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (failures - 1)) * max(0.1, min(1.0, jitter))
    return Attempt(failures, now + delay, reason[:MAX_REFUSAL_TEXT], refused)


def kept(attempts: Mapping[str, _T], wanted: Iterable[str]) -> dict[str, _T]:
    """The attempts (or times checked) of versions still wanted (the others are forgotten)."""
    names = set(wanted)
    return {v: a for v, a in attempts.items() if v in names}


def refusals(attempts: Mapping[str, Attempt], held: Iterable[str]) -> dict[str, str]:
    """What the region reports: version -> why its checks refused the root's release, for
    versions still not held, at most :data:`MAX_REFUSALS` (the highest versions)."""
    have = set(held)
    out = {v: a.reason for v, a in sorted(attempts.items()) if a.refused and v not in have}
    return dict(list(out.items())[-MAX_REFUSALS:])
