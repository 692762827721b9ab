"""Watch fan-out shared by the store implementations.

A watch subscribes *before* it reads history, so a change committed while history is being
read arrives in its queue too; events at or below the revision history was read at are
skipped. History + live = every event once, in revision order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from hub.state.store.protocol import Event

History = Callable[[str, int], Awaitable[tuple[list[Event], int]]]
"""``(prefix, start_revision) -> (events from start on, revision read at)``; raises Compacted.
With ``start_revision`` 0 it returns no events and the current revision."""


class Broadcaster:
    """Delivers published events to the queues of the watches whose prefix matches."""

    def __init__(self) -> None:
        self._watchers: dict[int, tuple[str, asyncio.Queue[Event]]] = {}
        self._next = 0

    def publish(self, events: Sequence[Event]) -> None:
        """Called on the event loop, in revision order."""
        for prefix, queue in self._watchers.values():
            for event in events:
                if event.kv.key.startswith(prefix):
                    queue.put_nowait(event)

    async def watch(
        self, prefix: str, start_revision: int, history: History
    ) -> AsyncIterator[Event]:
        self._next += 1
        ident = self._next
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._watchers[ident] = (prefix, queue)
        try:
            past, read_at = await history(prefix, start_revision)
            for event in past:
                yield event
            while True:
                event = await queue.get()
                if event.revision > read_at:
                    yield event
        finally:
            del self._watchers[ident]

    @property
    def watching(self) -> int:
        """How many watches are open."""
        return len(self._watchers)
