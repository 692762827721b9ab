"""The hub's read-only web dashboard (``dashboardListen`` in hub.toml; docs/architecture.md,
"The dashboard"): :mod:`~hub.dashboard.access` (who may look), :mod:`~hub.dashboard.views`
(what a page shows, computed from the cache: pure), :mod:`~hub.dashboard.pages` (HTML, every
value escaped), :mod:`~hub.dashboard.serving` (the aiohttp listener, a component)."""
