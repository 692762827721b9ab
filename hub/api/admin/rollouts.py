"""AdminService's rollout calls: ListRevisions, and RolloutAction (pause, resume, undo, promote,
abort, restart: :mod:`hub.decide.rolloutactions`; each an event naming the admin who acted). A
rollout across regions (hub.controllers.wave) is paused and resumed there; undo applies an
older revision's template, unless the devices' anti-rollback floor refuses it
(hub.decide.undo). An AgentUpgrade's rollout (``kind: AgentUpgrade``) is acted on by its own
controller (hub.controllers.agentupgrade); its undo applies an older revision's version.

Pause and resume go through the controllers' own ``act`` (a compare-and-swap on the rollout
or wave record); undo only writes the deployment, and the rollout controller makes the new
revision from the change feed (:mod:`hub.state.feed`) before the call answers
(``cache.feed.settled()``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import orjson

from edgefleet.api.agentupgrades import AgentCommit
from edgefleet.errors import CompareFailed
from edgefleet.v1 import admin_pb2
from edgefleet.versioning import installed_version
from hub.api.admin.common import AdminAuth, Refused, invalid, not_found, refuse_root_owned, rpc
from hub.controllers import agentupgrade as agentupgrades
from hub.controllers.agentupgrade import AgentUpgradeController
from hub.controllers.rollout import RolloutController, undo_manifest
from hub.controllers.wave import WaveController
from hub.decide import modelconfigs
from hub.decide.agentdesired import version_refusal
from hub.decide.agentrevisions import AgentRevision, AgentUpgradeState
from hub.decide.agentwaves import AgentWaveState
from hub.decide.revisions import config_of, with_config, with_restart
from hub.decide.rollout import RolloutState, template_hash
from hub.decide.rolloutactions import ActionRefused, restart_refusal
from hub.decide.undo import undo_refused
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.snapshots import snapshot_of
from hub.state.store import Compare, Put, Store
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository
from hub.state.writer import DeviceWriter

KIND_UPGRADE = "AgentUpgrade"
VERBS = {
    admin_pb2.RolloutActionRequest.PAUSE: "pause",
    admin_pb2.RolloutActionRequest.RESUME: "resume",
    admin_pb2.RolloutActionRequest.UNDO: "undo",
    admin_pb2.RolloutActionRequest.PROMOTE: "promote",
    admin_pb2.RolloutActionRequest.ABORT: "abort",
    admin_pb2.RolloutActionRequest.RESTART: "restart",
}
"""RolloutAction's actions by the verb :meth:`Rollouts.perform` takes."""


class Rollouts:
    """ListRevisions and RolloutAction (module doc)."""

    def __init__(
        self,
        authorize: AdminAuth,
        store: Store,
        cache: Cache,
        writer: DeviceWriter,
        *,
        tuf: Callable[[], TufRepository | RelayedTuf | None],
        clock: Callable[[], float],
        rollouts: RolloutController | None,
        waves: WaveController | None,
        agent_upgrades: AgentUpgradeController | None = None,
    ) -> None:
        self.authorize = authorize
        self.store = store
        self.cache = cache
        self.writer = writer
        self.tuf = tuf  # the TUF repository held now: the devices' anti-rollback floor
        self.clock = clock
        self.rollouts = rollouts  # None: no rollout controller (no revisions)
        self.waves = waves  # a root hub's rollouts across regions
        self.agent_upgrades = agent_upgrades  # AgentUpgrade rollouts (None: none driven)

    def _rollout_of(self, name: str) -> RolloutState:
        if not name:
            raise invalid("name: required (a ModelDeployment)")
        if name not in self.cache.deployments:
            raise not_found("ModelDeployment", name)
        state = self.cache.rollouts.get(name)
        if state is None or self.rollouts is None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{name} has no revision yet")
        return state

    def _kind(self, kind: str) -> str:
        if kind in ("", "ModelDeployment"):
            return "ModelDeployment"
        if kind == KIND_UPGRADE:
            return kind
        raise invalid(f"kind: must be ModelDeployment or {KIND_UPGRADE}, got {kind!r}")

    def _waves_of(self, name: str) -> AgentWaveState | None:
        """The rollout across regions of ``name``, an AgentUpgrade in waves at this root hub
        (None: not in waves; refused while its first revision is not written yet)."""
        stored = self.cache.stored.get((KIND_UPGRADE, name))
        if stored is None or not stored.manifest.get("spec", {}).get("rollout", {}).get("waves"):
            return None
        state = self.waves.agent.states.get(name) if self.waves is not None else None
        if state is None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{name} has no revision yet")
        return state

    def _upgrade_of(self, name: str) -> AgentUpgradeState:
        if not name:
            raise invalid(f"name: required (an {KIND_UPGRADE})")
        if (KIND_UPGRADE, name) not in self.cache.stored:
            raise not_found(KIND_UPGRADE, name)
        spec = self.cache.stored[(KIND_UPGRADE, name)].manifest.get("spec", {})
        if spec.get("rollout", {}).get("waves"):
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"not supported yet for an AgentUpgrade in waves ({name}): rollout status, "
                "history, pause, resume and undo only",
            )
        state = self.cache.agent_upgrades.get(name)
        if state is None or self.agent_upgrades is None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{name} has no revision yet")
        return state

    @rpc
    async def ListRevisions(
        self, request: admin_pb2.ListRevisionsRequest, context: Any
    ) -> admin_pb2.ListRevisionsResponse:
        if self._kind(request.kind) == KIND_UPGRADE:
            waved = self._waves_of(request.name)
            if waved is not None:  # a root's upgrade in waves: the root's revisions
                summary = {"revision": waved.revision, "phase": waved.phase.value}
                return admin_pb2.ListRevisionsResponse(
                    revisions=[storekeys.dumps(r) for r in waved.history_records()],
                    rollout=storekeys.dumps(summary),
                )
            upgrade = self._upgrade_of(request.name)
            summary = {k: v for k, v in upgrade.to_json().items() if k not in ("sent", "revisions")}
            return admin_pb2.ListRevisionsResponse(
                revisions=[storekeys.dumps(r.to_json()) for r in upgrade.revisions],
                rollout=storekeys.dumps(summary),
            )
        state = self._rollout_of(request.name)
        revisions = self.cache.revisions.get(request.name, {})
        return admin_pb2.ListRevisionsResponse(
            revisions=[storekeys.dumps(revisions[n].to_json()) for n in sorted(revisions)],
            rollout=storekeys.dumps(state.to_json()),
        )

    @rpc
    async def RolloutAction(
        self, request: admin_pb2.RolloutActionRequest, context: Any
    ) -> admin_pb2.RolloutActionResponse:
        caller = await self.authorize(context)  # who acts: named in the event
        verb = VERBS.get(request.action)
        if verb is None:
            raise invalid("action: must be PAUSE, RESUME, UNDO, PROMOTE, ABORT or RESTART")
        message = await self.perform(
            self._kind(request.kind),
            request.name,
            verb,
            actor=f'admin "{caller.name}"',
            to_revision=int(request.to_revision),
            full=request.full,
        )
        return admin_pb2.RolloutActionResponse(message=message)

    async def perform(
        self,
        kind: str,
        name: str,
        verb: str,
        *,
        actor: str,
        to_revision: int = 0,
        full: bool = False,
    ) -> str:
        """``actor``'s rollout action ``verb`` (pause, resume, undo, promote, abort, restart) on
        ``kind`` ``name``: what was done, for a person; :class:`Refused` saying why not. The
        gRPC call and the dashboard act through it."""
        if verb not in VERBS.values():
            raise invalid(f"action: must be one of {', '.join(VERBS.values())}, got {verb!r}")
        if full and verb != "promote":
            raise invalid(f"full: applies to promote only, not {verb}")
        if kind == KIND_UPGRADE:
            if verb in ("promote", "abort", "restart"):
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"rollout {verb} is not supported yet for an AgentUpgrade "
                    f"(agentupgrade/{name}): pause, resume and undo are",
                )
            return await self._upgrade_action(name, verb, to_revision, actor)
        state = self._rollout_of(name)
        controller = self.rollouts
        assert controller is not None
        if verb == "undo":
            return await self._undo(name, state, to_revision, actor)
        waves = self.waves
        if waves is not None and waves.in_progress(name):  # a rollout across regions
            if verb not in ("pause", "resume"):
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"rollout {verb} is not supported yet for a rollout across regions "
                    f"({name}, spec.rollout.waves): pause, resume and undo are",
                )
            moved = await waves.act(name, verb)
            if moved is None:
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"the rollout of {name} across regions is "
                    f"{waves.states[name].phase.value}: nothing to {verb}",
                )
            return f"{name}: {moved.message}"
        if verb == "restart":
            await self._restartable(name)
        try:
            new = await controller.act(name, verb, actor=actor, full=full)
        except ActionRefused as exc:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
        if verb == "restart":
            now = self.cache.rollouts.get(name, new)
            return (
                f"{name}: revision {new.revision} restarted: rolling out its template again as "
                f"revision {now.revision}"
            )
        return f"{name}: {new.message}"

    async def _restartable(self, name: str) -> None:
        """A restart is this hub's own rollout: refused where a root hub's waves or a root's
        slice decide the deployment's revisions (their templates are compared across hubs)."""
        stored = self.cache.stored[("ModelDeployment", name)]
        if stored.manifest.get("spec", {}).get("rollout", {}).get("waves"):
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"rollout restart is not supported yet for a deployment rolled out in waves "
                f"({name}, spec.rollout.waves)",
            )
        kv = await self.store.get(storekeys.object_key("ModelDeployment", name))
        if kv is not None:
            refuse_root_owned("ModelDeployment", name, kv.value, "restart")
        devices = self.cache.devices
        versions = {d: devices[d].agent_version for d in self.cache.targeted(name) if d in devices}
        refused = restart_refusal(name, versions)
        if refused is not None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, refused)

    async def _upgrade_action(self, name: str, verb: str, to: int, actor: str) -> str:
        stored = self.cache.stored.get((KIND_UPGRADE, name))
        waves = self.waves
        in_waves = stored is not None and stored.manifest.get("spec", {}).get("rollout", {}).get(
            "waves"
        )
        if in_waves and waves is not None and verb in ("pause", "resume"):
            moved = await waves.agent.act(name, verb)  # the root's waves (agentwaves)
            if moved is None:
                now = waves.agent.states.get(name)
                phase = now.phase.value if now is not None else "not started"
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"agentupgrade/{name} across regions is {phase}: nothing to {verb}",
                )
            return f"agentupgrade/{name}: {moved.message}"
        if in_waves and verb == "undo":
            waved = self._waves_of(name)
            assert waved is not None
            earlier = {int(r["number"]): r for r in waved.revisions}
            if to == 0:
                if not earlier:
                    raise Refused(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"{name} has no revision before {waved.revision} to go back to",
                    )
                to = max(earlier)
            if to == waved.revision:
                return f"{name} already asks for revision {to}'s version: nothing to undo"
            if to not in earlier:
                listed = ", ".join(str(n) for n in sorted(earlier)) or "none"
                raise invalid(f"to_revision: {name} has no revision {to} (kept: {listed})")
            record = earlier[to]
            deadline_s, max_tries = int(record["deadlineSeconds"]), int(record["maxTries"])
            if deadline_s <= 0 or max_tries <= 0:  # kept before history had commit settings
                commit = stored.manifest["spec"].get("commit") if stored is not None else None
                commit = commit if isinstance(commit, dict) else {}
                deadline_s = int(commit.get("deadlineSeconds", AgentCommit().deadline_s))
                max_tries = int(commit.get("maxTries", AgentCommit().max_tries))
            wanted = AgentRevision(
                to, str(record["version"]), deadline_s, max_tries, float(record["createdAt"])
            )
            return await self._set_upgrade_version(name, to, wanted, actor)
        state = self._upgrade_of(name)
        controller = self.agent_upgrades
        assert controller is not None
        if verb in ("pause", "resume"):
            try:
                new = await controller.act(name, verb)
            except agentupgrades.ActionRefused as exc:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
            return f"agentupgrade/{name}: {new.message}"
        numbers = [r.number for r in state.revisions]
        if to == 0:
            older = [n for n in numbers if n < state.revision]
            if not older:
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{name} has no revision before {state.revision} to go back to",
                )
            to = max(older)
        target = state.revision_of(to)
        if target is None:
            kept = ", ".join(str(n) for n in numbers) or "none"
            raise invalid(f"to_revision: {name} has no revision {to} (kept: {kept})")
        return await self._set_upgrade_version(name, to, target, actor)

    async def _set_upgrade_version(
        self, name: str, to: int, target: AgentRevision, actor: str
    ) -> str:
        """``rollout undo``: the upgrade's manifest set back to ``target``'s version and commit
        settings (the controller, or the root's waves, make the new revision)."""
        stored = self.cache.stored[(KIND_UPGRADE, name)]
        manifest = agentupgrades.undo_manifest(stored.manifest, target)
        if manifest == dict(stored.manifest):
            return f"{name} already asks for revision {to}'s version: nothing to undo"
        refused = version_refusal(target.version, installed_version())
        if refused is not None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, refused)
        key = storekeys.object_key(KIND_UPGRADE, name)
        current = await self.store.get(key)
        created = storekeys.created_of(current.value) if current is not None else None
        try:
            revision = await self.store.txn(
                [Compare(key, stored.revision)],
                [Put(key, storekeys.object_value(manifest, created))],
            )
        except CompareFailed:
            raise Refused(
                grpc.StatusCode.ABORTED, f"{name} changed meanwhile; try the undo again"
            ) from None
        self.cache.put_object(manifest, revision)  # the controller reacts (hub.state.feed)
        self.writer.event(
            KIND_UPGRADE,
            name,
            "Normal",
            "RolloutUndo",
            f"{name} set back to revision {to}'s version ({target.version}) by {actor}",
        )
        await self.cache.feed.settled()  # the new revision exists when it answers
        return f"agentupgrade/{name}: rolling back to revision {to} ({target.version})"

    async def _config_undo(
        self, name: str, target: Any, to: int
    ) -> tuple[dict[str, Any], Compare, Put] | None:
        """What an undo to ``target`` writes of its model's ModelConfig: the one the revision
        carries, back in place (None: it is in place already). Refused when the revision ran
        without one while one is applied now, or with another name."""
        cache = self.cache
        model = target.model[0]
        wanted = config_of(target.manifest)
        now = [
            o for o in cache.objects_of(modelconfigs.KIND) if o.manifest["spec"]["model"] == model
        ]
        current = now[0] if now else None
        if not wanted:
            if current is None:
                return None
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{name}: revision {to} ran without a ModelConfig for model {model}; ModelConfig "
                f"{current.name} is applied now: delete it (a new revision without it rolls "
                "out), then undo again if need be",
            )
        doc = orjson.loads(wanted)
        if current is not None and current.name != doc["metadata"]["name"]:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{name}: revision {to}'s ModelConfig is {doc['metadata']['name']}, model "
                f"{model} has {current.name} now: delete it first",
            )
        if current is not None and modelconfigs.config_text([current.manifest], model) == wanted:
            return None
        key = storekeys.object_key(modelconfigs.KIND, doc["metadata"]["name"])
        kv = await self.store.get(key)
        created = storekeys.created_of(kv.value) if kv is not None else None
        compare = Compare(key, kv.mod_revision if kv is not None else 0)
        return doc, compare, Put(key, storekeys.object_value(doc, created))

    async def _undo(self, name: str, state: RolloutState, to: int, actor: str) -> str:
        cache = self.cache
        revisions = cache.revisions.get(name, {})
        if to == 0:
            to = state.stable if state.stable != state.revision else 0
            if to == 0:
                older = [n for n in revisions if n < state.revision]
                if not older:
                    raise Refused(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"{name} has no revision before {state.revision} to go back to",
                    )
                to = max(older)
        target = revisions.get(to)
        if target is None:
            kept = ", ".join(str(n) for n in sorted(revisions)) or "none"
            raise invalid(f"to_revision: {name} has no revision {to} (kept: {kept})")
        stored = cache.stored[("ModelDeployment", name)]
        manifest = undo_manifest(stored.manifest, target)
        # the model's configuration goes back with it (docs/model-config.md)
        config = await self._config_undo(name, target, to)
        wanted_config = config_of(target.manifest)
        current_config = modelconfigs.config_text(
            (o.manifest for o in cache.objects_of(modelconfigs.KIND)), target.model[0]
        )
        if template_hash(with_config(manifest, wanted_config)) == template_hash(
            with_config(stored.manifest, current_config)
        ):
            return f"{name} already asks for revision {to}'s template: nothing to undo"
        floor = undo_refused(snapshot_of(cache), self.tuf(), name, state, to, self.clock())
        if floor is not None:  # the devices' anti-rollback floor (hub.decide.undo)
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, floor)
        key = storekeys.object_key("ModelDeployment", name)
        current = await self.store.get(key)  # keeps its creationTimestamp
        created = storekeys.created_of(current.value) if current is not None else None
        compares, puts = (
            [Compare(key, stored.revision)],
            [Put(key, storekeys.object_value(manifest, created))],
        )
        if config is not None:
            compares.append(config[1])
            puts.append(config[2])
        try:
            revision = await self.store.txn(compares, puts)
        except CompareFailed:
            raise Refused(
                grpc.StatusCode.ABORTED, f"{name} changed meanwhile; try the undo again"
            ) from None
        if config is not None:
            cache.put_object(config[0], revision)
        # what the controller makes: the stable revision's template again is no new revision
        # (hub.decide.rollout), any other a new one
        stable = revisions.get(state.stable)
        again = (
            stable is not None
            and state.stable != state.revision
            and stable.template
            == template_hash(with_config(with_restart(manifest, state.restarted_at), wanted_config))
            and not manifest.get("spec", {}).get("rollout", {}).get("waves")
        )
        number = max(cache.revisions.get(name, {}), default=0) + 1
        cache.put_object(manifest, revision)  # the rollout controller reacts (hub.state.feed)
        self.writer.event(
            "ModelDeployment",
            name,
            "Normal",
            "RolloutUndo",
            f"{name} set back to revision {to}'s template ({target.model[1]}) by {actor}",
        )
        await cache.feed.settled()  # the new revision exists when it answers
        if again:
            return (
                f"{name}: back to revision {state.stable} ({target.model[1]}), the stable "
                "one: no new revision"
            )
        said = f"{name}: rolling back to revision {to} ({target.model[1]}) as revision {number}"
        if config is not None:
            said += (
                f"; ModelConfig {config[0]['metadata']['name']} set back to revision {to}'s "
                f"(it configures every deployment of model {target.model[0]})"
            )
        return said
