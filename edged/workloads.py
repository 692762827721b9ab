"""A workload on this device: one ModelDeployment accepted into desired state, with its model
artifact resolved to a digest in the content-addressed store, and its revision.

A *revision* is a hash of everything that requires new worker processes when it changes
(artifact digest, model name and version, runtime and resource settings, the
``edgefleet.io/restartedAt`` annotation of ``edgectl rollout restart``): a change of revision
is a zero-downtime switch (new replicas become ready before old ones stop). Pure data, below
every other edged layer (state, sources, reconcile and the hub link all speak it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NewType

import orjson

from edgefleet.api import ModelDeployment
from edgefleet.api.deployments import RESTARTED_AT

WorkloadName = NewType("WorkloadName", str)
ReplicaId = NewType("ReplicaId", str)


@dataclass(frozen=True, slots=True)
class DesiredWorkload:
    """A deployment accepted into desired state, with its artifact resolved to a digest."""

    deployment: ModelDeployment
    sha256: str  # digest of the model artifact in the content-addressed store
    source: str = ""  # where it came from (manifest file, hub); for status only
    # the artifact's signed extra files in the store (a validation set...): name -> sha256
    extras: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> WorkloadName:
        return WorkloadName(self.deployment.metadata.name)

    @property
    def revision(self) -> str:
        spec = self.deployment.spec
        doc = self.deployment.to_dict()["spec"]
        material = {
            "sha256": self.sha256,
            "model": {"name": spec.model.name, "version": spec.model.version},
            "runtime": doc.get("runtime"),
            "resources": doc.get("resources"),
        }
        if doc.get("network") is not None:  # likewise: a new egress policy restarts workers
            material["network"] = doc["network"]
        if self.extras:  # only then: revisions of artifacts without extras stay as they were
            material["extras"] = dict(sorted(self.extras.items()))
        restarted = self.deployment.metadata.annotations.get(RESTARTED_AT)
        if restarted:  # `edgectl rollout restart`: the same settings, new workers
            material["restartedAt"] = restarted
        return hashlib.sha256(orjson.dumps(material, option=orjson.OPT_SORT_KEYS)).hexdigest()[:10]

    def revision_with(self, providers: tuple[str, ...] | None, variant: str = "") -> str:
        """The revision when running with ``providers`` (chosen by discovery) and the file
        ``variant`` (sha256 of a precision variant, chosen by the power policy).

        Equal to :attr:`revision` when ``providers`` is ``None`` or the spec's own list and
        ``variant`` is empty or the model file, so a fallback, a change of precision (and the
        way back) is a new revision: a zero-downtime switch.
        """
        base = self.revision
        if providers is not None and providers != self.deployment.spec.runtime.execution_providers:
            material = {"base": base, "providers": list(providers)}
            base = hashlib.sha256(orjson.dumps(material)).hexdigest()[:10]
        if variant and variant != self.sha256:
            material = {"base": base, "variant": variant}
            base = hashlib.sha256(orjson.dumps(material)).hexdigest()[:10]
        return base


def serving_order(
    workloads: Mapping[WorkloadName, DesiredWorkload],
) -> dict[str, tuple[WorkloadName, ...]]:
    """For each model name, the workloads that give it, in the order the inference router
    prefers them: by workload name (pure). A name is served by one workload: the first with a
    ready replica; any other stands by (its status says so) and takes over at once when the
    first is deleted or has no ready replica. The hub never sends two (hub.decide.modelclaim); a
    static manifest beside a hub deployment, or an older hub, may."""
    out: dict[str, list[WorkloadName]] = {}
    for name in sorted(workloads):
        out.setdefault(workloads[name].deployment.spec.model.name, []).append(name)
    return {model: tuple(names) for model, names in out.items()}
