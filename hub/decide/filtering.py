"""The scheduler's filters and scores over :class:`hub.decide.columns.FleetColumns`: each filter
a boolean mask of the devices, with the reason shown for those it leaves out: taints and
tolerations, labels (``nodeSelector``, ``matchExpressions``, regions, zones, the accelerator's
classes), the token labels a Secret follows (:meth:`FleetFilters.trusted_filter`), capacity,
measured latency (``maxLatencyP95``); and each candidate's score (``Spread`` or ``BinPack``,
artifacts held, accelerator class order)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from edgefleet.api import (
    ModelDeployment,
    PlacementStrategy,
    SelectorOperator,
    SelectorRequirement,
    TaintEffect,
)
from edgefleet.api.quantities import format_duration
from hub.decide.columns import FleetColumns
from hub.decide.nodes import (
    ARTIFACT_BONUS,
    CLASS_BONUS,
    LATENCY_REASON,
    TRUSTED_NOTE,
    Ints,
    Mask,
    Node,
)
from hub.decide.placement import (
    REGION_LABEL,
    TAINT_NOT_READY,
    TPM_LABEL,
    ZONE_LABEL,
    tolerates,
)
from hub.decide.staleness import silent_for


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}ms"


def _short(key: str) -> str:
    return key.removeprefix("node.edgefleet.io/")


class FleetFilters(FleetColumns):
    """:class:`hub.decide.columns.FleetColumns` with the filters and scores (see the module
    doc)."""

    # -- filters ----------------------------------------------------------------------------
    def filters(
        self, dep: ModelDeployment, *, running: bool, now: float, grace_s: float
    ) -> list[tuple[str, Mask]]:
        """The hard filters of ``dep`` in order, each ``(reason, mask of devices passing)``.

        ``running``: the filters a placement that already runs must still pass (NoExecute
        taints, NotReady beyond the grace, labels, region, zone, accelerator); otherwise every
        filter but capacity."""
        out = self.taint_filters(dep, running=running, now=now, grace_s=grace_s)
        out += self.label_filters(dep, running=running)
        return out

    def taint_filters(
        self, dep: ModelDeployment, *, running: bool, now: float, grace_s: float
    ) -> list[tuple[str, Mask]]:
        """The taints ``dep`` does not tolerate (and, ``running``, NotReady beyond the
        grace): a placement that fails one of these cannot keep serving."""
        placement = dep.spec.placement
        out: list[tuple[str, Mask]] = []
        for taint, idx in sorted(self._taints.items(), key=lambda t: t[0].key):
            if tolerates(placement.tolerations, taint):
                continue
            if running and taint.effect is not TaintEffect.NO_EXECUTE:
                if taint.key != TAINT_NOT_READY:
                    continue
                mask = np.ones(self.n, dtype=np.bool_)
                stale = [
                    i
                    for i in idx
                    if silent_for(self.nodes[i].last_heartbeat, now, self.observed_since) > grace_s
                ]
                mask[stale] = False
                out.append((f"not ready for longer than {grace_s:g}s", mask))
                continue
            out.append((f"not tolerating taint {_short(taint.key)}", self._untainted(taint)))
        return out

    def label_filters(self, dep: ModelDeployment, *, running: bool) -> list[tuple[str, Mask]]:
        """Labels, region, zone, accelerator (and, not ``running``, affinity)."""
        placement = dep.spec.placement
        out: list[tuple[str, Mask]] = []
        if placement.regions:
            out.append(
                (
                    f"outside region {','.join(placement.regions)}",
                    self.any_value(REGION_LABEL, placement.regions),
                )
            )
        if placement.zones:
            out.append(
                (
                    f"outside zone {','.join(placement.zones)}",
                    self.any_value(ZONE_LABEL, placement.zones),
                )
            )
        if placement.require_tpm:
            out.append(
                ("not TPM-attested (placement.requireTpm)", self.label_mask(TPM_LABEL, "true"))
            )
        for key, value in sorted(placement.node_selector.items()):
            out.append((f"not matching nodeSelector {key}={value}", self.label_mask(key, value)))
        for req in placement.match_expressions:
            out.append((f"not matching {req.describe()}", self._requirement(req)))
        if dep.spec.resources.accelerators:
            choice, wanted = self.accelerator_choice(dep)
            out.append((f"lack accelerator {'|'.join(wanted)}", choice >= 0))
        trusted = self.trusted_filter(dep)
        if trusted is not None:
            out.append(trusted)
        if placement.topology_spread is not None:
            key = placement.topology_spread.key
            out.append((f"without label {key}", self.label_mask(key)))
        latency = self.latency_filter(dep)
        if latency is not None:
            out.append(latency)
        if running:
            return out
        for other in placement.deployment_affinity:
            out.append((f"not running {other}", self.running(other)))
        for other in placement.deployment_anti_affinity:
            out.append((f"running {other}", ~self.running(other)))
        for other in self.shunned_by.get(dep.metadata.name, ()):
            out.append((f"running {other} (its anti-affinity)", ~self.running(other)))
        return out

    def trusted_filter(self, dep: ModelDeployment) -> tuple[str, Mask] | None:
        """For a deployment mounting a Secret: the devices whose trusted labels alone (no
        label the device chose: :mod:`hub.decide.labeltrust`) pass its regions, zones and
        selectors."""
        if not dep.spec.secrets:
            return None
        if self._trusted is None:
            self._trusted = FleetFilters(
                [Node(x.name, x.labels if x.trusted_labels is None else x.trusted_labels)
                 for x in self.nodes]
            )  # fmt: skip
        view, placement = self._trusted, dep.spec.placement
        mask = np.ones(self.n, dtype=np.bool_)
        if placement.regions:
            mask &= view.any_value(REGION_LABEL, placement.regions)
        if placement.zones:
            mask &= view.any_value(ZONE_LABEL, placement.zones)
        for key, value in placement.node_selector.items():
            mask &= view.label_mask(key, value)
        for req in placement.match_expressions:
            mask &= view._requirement(req)
        return (f"matching only through labels the device chose ({TRUSTED_NOTE})", mask)

    # -- latency (placement.maxLatencyP95) -----------------------------------------------------
    def latencies(self, sha256: str) -> npt.NDArray[np.float64]:
        """Per device its self-benchmark p95 of artifact ``sha256`` (NaN: not measured)."""
        column = self._latency_cache.get(sha256)
        if column is None:
            column = np.full(self.n, np.nan, dtype=np.float64)
            for i, node in enumerate(self.nodes):
                p95 = node.latencies.get(sha256)
                if p95 is not None:
                    column[i] = p95
            self._latency_cache[sha256] = column
        return column

    def latency_filter(self, dep: ModelDeployment) -> tuple[str, Mask] | None:
        """Devices whose measured p95 of ``dep``'s model is within its bound (unmeasured
        devices pass: they are checked once they report)."""
        bound = dep.spec.placement.max_latency_p95_s
        sha = self.artifacts.get(dep.metadata.name)
        if bound is None or not sha:
            return None
        column = self.latencies(sha)
        over = column > bound  # NaN compares False: not measured passes
        worst = float(np.nanmax(column[over])) if over.any() else 0.0
        return (
            f"{LATENCY_REASON} {format_duration(bound)} (measured p95 up to {_ms(worst)})",
            ~over,
        )

    def latency_reason(self, dep: ModelDeployment, i: int) -> str:
        """Why device ``i`` is over ``dep``'s bound, with its figure."""
        bound = dep.spec.placement.max_latency_p95_s or 0.0
        p95 = float(self.latencies(self.artifacts[dep.metadata.name])[i])
        return f"measured p95 {_ms(p95)} over maxLatencyP95 {format_duration(bound)}"

    def unmeasured(self, dep: ModelDeployment) -> int:
        """How many of ``dep``'s placements are on devices that did not measure its model."""
        sha = self.artifacts.get(dep.metadata.name)
        if dep.spec.placement.max_latency_p95_s is None or not sha:
            return 0
        column = self.latencies(sha)
        return sum(1 for i in self.placed.get(dep.metadata.name, ()) if np.isnan(column[i]))

    def _requirement(self, req: SelectorRequirement) -> Mask:
        if req.operator is SelectorOperator.IN:
            return self.any_value(req.key, req.values)
        if req.operator is SelectorOperator.NOT_IN:
            return ~self.any_value(req.key, req.values)
        if req.operator is SelectorOperator.EXISTS:
            return self.label_mask(req.key)
        return ~self.label_mask(req.key)

    def scores(self, dep: ModelDeployment, idx: Ints) -> npt.NDArray[np.float64]:
        """The scores of devices ``idx``, higher is better: free room after placing (Spread)
        or room used (BinPack), plus :data:`ARTIFACT_BONUS` where the artifact already is."""
        res = dep.spec.resources
        used = (self.cpu_used[idx] + (res.cpu_millis or 0)) * self._cpu_inv[idx]
        used += (self.mem_used[idx] + (res.memory_bytes or 0)) * self._mem_inv[idx]
        used = used / 2 + self.replicas[idx] * 1e-6  # equal room: fewer replicas first
        binpack = dep.spec.placement.strategy is PlacementStrategy.BIN_PACK
        score = used if binpack else 1.0 - used
        wanted = res.accelerators
        if len(wanted) > 1:  # anyOf: earlier classes preferred
            choice, _ = self.accelerator_choice(dep)
            score += CLASS_BONUS * (1.0 - np.maximum(choice[idx], 0) / len(wanted))
        artifact = self.artifacts.get(dep.metadata.name)
        if artifact and artifact in self._holders:
            score += ARTIFACT_BONUS * self.artifact_mask(artifact)[idx]
        return np.asarray(score, dtype=np.float64)
