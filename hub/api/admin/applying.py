"""AdminService's Apply: all or nothing.

Documents are parsed and validated first (:mod:`hub.decide.apply`: INVALID_ARGUMENT naming
``documents[i].<path>`` for every problem); then each object's key is read, canonical equality
decides the outcome, and every changed object is written in **one** store transaction that
compares each key's mod revision as it was read. A concurrent change makes it fail whole:
ABORTED, retryable. Unchanged objects are not written (no revision bump).

The handler only writes: the cache tells the controllers of what changed
(:mod:`hub.state.feed`), and Apply answers once they acted on it (``cache.feed.settled()``:
a deployment's new revision exists when it answers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from edgefleet.api import PRIORITY_CLASSES, ModelDeployment, PriorityClass, parse_manifest
from edgefleet.api.modelconfigs import ModelConfig
from edgefleet.errors import EdgefleetError, ValidationError
from edgefleet.v1 import admin_pb2
from edgefleet.versioning import installed_version
from hub.api.admin.common import AdminAuth, Refused, invalid, problems_text, refuse_root_owned, rpc
from hub.controllers.wave import WaveController
from hub.decide import apply, modelconfigs, priority, regionslice, statebound
from hub.decide.agentdesired import version_refusal
from hub.decide.desired import MAX_DESIRED_STATE_BYTES
from hub.decide.modelclaim import apply_refusal
from hub.decide.rollout import Revision, template_hash
from hub.decide.status import placement_warnings
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.configschemas import ConfigSchemas
from hub.state.regions import Regions
from hub.state.secrets import MAX_SECRETS, SecretKeys, SecretRecord, plan_record, record_of
from hub.state.snapshots import snapshot_of
from hub.state.store import Compare, Put, Store
from hub.state.trustroots import HubRoots
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository
from hub.state.writer import DeviceWriter

KIND_PRIORITY_CLASS = PriorityClass.KIND

_OUTCOMES = {
    apply.Outcome.CREATED: admin_pb2.ApplyResult.CREATED,
    apply.Outcome.CONFIGURED: admin_pb2.ApplyResult.CONFIGURED,
    apply.Outcome.UNCHANGED: admin_pb2.ApplyResult.UNCHANGED,
}


@dataclass(slots=True)
class _Planned:
    """One object of an Apply: the key's mod revision as read (0: absent) and the outcome."""

    obj: apply.ParsedObject
    key: str
    read_revision: int
    outcome: apply.Outcome
    revision: int  # the object's resource version once applied
    created: float | None = None  # when it was first applied (now, for a new object)
    secret: SecretRecord | None = None  # a Secret's values sealed with the hub's key

    def stored_value(self) -> bytes:
        sealed = self.secret.to_json() if self.secret is not None else None
        return storekeys.object_value(self.obj.manifest, self.created, sealed)


class Applies:
    """Apply (module doc)."""

    def __init__(
        self,
        authorize: AdminAuth,
        store: Store,
        cache: Cache,
        writer: DeviceWriter,
        secret_keys: SecretKeys,
        *,
        region: str,
        regions: Regions | None,
        waves: WaveController | None,
        tuf: Callable[[], TufRepository | RelayedTuf | None],
        clock: Callable[[], float],
        schemas: ConfigSchemas | None = None,
    ) -> None:
        self.authorize = authorize
        self.store = store
        self.cache = cache
        self.writer = writer
        self.secret_keys = secret_keys  # seal a Secret's values before any write
        self.region = region
        self.regions = regions  # a root hub's regions: waves name them
        self.waves = waves  # None: a regional hub (no waves)
        self.tuf = tuf  # the TUF repository held now: its delegations are publisher keys
        self.clock = clock
        self.schemas = schemas  # models' config schemas (None: ModelConfigs are not checked)

    @rpc
    async def Apply(self, request: admin_pb2.ApplyRequest, context: Any) -> admin_pb2.ApplyResponse:
        try:
            parsed = apply.parse_documents(list(request.documents))
            if any(p.manifest.get("spec", {}).get("publishers") is not None for p in parsed):
                apply.check_publisher_keys(list(request.documents), self._publisher_keys())
        except ValidationError as exc:
            raise invalid(problems_text(exc)) from None
        self._check_priority_classes(parsed)
        self._check_waves(parsed)
        self._check_agent_versions(parsed)
        self._check_model_configs(parsed)
        await self._check_config_schemas(parsed)
        if (claimed := apply_refusal(parsed, self.cache.deployments)) is not None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, claimed)  # hub.decide.modelclaim
        planned = [await self._plan(obj) for obj in parsed]
        if request.check_resource_version:
            self._check_resource_versions(list(request.documents), planned)
        changed = [p for p in planned if p.outcome is not apply.Outcome.UNCHANGED]
        self._check_secret_count(planned)
        if changed:
            self._check_desired_sizes(changed)
        if changed and not request.dry_run:
            writer = self.writer
            events = [
                writer.prepare_event(
                    p.obj.kind,
                    p.obj.name,
                    "Normal",
                    p.outcome.value.capitalize(),
                    f"{p.obj.kind} {p.obj.name} {p.outcome.value} by apply",
                )
                for p in changed
            ]
            # One transaction: the objects and the events that describe them.
            revision = await self.store.txn(
                [Compare(p.key, p.read_revision) for p in changed],
                [
                    *(Put(p.key, p.stored_value()) for p in changed),
                    *(e.put for e in events),
                ],
            )
            for p, e in zip(changed, events, strict=True):
                p.revision = revision
                self.cache.put_object(p.obj.manifest, revision, secret=p.secret)
                writer.committed(e)
            await self.cache.feed.settled()  # its revisions exist when it answers
        return admin_pb2.ApplyResponse(
            results=[
                admin_pb2.ApplyResult(
                    kind=p.obj.kind,
                    name=p.obj.name,
                    outcome=_OUTCOMES[p.outcome],
                    resource_version=p.revision,
                    warnings=self._warnings(p.obj, p.outcome),
                )
                for p in planned
            ]
        )

    def _check_resource_versions(self, documents: list[bytes], planned: list[_Planned]) -> None:
        """Each object still at the resourceVersion its document carries (edgectl edit,
        patch, scale): ABORTED naming the first that changed, nothing written. The store
        transaction compares what was read here, so a change after this check fails it too."""
        try:
            versions = apply.resource_versions(documents)
        except ValidationError as exc:
            raise invalid(problems_text(exc)) from None
        for p, version in zip(planned, versions, strict=True):
            if p.read_revision == 0:
                raise Refused(
                    grpc.StatusCode.ABORTED,
                    f'{p.obj.kind} "{p.obj.name}" was deleted since resourceVersion {version}: '
                    "nothing applied",
                )
            if p.read_revision != version:
                raise Refused(
                    grpc.StatusCode.ABORTED,
                    f'{p.obj.kind} "{p.obj.name}" changed since resourceVersion {version} (now '
                    f"{p.read_revision}): nothing applied; get it again and apply the change to "
                    "the latest version",
                )

    def _publisher_keys(self) -> frozenset[str]:
        """The publisher keys this hub knows: the artifacts keys of its trust root and the
        keys of its TUF delegations."""
        from edgefleet.errors import TrustError
        from edgefleet.trust.documents import ROLE_ARTIFACTS, parse_root
        from edgefleet.trust.envelopes import ROOT_TYPE, decode_payload, parse_envelope_bytes

        known: set[str] = set()
        trust_root = HubRoots(self.cache.trust_roots).current
        if trust_root:
            try:
                env = parse_envelope_bytes(trust_root, what="the hub's trust root")
                root = parse_root(decode_payload(env, expected_type=ROOT_TYPE, what="root"))
                known.update(root.role(ROLE_ARTIFACTS).keyids)
            except TrustError:
                pass  # checked at start; a hub without a usable root knows no publisher
        tuf = self.tuf()
        if tuf is not None:
            delegations = tuf.targets.delegations
            if delegations is not None:
                known.update(delegations.keys)
        return frozenset(known)

    def _check_desired_sizes(self, changed: list[_Planned]) -> None:
        """Refuse an apply that makes a device's desired state too large for a message (it
        could then never be sent to that device), naming the devices and sizes; a device
        already over the bound refuses only an apply that grows it (hub.decide.statebound)."""
        cache = self.cache
        trial = dataclasses.replace(
            cache, stored=dict(cache.stored), deployments=dict(cache.deployments)
        )
        for p in changed:
            trial.put_object(p.obj.manifest, 0)
        # the worst case: each changed deployment's new revision on every device it reaches
        planned = {
            p.obj.name: Revision(p.obj.name, 0, template_hash(p.obj.manifest), p.obj.manifest, 0.0)
            for p in changed
            if p.obj.kind == "ModelDeployment"
        }
        too_big = statebound.grown_past_bound(
            snapshot_of(cache), snapshot_of(trial), planned=planned, region=self.region
        )
        if too_big:
            shown = ", ".join(f"{n} ({s / 2**20:.1f} MiB)" for n, s in too_big[:10])
            more = f" and {len(too_big) - 10} more" if len(too_big) > 10 else ""
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"nothing applied: the desired state of {len(too_big)} device(s) would exceed "
                f"{MAX_DESIRED_STATE_BYTES / 2**20:.2f} MiB, the most a device can receive: "
                f"{shown}{more}; make manifests smaller (annotations) or select fewer devices",
            )

    def _check_priority_classes(self, parsed: list[apply.ParsedObject]) -> None:
        """A deployment naming a class that is neither built in nor applied (before, or in
        this apply) is refused, and nothing is applied."""
        deployments = []
        for obj in parsed:
            if obj.kind == "ModelDeployment":
                dep = parse_manifest(dict(obj.manifest))
                assert isinstance(dep, ModelDeployment)
                deployments.append(dep)
        known = {o.name for o in self.cache.objects_of(KIND_PRIORITY_CLASS)}
        known |= {obj.name for obj in parsed if obj.kind == KIND_PRIORITY_CLASS}
        unknown = priority.unknown_classes(deployments, known)
        if unknown:
            builtin = ", ".join(PRIORITY_CLASSES)
            applied = ", ".join(sorted(known)) or "none"
            raise invalid(
                "nothing applied: "
                + "; ".join(
                    f"ModelDeployment {dep}: spec.priorityClassName: unknown class {cls!r}"
                    for dep, cls in unknown
                )
                + f" (built-in: {builtin}; PriorityClasses applied: {applied})"
            )

    def _check_model_configs(self, parsed: list[apply.ParsedObject]) -> None:
        """One ModelConfig per model (hub.decide.modelconfigs); nothing applied otherwise."""
        kind = modelconfigs.KIND
        applied = [(i, o.name, o.manifest) for i, o in enumerate(parsed) if o.kind == kind]
        names = {(o.kind, o.name) for o in parsed}
        configs = [(f"documents[{i}]", str(m["spec"]["model"])) for i, _, m in applied] + [
            (f"ModelConfig {o.name}", str(o.manifest["spec"]["model"]))
            for o in self.cache.objects_of(kind)
            if (kind, o.name) not in names
        ]
        if not configs:
            return
        enrolled = sorted(self.regions.regions) if self.regions is not None else []

        def federated(manifest: Any) -> str:  # what makes it one of a kind for its config
            if manifest.get("spec", {}).get("rollout", {}).get("waves"):
                return modelconfigs.IN_WAVES
            variants = regionslice.with_model_variant(manifest, enrolled)
            return f"giving region {variants[0]} a model variant" if variants else ""

        deployments = [
            (f"documents[{i}]", str(o.manifest["spec"]["model"]["name"]), federated(o.manifest))
            for i, o in enumerate(parsed)
            if o.kind == "ModelDeployment"
        ] + [
            (f"ModelDeployment {o.name}", str(o.manifest["spec"]["model"]["name"]),
             federated(o.manifest))
            for o in self.cache.objects_of("ModelDeployment")
            if ("ModelDeployment", o.name) not in names
        ]  # fmt: skip
        waves = modelconfigs.wave_conflicts(configs, deployments)
        if waves:
            raise invalid("nothing applied: " + "; ".join(waves))
        if applied:
            stored = [o.manifest for o in self.cache.objects_of(kind)]
            problems = modelconfigs.model_conflicts(applied, stored)
            devices = [(d.name, d.all_labels()) for d in self.cache.devices.values()]
            for i, _, manifest in applied:
                config = parse_manifest(dict(manifest))
                assert isinstance(config, ModelConfig)
                problems += [
                    f"documents[{i}].{p}" for p in modelconfigs.size_problems(config, devices)
                ]
                problems += [
                    f"documents[{i}].{p}" for p in modelconfigs.processing_problems(config, devices)
                ]
            if problems:
                raise invalid("nothing applied: " + "; ".join(problems))

    async def _check_config_schemas(self, parsed: list[apply.ParsedObject]) -> None:
        """Every ModelConfig against the config schema of every version its model's
        deployments name (hub.decide.modelconfigs.schema_problems), where the config or the
        deployment is in this apply; nothing applied otherwise, each problem at its path."""
        kind = modelconfigs.KIND
        configs: dict[str, tuple[int | None, Any]] = {}  # model -> (document index, config)
        for o in self.cache.objects_of(kind):
            configs[str(o.manifest["spec"]["model"])] = (None, o.manifest)
        # model -> (artifact: the model or a variant a region runs, version) -> document index
        versions: dict[str, dict[tuple[str, str], int | None]] = {}

        def add(manifest: Any, index: int | None) -> None:
            ref = manifest["spec"]["model"]
            name, version = str(ref["name"]), str(ref["version"])
            for artifact in (name, *regionslice.model_variants(manifest)):
                versions.setdefault(name, {})[(artifact, version)] = index

        for o in self.cache.objects_of("ModelDeployment"):
            add(o.manifest, None)
        for i, obj in enumerate(parsed):
            if obj.kind == kind:
                configs[str(obj.manifest["spec"]["model"])] = (i, obj.manifest)
            elif obj.kind == "ModelDeployment":
                add(obj.manifest, i)
        devices = [(d.name, d.all_labels()) for d in self.cache.devices.values()]
        problems: list[str] = []
        for model, (ci, manifest) in sorted(configs.items()):
            for (artifact, version), di in sorted(versions.get(model, {}).items()):
                if (ci is None and di is None) or self.schemas is None:
                    continue
                try:
                    schema = await self.schemas.of(artifact, version)
                except EdgefleetError as exc:
                    raise Refused(grpc.StatusCode.UNAVAILABLE, str(exc)) from None
                if schema is None:
                    continue
                config = parse_manifest(dict(manifest))
                assert isinstance(config, ModelConfig)
                found = modelconfigs.schema_problems(config, schema, devices)
                against = (
                    f"the config schema of model {artifact} {version} (signed by its publisher)"
                )
                if ci is not None:
                    problems += [f"documents[{ci}].{p} ({against})" for p in found]
                elif found:
                    problems.append(
                        f"documents[{di}].spec.model.version: {version} carries {against}, "
                        f"and ModelConfig {config.name} does not validate: {found[0]}"
                        + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
                    )
        if problems:
            raise invalid("nothing applied: " + "; ".join(problems))

    def _check_agent_versions(self, parsed: list[apply.ParsedObject]) -> None:
        """An AgentUpgrade to a version outside this hub's window is refused, and nothing is
        applied (edgefleet.agentskew)."""
        problems = []
        for i, obj in enumerate(parsed):
            if obj.kind == "AgentUpgrade":
                why = version_refusal(str(obj.manifest["spec"]["version"]), installed_version())
                if why is not None:
                    problems.append(f"documents[{i}].{why}")
        if problems:
            raise invalid("nothing applied: " + "; ".join(problems))

    def _check_waves(self, parsed: list[apply.ParsedObject]) -> None:
        """``spec.rollout.waves`` rolls a revision out across regions: only at a root hub with
        regions enrolled, naming enrolled regions (hub.decide.wave). A per-region override
        (hub.decide.regionslice) may not name this hub's own region."""
        problems: list[str] = []
        regions = self.regions
        enrolled = sorted(regions.regions) if regions is not None else []
        for i, obj in enumerate(parsed):
            waves = obj.manifest.get("spec", {}).get("rollout", {}).get("waves")
            if obj.kind not in ("ModelDeployment", "AgentUpgrade") or not waves:
                continue
            path = f"documents[{i}].spec.rollout.waves"
            if self.waves is None:
                problems.append(
                    f"{path}: this is a regional hub: waves roll a revision out across regions "
                    "and are set at the root hub (docs/federation.md)"
                )
            elif not enrolled:
                problems.append(
                    f"{path}: this hub has no regional hubs enrolled (federation, "
                    "docs/federation.md): waves roll a revision out across the regions of a "
                    "root hub"
                )
            else:
                for j, wave in enumerate(waves):
                    for k, region in enumerate(wave.get("regions", [])):
                        if region not in enrolled:
                            problems.append(
                                f"{path}[{j}].regions[{k}]: {region!r} is not an enrolled "
                                f"region (enrolled: {', '.join(enrolled)})"
                            )
        for i, obj in enumerate(parsed):  # an override for this hub's own devices: none apply
            for key, region in sorted(regionslice.override_regions(obj.manifest).items()):
                if region == self.region:
                    problems.append(
                        f'documents[{i}].metadata.annotations["{key}"]: names this hub\'s own '
                        f"region {region!r}: per-region overrides apply to the regional hubs "
                        "below it; its own devices run the deployment as applied"
                    )
        if problems:
            raise invalid("; ".join(problems))

    def _warnings(self, obj: apply.ParsedObject, outcome: apply.Outcome) -> list[str]:
        """An accepted deployment that cannot run anywhere says so at once (and the same
        words are conditions in its status)."""
        if obj.kind == modelconfigs.KIND:
            changed = outcome is not apply.Outcome.UNCHANGED
            return [modelconfigs.DELIVERY_WARNING] if changed else []
        if obj.kind != "ModelDeployment":
            return []
        dep = parse_manifest(dict(obj.manifest))
        assert isinstance(dep, ModelDeployment)
        cache = self.cache
        pushed = (dep.spec.model.name, dep.spec.model.version) in cache.models
        warnings = placement_warnings(dep, cache.devices.values(), self.region, pushed)
        regions = self.regions
        if regions is not None and any(
            regionslice.goes_to(obj.manifest, r) for r in regions.regions
        ):
            # a root hub: the deployment runs in its regions (hub.state.regions), not on its devices
            warnings = [w for w in warnings if "matches no device" not in w]
        return warnings

    async def _plan(self, obj: apply.ParsedObject) -> _Planned:
        key = storekeys.object_key(obj.kind, obj.name)
        kv = await self.store.get(key)
        stored = storekeys.manifest_of(kv.value) if kv is not None else None
        read_revision = kv.mod_revision if kv is not None else 0
        outcome = apply.outcome_of(obj.manifest, stored)
        created = storekeys.created_of(kv.value) if kv is not None else self.clock()
        secret = None
        if obj.secret is not None:  # the values decide too; they are sealed before any write
            old = record_of(storekeys.loads(kv.value), obj.name) if kv is not None else None
            try:
                secret, new_values = plan_record(self.secret_keys, obj.secret, old)
            except EdgefleetError as exc:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
            if new_values and outcome is apply.Outcome.UNCHANGED:
                outcome = apply.Outcome.CONFIGURED
        if kv is not None and outcome is not apply.Outcome.UNCHANGED:
            refuse_root_owned(obj.kind, obj.name, kv.value, "change")
        return _Planned(obj, key, read_revision, outcome, read_revision, created, secret)

    def _check_secret_count(self, planned: list[_Planned]) -> None:
        new = {p.obj.name for p in planned if p.obj.kind == "Secret"} - set(self.cache.secrets)
        total = len(self.cache.secrets) + len(new)
        if new and total > MAX_SECRETS:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"nothing applied: this hub would hold {total} Secrets, at most {MAX_SECRETS}",
            )
