"""The TUF metadata the hub serves now (:class:`HeldTuf`), replaced while it runs.

At a hub that keeps a repository (``D/tuf/``) it is the :class:`~hub.state.tufrepo.TufRepository`,
replaced when an operator installs a new root or targets (:mod:`hub.controllers.tufwatch`); at
a regional hub it is the root's set it last adopted (``D/tuf-relay/``,
:class:`~hub.state.tufrelay.RelayedTuf`), replaced by the parent link or, at a region's
replicas, by the one the store shares; None: no TUF. Whoever serves TUF metadata reads
:attr:`HeldTuf.current` (or calls the holder) at each request; whoever replaces it calls
:meth:`HeldTuf.adopt`, which tells the cache's change feed (every device's desired state
carries the metadata's versions).
"""

from __future__ import annotations

from hub.state.cache import Cache
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository

Tuf = TufRepository | RelayedTuf
"""What a hub serves as TUF metadata."""


class HeldTuf:
    """The TUF metadata served now (module doc)."""

    __slots__ = ("_cache", "current")

    def __init__(self, cache: Cache, current: Tuf | None = None) -> None:
        self._cache = cache
        self.current = current

    def __call__(self) -> Tuf | None:
        """:attr:`current` (the holder is the getter the servicers take)."""
        return self.current

    def adopt(self, tuf: Tuf | None) -> None:
        """Serve ``tuf`` from now on; the feed is told (:data:`hub.state.feed.TRUST`)."""
        self.current = tuf
        self._cache.trust_changed()
