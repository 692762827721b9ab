"""The cache's change feed: which keys changed, told to the controllers that watch them.

Every write-through to the cache (:class:`hub.state.cache.Cache`: an object applied or
deleted, a device record, a desired record, a rollout, a placement, a model pushed...) names
the key it changed, ``(kind, name)``, and the feed tells each handler registered for that kind,
at once and in the writer's task. A handler only queues keys (a controller's work queue,
:mod:`hub.state.workloop`; the projector's dirty set): it never does the work itself, so a
write costs what its watchers' queues cost, not what reconciling costs.

Controllers register in their constructors (controller-runtime's ``Watches``); nothing is
attached later by someone else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

DEVICE = "Device"  # a device record (a report, an ack, a phase, a label, a cordon...)
DESIRED = "Desired"  # a device's desired record (what the projector last wrote for it)
DESIRED_OF = "DesiredOf"  # a deployment some device's desired record gained, lost or renewed
ROLLOUT = "Rollout"  # a deployment's rollout state or revisions
PLACEMENT = "Placement"  # a replicas.total deployment's placements
SCALED = "Scaled"  # a deployment's replicas.total as the fleet autoscaler set it (or no more)
MODEL = "Model"  # a model pushed or deleted; the name is the model's name (all its versions)
TRUST = "Trust"  # the fleet's trust roots or TUF metadata; the name is "" (one fleet)
PROJECTING = "Projecting"  # devices marked to be projected again; the name is "" (some)
OBJECTS = "Object"  # any operator object applied or deleted; the name is "KIND/NAME"
# objects applied or deleted are told twice: under their own kind ("ModelDeployment",
# "Secret", ...) with their name, and under OBJECTS

Handler = Callable[[str, str], None]
"""Told ``(kind, name)`` of a key that changed."""


class ChangeFeed:
    """Handlers by kind; :meth:`changed` tells those of a key's kind (``"*"``: every kind)."""

    def __init__(self) -> None:
        self._handlers: dict[str, list[Handler]] = {}
        self._settlers: list[Callable[[], Awaitable[None]]] = []

    def watch(
        self,
        kinds: Iterable[str],
        handler: Handler,
        *,
        settled: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Tell ``handler`` of every change of a key of one of ``kinds``; ``settled``: waits
        until what the handler queued so far is done (:meth:`settled`)."""
        for kind in kinds:
            self._handlers.setdefault(kind, []).append(handler)
        if settled is not None:
            self._settlers.append(settled)

    async def settled(self) -> None:
        """Wait until the watchers that say so acted on the changes told so far: an admin
        call answers once its write took effect (its revisions exist), without calling the
        controllers itself."""
        await asyncio.gather(*(settle() for settle in self._settlers))

    def changed(self, kind: str, name: str) -> None:
        for handler in self._handlers.get(kind, ()):
            handler(kind, name)
        for handler in self._handlers.get("*", ()):
            handler(kind, name)

    def changed_all(self, kind: str, names: Iterable[str]) -> None:
        for name in names:
            self.changed(kind, name)
