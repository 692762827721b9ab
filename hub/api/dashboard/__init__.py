"""The hub's web dashboard (``dashboardListen`` in hub.toml; docs/dashboard.md, "The
dashboard"): :mod:`~hub.api.dashboard.access` (who may look), :mod:`~hub.api.dashboard.actions`
(what an admin may do: rollout actions), :mod:`~hub.api.dashboard.views`
(what a page shows, computed from the cache: pure), :mod:`~hub.api.dashboard.pages` (HTML, every
value escaped: the frame and the read-only fleet pages), :mod:`~hub.api.dashboard.rolloutpages`
(the rollout pages and the action buttons), :mod:`~hub.api.dashboard.serving` (the aiohttp
listener, a component)."""
