"""The projector: devices marked dirty get their desired state recomputed, written and sent.

Batched and level-based: every device marked since the last batch (by an apply, a label,
health, attestation or phase change...) is projected together with
:func:`hub.decide.desired.build_within_bound` (pure), every changed desired record is written in one
transaction (its generation: that transaction's revision, raised above anything the device
acknowledged), then the devices' sessions get the new state. Marking a device twice is harmless.

Marks come from the change feed (:mod:`hub.state.feed`: an object applied or deleted, a model
pushed, the trust roots: every device, lazily, as :meth:`Projector.mark_all`) and from the
controllers that know which devices they changed (a rollout step, placements, a device's
phase). Each mark is told to the feed as :data:`hub.state.feed.PROJECTING` (the scheduler
watches it: what devices get may place them differently).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from edgefleet.backoff import Backoff
from hub.decide.desired import DesiredContent, FleetPolicies, build_within_bound
from hub.state import feed as kinds
from hub.state import storekeys
from hub.state.batchloop import GIVE_UP_AFTER, BatchLoop
from hub.state.cache import Cache
from hub.state.sessions import Sessions
from hub.state.snapshots import snapshot_of
from hub.state.store import Put, Store

FLEET_WIDE = (kinds.OBJECTS, kinds.MODEL, kinds.TRUST)
"""What every device gets may change with these (the feed's kinds the projector watches)."""

GATHER = 0.01  # an apply marks every device at once
RETRY = Backoff(0.05, 10.0)


class Projector:
    """Batched, level-based projection of desired state onto devices (see module doc)."""

    name = "projector"

    def __init__(
        self,
        store: Store,
        cache: Cache,
        sessions: Sessions,
        *,
        region: str,
        on_pushed: Callable[[str, int], None] | None = None,
        on_placed: Callable[[int, int], None] | None = None,
        on_change: Callable[[], None] | None = None,
        give_up_after: float = GIVE_UP_AFTER,
    ) -> None:
        self._store = store
        self._cache = cache
        self._sessions = sessions
        self._region = region
        self._dirty: set[str] = set()
        self._all = False  # every device is owed (mark_all), expanded when the batch runs
        # per deployment, the revision of its manifest (as applied) that the last batch of
        # every device projected: its targeted devices are whole once that reaches the
        # applied one (a rollout decides nothing before: hub.controllers.rollout)
        self.projected_specs: dict[str, int] = {}
        self._batch_ended = asyncio.Event()  # set when a batch ends, then replaced
        self.marked = 0  # devices projected so far (tests and benchmarks count them)
        # a root's region streams (hub.state.regions.Regions.changed), told by mark_all and by
        # every rollout step: what changes every device's state (an apply, a push, a new
        # revision, trust roots) may change the regions' slices too; one device's marks (its
        # labels, health) do not
        self._on_change = on_change
        cache.feed.watch(FLEET_WIDE, self._changed)
        cache.feed.watch((kinds.ROLLOUT,), self._rollout_changed)
        self.contents: dict[str, DesiredContent] = {}
        self._on_pushed = on_pushed
        self._on_placed = on_placed  # (placements made, placements ended), for the metrics
        self._batches = BatchLoop(
            self.name,
            self._project_marked,
            gather=GATHER,
            backoff=RETRY,
            give_up_after=give_up_after,
        )

    def _changed(self, kind: str, name: str) -> None:
        self.mark_all()

    def _rollout_changed(self, kind: str, name: str) -> None:
        if self._on_change is not None:
            self._on_change()

    def mark(self, names: Iterable[str], *, notify: bool = True) -> None:
        """Project ``names`` again soon; ``notify``: tell the feed (:data:`kinds.PROJECTING`:
        the scheduler, whose own marks do not)."""
        self._dirty.update(names)
        self._batches.wake()
        if notify:
            self._cache.feed.changed(kinds.PROJECTING, "")

    def mark_all(self) -> None:
        """Every device: what they all get may have changed (an apply, a delete, a push, a
        new revision, trust roots), and so may the regions' slices (``on_change``)."""
        self._all = True
        self._batches.wake()
        self._cache.feed.changed(kinds.PROJECTING, "")
        if self._on_change is not None:
            self._on_change()

    async def project(self, names: Iterable[str]) -> None:
        changed: dict[str, tuple[DesiredContent, storekeys.DesiredRecord | None]] = {}
        view = snapshot_of(self._cache)  # the deciders read plain data, not the cache
        fleet = FleetPolicies.of(view)
        for name in sorted(set(names)):
            device = self._cache.devices.get(name)
            if device is None:
                self.contents.pop(name, None)
                continue
            previous = self._cache.desired.get(name)
            content = build_within_bound(  # never a state the device cannot receive
                device,
                view,
                previous=frozenset(previous.deployments) if previous else frozenset(),
                region=self._region,
                fleet=fleet,
            )
            self.contents[name] = content
            if (
                previous is None
                or previous.digest != content.digest
                # another revision with the same documents (a copy of an older one): a new
                # generation, so that a rollout can tell reports made after it came
                or previous.numbers() != content.revisions
                # the device acknowledged more than this hub ever issued (its store was
                # restored from a backup): issue the state again, above what it holds
                or previous.generation < self._acked(name)
            ):
                changed[name] = (content, previous)
            else:
                session = self._sessions.get(name)
                if session is not None and not session.sent_any and session.desired is None:
                    session.offer(content)  # connected before this hub had projected it
        if not changed:
            return
        current = (await self._store.range(storekeys.DESIRED + "\x00")).revision  # cheap read
        generation = current + 1  # the revision of the transaction below
        records: dict[str, storekeys.DesiredRecord] = {}
        for name, (content, previous) in changed.items():
            floor = max(previous.generation if previous else 0, self._acked(name))
            issued = max(generation, floor + 1)
            carried = tuple(
                (d, n, (previous.carried(d, n) if previous else None) or issued)
                for d, n in content.revisions
            )
            records[name] = storekeys.DesiredRecord(
                issued, content.deployments, content.digest, carried
            )
        await self._store.txn(
            (),
            [
                Put(storekeys.desired_key(n), storekeys.dumps(r.to_json()))
                for n, r in sorted(records.items())
            ],
        )
        self._cache.put_desired(records)
        if self._on_placed is not None:
            placed = ended = 0
            for content, previous in changed.values():
                before = set(previous.deployments) if previous else set()
                placed += len(set(content.deployments) - before)
                ended += len(before - set(content.deployments))
            self._on_placed(placed, ended)
        for name in changed:
            session = self._sessions.get(name)
            if session is not None:
                session.offer(self.contents[name])

    def _acked(self, name: str) -> int:
        device = self._cache.devices.get(name)
        return device.generation_acked if device else 0

    def content_for(self, name: str) -> DesiredContent | None:
        return self.contents.get(name)

    def has_projected(self, deployment: str, revision: int) -> bool:
        """Whether a batch of every device has projected ``deployment``'s manifest as applied
        at store revision ``revision`` (or a later one)."""
        return self.projected_specs.get(deployment, 0) >= revision

    async def wait_until(self, check: Callable[[], bool], within: float) -> bool:
        """Wait until ``check()`` after one batch or another, ``within`` seconds at most;
        whether it holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not check():
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._batch_ended.wait(), left)
            except TimeoutError:
                return check()
        return True

    async def _project_marked(self) -> None:
        specs: dict[str, int] | None = None
        if self._all:
            self._dirty.update(self._cache.devices)
            self._all = False
            specs = {  # what this batch of every device projects
                name: stored.revision
                for (kind, name), stored in self._cache.stored.items()
                if kind == "ModelDeployment"
            }
        names, self._dirty = self._dirty, set()
        self.marked += len(names)
        try:
            await self.project(names)
        except BaseException:
            self._dirty |= names  # still owed: the next pass projects them
            if specs is not None:
                self._all = True
            raise
        else:
            if specs is not None:
                self.projected_specs = specs
        finally:
            ended, self._batch_ended = self._batch_ended, asyncio.Event()
            ended.set()  # wait_until looks again

    async def run(self, stop: asyncio.Event) -> None:
        """Project batch after batch until ``stop`` (:class:`hub.state.batchloop.BatchLoop`)."""
        await self._batches.run(stop)
