"""How AdminService shows objects: as ``edgectl get`` prints them, with their computed status
(:mod:`hub.controllers.objectstatus`), a root hub's regions' figures and waves added, and
their store metadata (uid, resourceVersion, creationTimestamp)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from edgefleet.v1 import common_pb2
from hub.controllers.objectstatus import shown_object
from hub.controllers.rollout import RolloutController
from hub.controllers.wave import WaveController
from hub.decide import apply
from hub.decide.devices import Device
from hub.decide.placement import REGION_LABEL
from hub.decide.presentation import (
    KIND_TOKEN,
    device_object,
    model_object,
    token_object,
    with_store_metadata,
)
from hub.state import storekeys, tokens
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.regions import Regions
from hub.state.store import KeyValue


class Showing:
    """Objects as this hub shows them now (module doc)."""

    def __init__(
        self,
        cache: Cache,
        projector: Projector,
        *,
        region: str,
        regions: Regions | None,
        waves: WaveController | None,
        rollouts: RolloutController | None,
    ) -> None:
        self.cache = cache
        self.projector = projector  # what each device was last sent (excluded workloads)
        self.region = region
        self.regions = regions  # a root hub's regions (None: none)
        self.waves = waves  # a root hub's rollouts across its regions
        self.rollouts = rollouts  # the canary analyses shown in a deployment's status

    def device_json(self, device: Device) -> dict[str, Any]:
        cache = self.cache
        content = self.projector.content_for(device.name)
        doc = device_object(
            device,
            cache.security_policy(),
            cache.desired.get(device.name),
            content.excluded if content is not None else None,
        )
        doc["status"]["region"] = device.all_labels().get(REGION_LABEL, self.region)
        return doc

    def local_object_json(self, kind: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """An object as ``edgectl get`` shows it at this hub, regions' figures not added."""
        return shown_object(self.cache, kind, manifest, region=self.region, rollouts=self.rollouts)

    def object_json(self, kind: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        doc = self.local_object_json(kind, manifest)
        regions = self.regions
        if kind == "ModelDeployment":
            doc["status"]["region"] = self.region
            if regions is not None and regions.regions:
                doc = regions.with_regions(doc)
            waves = self.waves
            name = str(manifest["metadata"]["name"])
            shown = waves.status(name) if waves is not None else None
            if shown is not None:  # a root hub's rollout across its regions (hub.decide.wave)
                doc["status"] = {**doc["status"]}
                doc["status"]["rollout"] = {**doc["status"].get("rollout", {}), "waves": shown}
            folded = waves.across_regions(name, doc["status"]) if waves is not None else None
            if folded is not None:  # never Complete before its regions are (regionrollout)
                doc["status"] = folded
                rollout = folded["rollout"]
                if shown is not None and shown.get("phase") == "Complete" != rollout["phase"]:
                    rollout["waves"] = {
                        **shown,
                        **{k: rollout[k] for k in ("phase", "reason", "message")},
                    }
        if kind == "AgentUpgrade" and self.waves is not None:
            agent = self.waves.agent.status(str(manifest["metadata"]["name"]))
            if agent is not None:  # in waves across the regions (hub.controllers.agentwaves)
                doc["status"] = agent
        return doc

    def watched(self, kind: str) -> tuple[str, Callable[[str, bytes], dict[str, Any]]]:
        """The store prefix of ``kind`` and how a stored value of it is shown."""
        if kind == storekeys.KIND_DEVICE:
            return storekeys.DEVICES, lambda _, v: self.device_json(
                Device.from_json(storekeys.loads(v))
            )
        if kind == storekeys.KIND_MODEL:
            return storekeys.MODELS, lambda _, v: model_object(
                storekeys.ModelRecord.from_json(storekeys.loads(v))
            )
        if kind == KIND_TOKEN:
            return tokens.PREFIX, lambda _, v: token_object(tokens.TokenRecord.from_json(v))
        return storekeys.object_prefix(kind), lambda _, v: self.object_json(
            kind, storekeys.manifest_of(v)
        )


def stored_object(kind: str, doc: Mapping[str, Any], kv: KeyValue | None) -> common_pb2.Object:
    """``doc`` with its store metadata (uid, resourceVersion, creationTimestamp)."""
    if kv is None:
        return common_pb2.Object(json=storekeys.dumps(doc))
    created = storekeys.created_of(kv.value) if kind in apply.OBJECT_KINDS else None
    stamped = with_store_metadata(
        doc,
        key=kv.key,
        create_revision=kv.create_revision,
        mod_revision=kv.mod_revision,
        created=created,
    )
    return common_pb2.Object(json=storekeys.dumps(stamped), resource_version=kv.mod_revision)
