"""What each field of a kind is, read from the API's own validation (``edgectl explain``).

The schema is not written down twice: :func:`schema_of` runs the kind's real reader
(:func:`edgefleet.api.manifests.read_manifest`) in *exploring* mode, where every section is
entered whether present or not and every field it asks for is recorded with how it was asked
(required or optional; scalar, object, list, map) and what its converter accepts, which comes
from the converter's own error messages (``int_in(1, 1024)`` says "must be an integer" and
"must be from 1 to 1024"). Defaults come from the canonical document of a minimal manifest
(``to_dict()`` spells every default out); descriptions from the docstrings of the typed
classes, plus a line for the fields whose class says nothing of them (:data:`FIELD_HELP`).
A new field in a reader therefore appears in ``explain`` as soon as it is read.

Everything here is pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgefleet.api import manifests, shown
from edgefleet.api.agentupgrades import AgentUpgrade
from edgefleet.api.baselines import SecurityBaseline
from edgefleet.api.deployments import ModelDeployment
from edgefleet.api.healthpolicies import DeviceHealthPolicy
from edgefleet.api.meta import API_VERSION, SERVER_METADATA
from edgefleet.api.modelconfigs import ModelConfig
from edgefleet.api.priorities import PriorityClass
from edgefleet.api.secrets import Secret
from edgefleet.api.validating import Problems, Reader
from edgefleet.errors import EdgefleetError


class ExplainError(EdgefleetError):
    """An unknown kind or field path; the message says what there is instead."""


@dataclass
class FieldSchema:
    """One field of a kind, as its reader reads it."""

    name: str
    path: str  # "spec.runtime.maxBatchSize"; list items share their list's path
    type: str  # kubectl's words: <string>, <integer>, <Object>, <[]Object>, <map[string]string>
    required: bool = False
    accepts: tuple[str, ...] = ()  # what the validation says it must be
    default: Any = None
    description: str = ""
    fields: dict[str, FieldSchema] = field(default_factory=dict)


FIELD_HELP: Mapping[str, str] = {
    "apiVersion": f'The API version of the object: "{API_VERSION}".',
    "kind": "The kind of the object.",
    "metadata": "The object's name, labels and annotations.",
    "metadata.name": "The object's name, unique within its kind.",
    "metadata.labels": "Labels to select the object by (edgectl get -l).",
    "metadata.annotations": "Free-form notes; not used for selection.",
    **{
        f"metadata.{name}": "Set by the hub when it shows the object; ignored when applied."
        for name in SERVER_METADATA
    },
    "spec": "What the object asks for.",
    "spec.model.name": "The model's name, as pushed with edgectl models push --name.",
    "spec.model.version": 'The model version, as pushed; a string ("2.40" in quotes).',
    "spec.model.path": "Static manifests only: the model file, relative to the manifest.",
    "spec.model.sha256": "The artifact digest to pin, if any.",
    "spec.model.metadata": "Static manifests only: the signed metadata file.",
    "spec.model.rollbackAllowance": "Static manifests only: a signed rollback allowance file.",
    "spec.runtime.maxBatchSize": "Rows per batch the worker may merge requests into.",
    "spec.runtime.maxQueueDelay": "How long the worker may hold requests to fill a batch.",
    "spec.runtime.precision": "The precision to serve at (the artifact must provide it).",
    "spec.runtime.executionProviders": "ONNX Runtime providers allowed, in order of "
    "preference; list CPUExecutionProvider to allow falling back to the CPU.",
    "spec.runtime.intraOpThreads": "ONNX Runtime's threads per replica (default: one per "
    "whole core of the cpu request, else 1).",
    "spec.replicas.perDevice": "Replicas on every device the deployment is placed on.",
    "spec.replicas.total": "Replicas across the fleet, placed by the hub's scheduler.",
    "spec.resources.cpu": 'CPU per replica, as in Kubernetes ("500m", "2").',
    "spec.resources.memory": 'Memory per replica, as in Kubernetes ("256Mi").',
    "spec.resources.accelerator": "An accelerator class (npu), vendor (hailo) or kind "
    "(nvidia-gpu) a device must have usable.",
    "spec.placement.nodeSelector": "Device labels a device must have.",
    "spec.placement.tolerations": "Device taints the deployment tolerates.",
    "spec.placement.regions": "Hub regions the deployment may run in.",
    "spec.rollout.maxUnavailable": "Devices that may serve nothing during a rollout.",
    "spec.rollout.maxSurge": "Devices switched at once beyond maxUnavailable.",
    "spec.placement.tolerations.key": "The taint's key (empty with Exists: every taint).",
    "spec.placement.tolerations.operator": "Equal: the taint's value must be value; Exists: "
    "any value.",
    "spec.placement.tolerations.value": "The taint's value, with Equal.",
    "spec.placement.tolerations.effect": "The taint effect tolerated (empty: every effect).",
    "spec.placement.topologySpread.key": "The device label whose values are the domains.",
    "spec.placement.topologySpread.minPerDomain": "Replicas at least in every domain.",
    "spec.probes.startup": "Load and warm-up must finish within timeoutSeconds.",
    "spec.probes.readiness": "A replica not answering failureThreshold pings in a row gets no "
    "requests.",
    "spec.probes.liveness": "A replica silent for periodSeconds x failureThreshold is restarted.",
    "spec.rollout.canary": "Steps of the fleet a new revision goes to, each checked by the "
    "analysis before the next.",
    "spec.rollout.waves": "At a root hub (federation): the regions a new revision goes to, "
    "wave by wave, each wave's regions done before the next; a failing region rolls every "
    "region back. The regions no wave names follow the last wave.",
    "spec.rollout.waves.regions": "The regions of this wave (of placement.regions, if set); a "
    "region is in at most one wave.",
    "spec.rollout.waves.pause": "A pause between waves: for a duration, or (empty) until "
    "edgectl rollout resume.",
    "spec.rollout.waves.percent": "Every region not given the new revision yet gets it on this "
    "percentage of its devices (each region's rollout is held there) before the next wave.",
    "spec.scaling.minReplicas": "Replicas per device at least (replicas.total: in all).",
    "spec.scaling.maxReplicas": "Replicas per device at most (replicas.total: in all).",
    "spec.scaling.queueDepthUp": "Queued requests per replica that add a replica.",
    "spec.scaling.cpuDownBelow": "CPU use below which a replica is removed.",
    "spec.power.schedule": "Windows of reduced power (device local time), each at a precision.",
    "spec.power.lowBattery": "On battery below a charge, serve at this precision.",
    "spec.power.lowBattery.below": "The battery charge under which the precision applies.",
    "spec.requireAttestation": "Devices must pass attestation to keep their workloads.",
    "spec.requireTpm": "Devices must attest with a TPM quote (implies requireAttestation).",
    "spec.requireMeasurementPcr": "TPM quotes must also cover edged's measurement PCR with an "
    "event log that replays: edged.toml trust.measurementPcr (implies requireTpm).",
    "spec.allowedCodeDigests": "Digests of edged's code that pass attestation (empty: any).",
    "spec.allowedConfigDigests": "Digests of edged's config that pass attestation (empty: any).",
    "spec.allowedModelDigests": "Artifact digests a device may hold (empty: any).",
    "spec.minUptime": "The device is schedulable once up for this long.",
    "spec.minAvailableMemory": "Memory available at least.",
    "spec.maxCpuTemperature": "CPU temperature at most, in degrees Celsius.",
    "spec.minDiskFree": "Free disk space in the data directory at least.",
    "spec.requiredAccelerators": "Accelerator classes that must be usable.",
    "spec.requiredLabels": "Labels the device must have.",
    "spec.hysteresis": "How far past a failed bound the device must come back.",
    "spec.data": "A Secret's values as base64, by key (a key is the file name on the device).",
    "spec.stringData": "A Secret's values as text, by key (a key is the file name on the device).",
    "spec.secrets": "Secrets given to the workers, each a tmpfs directory only they may read.",
    "spec.secrets.name": "The Secret's name.",
    "spec.secrets.mountPath": "The name the workload knows the directory by "
    "(EDGEFLEET_SECRET_DIRS maps it to the directory).",
    "spec.placement.maxLatencyP95": "Not on devices whose own measured p95 of the model "
    "(a self-benchmark when a revision starts there) is above this (replicas.total).",
    "spec.value": "The priority deployments of this class get: higher wins.",
    "spec.preemptionPolicy": "PreemptLowerPriority: may evict lower priorities to fit; "
    "Never: placed before them, evicts nothing.",
    "spec.description": "For people: when to use this class.",
}


KIND_FIELD_HELP: Mapping[str, Mapping[str, str]] = {
    "ModelConfig": {
        "spec.model": "The model it configures (as pushed with edgectl models push --name): "
        "every deployment of it gets the config; one ModelConfig per model.",
        "spec.data": "The fleet-wide defaults: keys to any JSON values (docs/model-config.md). "
        "Checked against the model's signed config.schema.json when it has one.",
        "spec.files": "Small text files by file name, the fleet-wide defaults (in the worker's "
        "config directory, files/NAME).",
        "spec.overrides": "Overrides by label selector or by device name, merged over the "
        "defaults in order: selectors with fewer labels first, then device names; the most "
        "specific wins; null removes a key.",
    },
    "AgentUpgrade": {
        "spec.version": "The edged release the selected devices move to (pushed with edgectl "
        "agent push); inside the hub's version window.",
        "spec.selector": "The devices upgraded: every label must match (none: every device of "
        "the hub).",
        "spec.rollout.canary": "steps: percentages of the devices (rounded up, at least one), "
        "strictly increasing; a step passes once that many came back healthy or failed; then "
        "every device.",
        "spec.rollout.maxUnavailable": "Devices between being sent the release and done (came "
        "back healthy) or failed, at most: a count or a percentage (rounded down, at least 1).",
        "spec.rollout.progressDeadlineSeconds": "A device not back healthy this long after it "
        "was sent the release counts as failed.",
        "spec.rollout.failureThreshold": "Failed devices that stop the rollout and send every "
        "updated device back: a count or a percentage of the devices (rounded up, at least 1).",
        "spec.rollout.waves": "At a root hub (federation): the regions the upgrade goes to, "
        "wave by wave, each wave's regions Complete before the next; a region that rolls it "
        "back stops the waves and every region sent it rolls it back. The regions no wave "
        "names follow the last wave. No percent waves.",
        "spec.rollout.waves.regions": "The regions of this wave; a region is in at most one "
        "wave, and its hub must hold the release (edgectl agent push there).",
        "spec.rollout.waves.pause": "A pause between waves: for a duration, or (empty) until "
        "edgectl rollout resume.",
        "spec.commit.deadlineSeconds": "How long the new edged may take to commit (connected, "
        "state loaded, workloads serving) before the device's launcher goes back.",
        "spec.commit.maxTries": "Starts of the new edged before the device's launcher gives up "
        "on it.",
    },
    "Secret": {
        "spec.requireTpm": "Sent only to TPM-attested devices (an attestation key bound to "
        "the TPM's endorsement key, last evidence trusted); a deployment mounting it is not "
        "placed on other devices, and a device without such a key refuses to open it.",
    },
}
"""Descriptions of a field of one kind where :data:`FIELD_HELP`'s (by path) is another's."""


KIND_HELP: Mapping[str, str] = {
    "AgentUpgrade": "edged moved to another release on the selected devices, canary steps "
    "first; stopped and reverted past its failure threshold (docs/agent-updates.md).",
    "PriorityClass": "A named priority that ModelDeployments refer to (spec.priorityClassName).",
    "ModelConfig": "Per-device configuration of a model: defaults (spec.data, spec.files), "
    "overrides by label selector and by device name, the most specific winning "
    "(docs/model-config.md).",
    "SecurityBaseline": "What devices must prove to keep their workloads: attestation, a TPM, "
    "the digests of their code, config and models.",
}


# -- exploring the reader ----------------------------------------------------------------------

_PROBES: tuple[object, ...] = (object(), "\x00", True, "", "9999h", "0", "-1")
"""Values of no type or a wrong one, and strings that parse as large or zero quantities (so
that the bounds checked after parsing speak too)."""
_NUMBER_PROBES: tuple[object, ...] = (10**30, -(10**30), 0.5)
"""Only for numeric fields: a string field that also takes numbers would speak of the bound
of its number form, not of the bound the field has."""


def _accepts(convert: Callable[[object], object]) -> tuple[str, ...]:
    """What ``convert`` says a value must be, from its refusals of a few probes."""
    found: list[str] = []
    numeric = _scalar_type(convert) in ("<integer>", "<number>")
    for probe in _PROBES[:3] + (_NUMBER_PROBES if numeric else _PROBES[3:]):
        try:
            convert(probe)
        except ValueError as exc:
            text = _expectation(str(exc))
            if text and text not in found:
                found.append(text)
        except Exception:  # a converter that breaks on a probe tells nothing
            continue
    if len(found) > 1:  # "must be a string" says nothing the others do not
        found = [t for t in found if t != "must be a string"]
    # "must be a label key" when "must be a label key: at most 63..." says more
    return tuple(t for t in found if not any(o != t and o.startswith(t) for o in found))


def _expectation(message: str) -> str:
    """``must be X (a string), got 5`` -> ``must be X``."""
    text = re.sub(r",? got .*$", "", message, flags=re.S).strip()
    return re.sub(r" \((?:a string|write it in quotes)\)$", "", text)


def _scalar_type(convert: Callable[[object], object]) -> str:
    """kubectl's word for what ``convert`` reads, from what it says to a value of no type."""
    try:
        convert(object())
    except Exception as exc:  # any refusal says something
        text = _expectation(str(exc))
    else:
        return "<value>"
    return {
        "must be an integer": "<integer>",
        "must be a number": "<number>",
        "must be true or false": "<boolean>",
        "must be a mapping of keys to JSON values": "<map[string]JSON>",
        "must be a mapping of file name to text": "<map[string]string>",
    }.get(text, "<string>")


class _Exploring(Problems):
    """Problems that hand out exploring readers and record what they are asked."""

    def __init__(self) -> None:
        super().__init__()
        self.root = FieldSchema(name="", path="", type="<Object>")
        self.nodes: dict[str, FieldSchema] = {"": self.root}

    def reader(self, value: object, path: str = "") -> Reader | None:
        return _ExploringReader(self, path, value if isinstance(value, Mapping) else {})

    def record(self, parent: str, name: str, path: str, type_: str, **kw: Any) -> FieldSchema:
        node = self.nodes.get(path)
        if node is None:
            node = FieldSchema(name=name, path=path, type=type_, **kw)
            self.nodes[path] = node
            self.nodes[parent].fields.setdefault(name, node)
        else:
            node.required = node.required or bool(kw.get("required"))
        return node


class _ExploringReader(Reader):
    """A reader that enters every section and records every field it is asked about."""

    problems: _Exploring

    def _record(self, name: str, type_: str, **kw: Any) -> str:
        path = self.at(name)
        self.problems.record(self.path, name, path, type_, **kw)
        return path

    def required(self, name: str, convert: Any, fallback: Any) -> Any:
        self._record(name, _scalar_type(convert), required=True, accepts=_accepts(convert))
        value = self.raw(name)
        return fallback if value is None else convert(value)

    def optional(self, name: str, convert: Any, default: Any) -> Any:
        self._record(name, _scalar_type(convert), accepts=_accepts(convert))
        return default

    def section(self, name: str) -> Reader | None:
        path = self._record(name, "<Object>")
        self.raw(name)
        return _ExploringReader(self.problems, path, {})

    def required_section(self, name: str) -> Reader | None:
        path = self._record(name, "<Object>", required=True)
        return _ExploringReader(self.problems, path, {})

    def items(self, name: str) -> list[tuple[str, object]]:
        path = self._record(name, "<[]Object>")
        return [(path, {})]

    def list_of(self, name: str, convert: Any, *, unique: bool = False) -> Any:
        item = _scalar_type(convert).strip("<>")
        self._record(name, f"<[]{item}>", accepts=_accepts(convert))
        return None

    def string_map(self, name: str, key: Any, value: Any) -> Any:
        accepts = tuple(f"keys: {t}" for t in _accepts(key)) + tuple(
            f"values: {t}" for t in _accepts(value)
        )
        self._record(name, "<map[string]string>", accepts=accepts)
        return None


# -- defaults and descriptions -------------------------------------------------------------------

_MINIMAL_SPEC: Mapping[str, Mapping[str, Any]] = {
    "ModelDeployment": {"model": {"name": "m", "version": "1"}, "replicas": {"perDevice": 1}},
    "Secret": {"stringData": {"k": "v"}},
    "PriorityClass": {"value": 0},
    "AgentUpgrade": {"version": "0.1.0"},
    "ModelConfig": {"model": "m"},
}


def _canonical(kind: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": "m"}}
    doc["spec"] = dict(_MINIMAL_SPEC.get(kind, {}))
    return manifests.parse_manifest(doc).to_dict()


def _lookup(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(doc, Mapping) or part not in doc:
            return None
        doc = doc[part]
    return doc


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass in a field's type (``X``, ``X | None``, ``tuple[X, ...]``)."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) in (typing.Union, tuple):
        for arg in typing.get_args(hint):
            found = _dataclass_of(arg)
            if found is not None:
                return found
    return None


def _doc(cls: type | None) -> str:
    """A class's docstring in one paragraph, without rST markup or the ``path``: prefix."""
    doc = (cls.__doc__ or "") if cls is not None else ""
    if cls is None or doc.startswith(cls.__name__ + "("):  # the one dataclasses makes up
        return ""
    text = " ".join(doc.split("\n\n")[0].split())
    text = re.sub(r"^``[\w.]+``(?: per replica)?: ", "", text)
    text = text.replace("``", "")
    return text[:1].upper() + text[1:]


def _describe(node: FieldSchema, cls: type | None) -> None:
    """Fill in descriptions from the typed classes, walked alongside the schema."""
    hints: dict[str, Any] = {}
    if cls is not None:
        try:
            hints = typing.get_type_hints(cls)  # in the globals of the class's own module
        except Exception:  # a hint it cannot resolve: no descriptions there
            hints = {}
    for name, child in node.fields.items():
        snake = _snake(name)
        hint = hints.get(snake) or next(
            (h for f, h in hints.items() if f.startswith(snake + "_")), None
        )
        child_cls = _dataclass_of(hint) if hint is not None else None
        child.description = FIELD_HELP.get(child.path) or _doc(child_cls)
        _describe(child, child_cls)


_KIND_CLASSES: Mapping[str, type] = {
    "ModelDeployment": ModelDeployment,
    "DeviceHealthPolicy": DeviceHealthPolicy,
    "SecurityBaseline": SecurityBaseline,
    "Secret": Secret,
    "PriorityClass": PriorityClass,
    "AgentUpgrade": AgentUpgrade,
    "ModelConfig": ModelConfig,
}


def schema_of(kind: str) -> FieldSchema:
    """The schema of ``kind`` (one of :data:`edgefleet.api.manifests.SUPPORTED_KINDS`)."""
    if kind not in manifests.SUPPORTED_KINDS:
        raise ExplainError(f"unknown kind {kind!r} (one of {', '.join(manifests.SUPPORTED_KINDS)})")
    exploring = _Exploring()
    manifests.read_manifest(exploring, {"apiVersion": API_VERSION, "kind": kind})
    root = exploring.root
    root.name, root.type = kind, "<Object>"
    cls = _KIND_CLASSES.get(kind)
    root.description = _doc(cls) or KIND_HELP.get(kind, "")
    for name in SERVER_METADATA:
        root.fields["metadata"].fields.setdefault(
            name,
            FieldSchema(name=name, path=f"metadata.{name}", type="<string>"),
        )
    canonical = _canonical(kind)
    minimal = {"apiVersion": 1, "kind": 1, "metadata": {"name": 1}, "spec": _MINIMAL_SPEC.get(kind)}
    for path, node in exploring.nodes.items():
        if path and not node.fields and not node.required and _lookup(minimal, path) is None:
            node.default = _lookup(canonical, path)
    _describe(root, cls)
    for path, text in KIND_FIELD_HELP.get(kind, {}).items():
        node = root
        for part in path.split("."):
            node = node.fields[part]
        node.description = text
    for name in ("apiVersion", "kind"):
        root.fields[name].description = FIELD_HELP[name]
    root.fields["metadata"].description = FIELD_HELP["metadata"]
    return root


def _from_node(name: str, path: str, node: shown.Node) -> FieldSchema:
    type_, description, fields = node
    schema = FieldSchema(name=name, path=path, type=type_, description=description)
    for child, sub in fields.items():
        schema.fields[child] = _from_node(child, f"{path}.{child}" if path else child, sub)
    return schema


def shown_schema(kind: str) -> FieldSchema:
    """The schema of a kind only the hub makes (:data:`edgefleet.api.shown.SHOWN`)."""
    return _from_node(kind, "", shown.SHOWN[kind])


EXPLAINED_KINDS = (*manifests.SUPPORTED_KINDS, *shown.SHOWN)
"""Every kind ``explain`` knows: the applied ones and those only the hub makes."""


def explain(kind: str, path: str = "") -> FieldSchema:
    """The schema node at ``path`` (``spec.runtime``) of ``kind``; ExplainError naming the
    first part that does not exist, with the fields there are."""
    if kind in shown.SHOWN:
        node = shown_schema(kind)
    elif kind in EXPLAINED_KINDS:
        node = schema_of(kind)
        if kind in shown.STATUS:
            node.fields["status"] = _from_node("status", "status", shown.STATUS[kind])
    else:
        raise ExplainError(f"unknown kind {kind!r} (one of {', '.join(EXPLAINED_KINDS)})")
    walked = kind
    for part in [p for p in path.split(".") if p] if path else []:
        child = node.fields.get(part)
        if child is None:
            there = ", ".join(node.fields) or "none: it is not an object"
            raise ExplainError(f'field "{part}" does not exist in {walked} (fields: {there})')
        node, walked = child, f"{walked}.{part}"
    return node
