"""What each dashboard page shows, computed from the hub's in-memory cache: pure functions of
its records, no I/O. Everything a browser gets is bounded: a page of devices (at most
:data:`MAX_PER_PAGE`), the largest :data:`MAX_GROUPS` groups of the fleet, the newest events,
the first :data:`MAX_LISTED` failing devices and placements of a deployment, the first
:data:`MAX_REASONS` reasons the scheduler gives for the devices it left out. Aggregates are
counted here, on the hub: the browser never receives the whole fleet.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgefleet.api import ModelDeployment
from edgefleet.errors import EdgefleetError
from edgefleet.selecting import Selector, parse_selector
from hub.decide.devices import Device, DevicePhase, TrustState
from hub.decide.nodes import Explanation
from hub.decide.placement import SecurityPolicy
from hub.decide.placementview import Placed, placement_of
from hub.decide.revisions import Revision
from hub.state import storekeys

DEFAULT_PER_PAGE = 50
MAX_PER_PAGE = 200
MAX_PAGE = 1_000_000
MAX_GROUPS = 100
MAX_LISTED = 100
MAX_REASONS = 20  # reasons (and notes) of the scheduler's explanation shown, then "and K more"
MAX_QUERY_CHARS = 256
REGION_LABEL = "region"
SITE_LABEL = "site"
NO_SITE = "(no site)"


class BadQuery(EdgefleetError):
    """A query parameter out of its bounds; the message names it."""


DeviceState = tuple[DevicePhase, bool, TrustState, bool, bool, bool]
"""What the fleet page counts of a device: phase, schedulable, trust state, cordoned,
revoked, out of sync. Devices are counted by state first (one tuple each), then the states."""


def state_of(device: Device, out_of_sync: bool) -> DeviceState:
    return (
        device.phase,
        device.health.schedulable,
        device.attestation.state,
        device.cordoned,
        device.revoked,
        out_of_sync,
    )


@dataclass(slots=True)
class Counts:
    """How many devices, and how many of them in each state that matters at a glance."""

    total: int = 0
    ready: int = 0
    not_ready: int = 0
    pending: int = 0
    unhealthy: int = 0  # outside their health policy (not schedulable)
    trusted: int = 0
    untrusted: int = 0
    noncompliant: int = 0  # attestation required by a SecurityBaseline, and not Trusted
    cordoned: int = 0
    revoked: int = 0
    out_of_sync: int = 0  # have not acknowledged their newest desired state

    def add(self, device: Device, policy: SecurityPolicy, out_of_sync: bool) -> None:
        self.add_state(state_of(device, out_of_sync), policy)

    def add_state(self, state: DeviceState, policy: SecurityPolicy, n: int = 1) -> None:
        """Count ``n`` devices in ``state`` (:func:`state_of`)."""
        phase, schedulable, trust, cordoned, revoked, out_of_sync = state
        self.total += n
        if phase is DevicePhase.READY:
            self.ready += n
        elif phase is DevicePhase.NOT_READY:
            self.not_ready += n
        elif phase is DevicePhase.PENDING:
            self.pending += n
        if not schedulable:
            self.unhealthy += n
        if trust is TrustState.TRUSTED:
            self.trusted += n
        elif trust is TrustState.UNTRUSTED:
            self.untrusted += n
        if policy.require_attestation and trust is not TrustState.TRUSTED:
            self.noncompliant += n
        self.cordoned += n if cordoned else 0
        self.revoked += n if revoked else 0
        self.out_of_sync += n if out_of_sync else 0

    def to_json(self) -> dict[str, int]:
        return {
            "total": self.total,
            "ready": self.ready,
            "notReady": self.not_ready,
            "pending": self.pending,
            "unhealthy": self.unhealthy,
            "trusted": self.trusted,
            "untrusted": self.untrusted,
            "noncompliant": self.noncompliant,
            "cordoned": self.cordoned,
            "revoked": self.revoked,
            "outOfSync": self.out_of_sync,
        }


@dataclass(slots=True)
class FleetSummary:
    counts: Counts
    groups: list[tuple[str, str, Counts]]  # (region, site, counts), the largest first
    more_groups: int  # groups not listed (beyond MAX_GROUPS)
    attestation: dict[str, int] = field(default_factory=dict)
    require_attestation: bool = False


def group_of(device: Device, region: str) -> tuple[str, str]:
    """The device's (region, site) labels, the operator's winning over what it reported."""
    labels, reported = device.labels, device.reported_labels
    return (
        labels.get(REGION_LABEL) or reported.get(REGION_LABEL) or region,
        labels.get(SITE_LABEL) or reported.get(SITE_LABEL) or NO_SITE,
    )


def fleet_summary(
    devices: Iterable[Device],
    desired: Mapping[str, storekeys.DesiredRecord],
    policy: SecurityPolicy,
    region: str,
    *,
    max_groups: int = MAX_GROUPS,
) -> FleetSummary:
    """Counts of the whole fleet and per (region, site) group: one pass over the devices,
    counting (group, state) tuples; then the distinct ones are added up."""
    seen: Counter[tuple[tuple[str, str], DeviceState]] = Counter()
    for device in devices:
        record = desired.get(device.name)
        behind = record is not None and device.generation_acked < record.generation
        seen[(group_of(device, region), state_of(device, behind))] += 1
    total = Counts()
    groups: dict[tuple[str, str], Counts] = {}
    attestation: Counter[str] = Counter()
    for (group, state), n in seen.items():
        total.add_state(state, policy, n)
        counts = groups.get(group)
        if counts is None:
            counts = groups[group] = Counts()
        counts.add_state(state, policy, n)
        attestation[state[2].value] += n
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1].total, kv[0]))
    shown = [(r, s, c) for (r, s), c in ordered[:max_groups]]
    return FleetSummary(
        total,
        shown,
        max(0, len(ordered) - max_groups),
        {s.value: attestation.get(s.value, 0) for s in TrustState},
        policy.require_attestation,
    )


# -- the devices table ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DeviceQuery:
    """The devices page's filters and page, from its query string (:func:`parse_device_query`)."""

    text: str = ""  # a substring of the name
    phase: str = ""
    attestation: str = ""
    health: str = ""  # "healthy", "unhealthy" or ""
    selector: str = ""  # a label selector (edgectl get devices -l)
    page: int = 1
    per_page: int = DEFAULT_PER_PAGE

    def params(self, **changes: Any) -> dict[str, str]:
        """The query string of this query with ``changes`` (for links to other pages)."""
        values = {
            "q": self.text,
            "phase": self.phase,
            "attestation": self.attestation,
            "health": self.health,
            "selector": self.selector,
            "page": str(self.page),
            "per": str(self.per_page),
        }
        values.update({k: str(v) for k, v in changes.items()})
        return {k: v for k, v in values.items() if v and not (k == "page" and v == "1")}


def _whole(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name, "")
    if raw == "":
        return default
    if not raw.isdigit() or len(raw) > 9:
        raise BadQuery(f"{name}: must be a whole number from {low} to {high}, got {raw[:20]!r}")
    value = int(raw)
    if not low <= value <= high:
        raise BadQuery(f"{name}: must be from {low} to {high}, got {value}")
    return value


def _choice(params: Mapping[str, str], name: str, allowed: Sequence[str]) -> str:
    value = params.get(name, "")
    if value and value not in allowed:
        raise BadQuery(f"{name}: must be one of {', '.join(allowed)}, got {value[:40]!r}")
    return value


def page_param(params: Mapping[str, str]) -> int:
    """The ``page`` parameter of a paginated page (1-based); :class:`BadQuery` if out of range."""
    return _whole(params, "page", 1, 1, MAX_PAGE)


def parse_device_query(params: Mapping[str, str]) -> DeviceQuery:
    """The query of a devices page; raises :class:`BadQuery` naming the bad parameter."""
    for name in ("q", "selector"):
        if len(params.get(name, "")) > MAX_QUERY_CHARS:
            raise BadQuery(f"{name}: at most {MAX_QUERY_CHARS} characters")
    selector = params.get("selector", "").strip()
    if selector:
        try:
            parse_selector(selector)
        except ValueError as exc:
            raise BadQuery(f"selector: {exc}") from None
    return DeviceQuery(
        text=params.get("q", "").strip(),
        phase=_choice(params, "phase", [p.value for p in DevicePhase]),
        attestation=_choice(params, "attestation", [s.value for s in TrustState]),
        health=_choice(params, "health", ["healthy", "unhealthy"]),
        selector=selector,
        page=_whole(params, "page", 1, 1, MAX_PAGE),
        per_page=_whole(params, "per", DEFAULT_PER_PAGE, 1, MAX_PER_PAGE),
    )


def _matches(
    device: Device, query: DeviceQuery, selector: Selector | None, keys: tuple[str, ...]
) -> bool:
    if query.text and query.text not in device.name:
        return False
    if query.phase and device.phase != query.phase:
        return False
    if query.attestation and device.attestation.state != query.attestation:
        return False
    if query.health and device.health.schedulable != (query.health == "healthy"):
        return False
    if selector is None:
        return True
    # only the labels the selector asks about, the operator's winning (Device.all_labels)
    labels: dict[str, str] = {}
    for key in keys:
        value = device.labels.get(key)
        if value is None:
            value = device.reported_labels.get(key)
        if value is not None:
            labels[key] = value
    return selector.matches(labels)


@dataclass(frozen=True, slots=True)
class DevicePage:
    rows: list[Device]
    matched: int  # devices matching the filters, on every page
    page: int
    pages: int  # at least 1


def device_page(
    devices: Iterable[Device], query: DeviceQuery, *, by_name: bool = False
) -> DevicePage:
    """One page of the devices matching ``query``, by name (``by_name``: ``devices`` come
    sorted already). A page past the last is empty (the fleet may have shrunk since the link
    was made); ``pages`` says how many there are."""
    selector = parse_selector(query.selector) if query.selector else None
    keys = tuple({r.key for r in selector.requirements}) if selector is not None else ()
    filtered = query.text or query.phase or query.attestation or query.health or selector
    if filtered:
        matched = [d for d in devices if _matches(d, query, selector, keys)]
    else:
        matched = list(devices)
    if not by_name:
        matched.sort(key=lambda d: d.name)
    pages = max(1, -(-len(matched) // query.per_page))
    start = (query.page - 1) * query.per_page
    return DevicePage(matched[start : start + query.per_page], len(matched), query.page, pages)


# -- events --------------------------------------------------------------------------------------
def events_of(
    events: Iterable[Mapping[str, Any]], *, kind: str = "", name: str = "", limit: int = 100
) -> list[Mapping[str, Any]]:
    """The newest ``limit`` events (oldest first) about ``kind``/``name`` (empty: any)."""
    found = [
        ev
        for ev in events
        if (not kind or ev.get("object", {}).get("kind") == kind)
        and (not name or ev.get("object", {}).get("name") == name)
    ]
    return found[-limit:] if limit > 0 else []


def event_json(event: Mapping[str, Any]) -> dict[str, Any]:
    """An event as the live stream sends it: only its known fields, as plain values."""
    obj = event.get("object", {})
    return {
        "type": str(event.get("type", "")),
        "reason": str(event.get("reason", "")),
        "message": str(event.get("message", "")),
        "kind": str(obj.get("kind", "")),
        "name": str(obj.get("name", "")),
        "time": float(event.get("time") or 0.0),
    }


# -- placements ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DeploymentPlacements:
    """Where a deployment's replicas are, as ``edgectl get placements --for deployment/NAME``
    shows them (:mod:`hub.decide.placementview`), and, for ``replicas.total``, why the
    scheduler left devices out (its last pass's :class:`Explanation`, kept in memory)."""

    deployment: str
    shown: tuple[Placed, ...]  # the first ``limit`` by device name
    total: int  # placements in all: the devices sent it, and those that still report it
    placed: int  # of ``total``, the devices the hub sends it now (the others are leaving)
    scheduled: bool  # replicas.total: placed by the scheduler (else perDevice)
    explanation: Explanation | None = None

    @property
    def more(self) -> int:
        return self.total - len(self.shown)


def deployment_placements(
    name: str,
    *,
    dep: ModelDeployment | None,
    holding: Iterable[str],
    devices: Mapping[str, Device],
    records: Mapping[str, storekeys.DesiredRecord],
    revisions: Mapping[int, Revision],
    models: Mapping[tuple[str, str], storekeys.ModelRecord],
    explanation: Explanation | None,
    limit: int = MAX_LISTED,
) -> DeploymentPlacements:
    """Deployment ``name``'s placements (``holding``: the devices whose desired record holds
    it; any device that still reports it counts too), the first ``limit`` of them computed
    as the admin API's Placements are (:func:`placement_of`), the rest only counted."""
    sent = {n for n in holding if n in devices}
    reporting = {d.name for d in devices.values() if name in d.workloads}
    keys = sorted(sent | reporting)
    shown = tuple(
        placement_of(
            name,
            devices[n],
            dep=dep,
            record=records.get(n),
            revisions=revisions,
            models=models,
        )
        for n in keys[: max(0, limit)]
    )
    scheduled = dep is not None and dep.spec.replicas.total is not None
    return DeploymentPlacements(
        name, shown, len(keys), len(sent), scheduled, explanation if scheduled else None
    )


# -- models --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ModelVersion:
    name: str
    version: str
    sha256: str
    length: int
    pushed_at: float
    signers: tuple[str, ...]  # the key ids that signed its metadata
    used_by: tuple[str, ...]  # deployments that ask for it


def model_versions(
    models: Mapping[tuple[str, str], storekeys.ModelRecord],
    wanted: Mapping[str, tuple[str, str]],
) -> list[ModelVersion]:
    """Every pushed model version, by name and version, with its signers and users
    (``wanted``: deployment -> (model, version))."""
    from edgefleet.errors import TrustError
    from edgefleet.trust.envelopes import parse_envelope_bytes

    users: dict[tuple[str, str], list[str]] = {}
    for dep, key in sorted(wanted.items()):
        users.setdefault(key, []).append(dep)
    out = []
    for (name, version), record in sorted(models.items()):
        try:
            env = parse_envelope_bytes(record.envelope, what="signed metadata")
            signers = tuple(sorted({k for k, _ in env.signatures}))
        except (TrustError, ValueError):
            signers = ()
        out.append(
            ModelVersion(
                name,
                version,
                record.sha256,
                record.length,
                record.pushed_at,
                signers,
                tuple(users.get((name, version), ())),
            )
        )
    return out


# -- figures over time ---------------------------------------------------------------------------
MAX_SAMPLES = 300  # one per render of the page (a second apart at least)
MAX_SERIES = 24
MAX_TRACKED = 100  # deployments
NOT_PLOTTED = frozenset(
    {"revision", "stableRevision", "steps", "maxSurge", "maxUnavailable", "desiredDevices"}
)
THRESHOLD_KEYS = ("threshold", "max", "min", "limit")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def numeric_leaves(doc: Mapping[str, Any], prefix: str = "", depth: int = 0) -> dict[str, float]:
    """``path -> number`` for the numbers of ``doc`` worth plotting over time (not times,
    thresholds or identifiers), at most :data:`MAX_SERIES`."""
    out: dict[str, float] = {}
    if depth > 4:
        return out
    for raw_key, value in doc.items():
        key = str(raw_key)
        if key in NOT_PLOTTED or key in THRESHOLD_KEYS or key.endswith("At"):
            continue
        path = f"{prefix}.{key}" if prefix else key
        if _is_number(value):
            out[path] = float(value)
        elif isinstance(value, Mapping):
            out.update(numeric_leaves(value, path, depth + 1))
        if len(out) >= MAX_SERIES:
            break
    return dict(list(out.items())[:MAX_SERIES])


def thresholds_of(doc: Mapping[str, Any], prefix: str = "", depth: int = 0) -> dict[str, float]:
    """``path -> threshold``: for each number, a ``threshold``/``max``/``min``/``limit`` beside
    it in the same object (``{"errorRate": 0.02, "threshold": 0.05}``), or inside its own
    object (``{"errorRate": {"value": 0.02, "threshold": 0.05}}``: under ``errorRate.value``)."""
    out: dict[str, float] = {}
    if depth > 4:
        return out
    here = next((float(doc[k]) for k in THRESHOLD_KEYS if _is_number(doc.get(k))), None)
    for key, value in doc.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(thresholds_of(value, path, depth + 1))
        elif here is not None and _is_number(value) and str(key) not in THRESHOLD_KEYS:
            out[path] = here
    return out


class FigureHistory:
    """The figures of each deployment's status over time, in memory (the status carries
    only the figures of now): the last :data:`MAX_SAMPLES` samples of each, newest last."""

    def __init__(self) -> None:
        self._series: dict[str, dict[str, deque[tuple[float, float]]]] = {}
        self._thresholds: dict[str, dict[str, float]] = {}

    def record(self, deployment: str, status: Mapping[str, Any], now: float) -> None:
        rollout = status.get("rollout")
        doc: dict[str, Any] = {
            k: status[k]
            for k in ("updatedDevices", "readyDevices", "availableDevices")
            if k in status
        }
        if isinstance(rollout, Mapping):
            doc["rollout"] = rollout
        if deployment not in self._series and len(self._series) >= MAX_TRACKED:
            self._series.pop(next(iter(self._series)))
        series = self._series.setdefault(deployment, {})
        for path, value in numeric_leaves(doc).items():
            if path not in series and len(series) >= MAX_SERIES:
                continue
            series.setdefault(path, deque(maxlen=MAX_SAMPLES)).append((now, value))
        self._thresholds[deployment] = thresholds_of(doc)

    def of(self, deployment: str) -> tuple[dict[str, list[float]], dict[str, float]]:
        """``(path -> values, path -> threshold)`` of the series with two samples or more."""
        series = self._series.get(deployment, {})
        shown = {p: [v for _, v in s] for p, s in series.items() if len(s) >= 2}
        return shown, self._thresholds.get(deployment, {})

    def forget(self, deployment: str) -> None:
        self._series.pop(deployment, None)
        self._thresholds.pop(deployment, None)
