"""How long a device has been silent, as this hub saw it (the hub's own observations).

A device's stored ``last_heartbeat`` is when some hub last heard from it. After this hub
starts (or, with replicas on etcd, after it is elected leader) it could not have heard from
any device before that moment, so a device's silence counts from whichever is later: its last
heartbeat or the start of this hub's observation (:class:`ObservedSince`). As Kubernetes' node
lifecycle controller does, a restart of the hub (an upgrade, a restore, an outage longer than
``devices.rescheduleAfter``) gives every device a full grace period to reconnect: NotReady
after ``heartbeatGrace`` from the start at the earliest, rescheduled after ``rescheduleAfter``.

:func:`silent_for` is the pure decision (tested as a table in ``tests/hub/test_hub_staleness.py``);
:class:`ObservedSince` is the one moment the lifecycle controller and the scheduler share.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


def silent_for(last_heartbeat: float | None, now: float, observed_since: float | None) -> float:
    """Seconds ``now`` is past the later of ``last_heartbeat`` and ``observed_since`` (pure):
    how long this hub has gone without hearing from a device it could have heard from. A
    device never heard from (``last_heartbeat`` None) is silent since the observation began
    (forever without one)."""
    heard = last_heartbeat if last_heartbeat is not None else float("-inf")
    since = max(heard, observed_since if observed_since is not None else float("-inf"))
    return now - since


@dataclass(slots=True)
class ObservedSince:
    """When this hub began to observe devices (wall-clock seconds): its start, and again each
    time it becomes the leader. Shared by :mod:`hub.controllers.lifecycle` and
    :mod:`hub.controllers.placement`."""

    since: float

    @classmethod
    def now(cls) -> ObservedSince:
        return cls(time.time())

    def restart(self, now: float) -> None:
        """This hub begins to observe again at ``now`` (started serving, or elected)."""
        self.since = now
