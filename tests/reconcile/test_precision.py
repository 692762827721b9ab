"""Choosing a precision variant (pure) as a table, and the planner's switch between variants.

Deployments are real ModelDeployment documents; the power state (local time, battery) and the
artifact's variants are given by hand. No clock, no processes.
"""

from __future__ import annotations

from typing import Any

import pytest

from edged.reconcile.model import (
    ObservedWorkload,
    Phase,
    PrecisionChoice,
    ReplicaObservation,
    StartReplica,
    StopReplica,
)
from edged.reconcile.planning import plan, replica_id
from edged.reconcile.precision import (
    BATTERY_RECHECK_S,
    PowerState,
    choose_precision,
    seconds_to_next_edge,
)
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import API_VERSION, ModelDeployment, parse_manifest
from edgefleet.artifacts.variants import precision_of_extra, variant_file_name, variants_of

NAME = WorkloadName("mlp")
FP32, FP16, INT8 = "a" * 64, "b" * 64, "c" * 64
ALL = {"fp32": FP32, "fp16": FP16, "int8": INT8}
ONLY_FP32 = {"fp32": FP32}


def hm(h: int, m: int = 0) -> float:
    return h * 3600.0 + m * 60.0


def deployment(**spec: Any) -> ModelDeployment:
    return parse_manifest(
        {
            "apiVersion": API_VERSION,
            "kind": "ModelDeployment",
            "metadata": {"name": NAME},
            "spec": {"model": {"name": "mlp", "version": "1.0"}, **spec},
        }
    )


NIGHT = {"schedule": [{"from": "22:00", "to": "06:00", "precision": "fp16"}]}
NIGHT_AND_BATTERY = {**NIGHT, "lowBattery": {"below": "30%", "precision": "int8"}}


@pytest.mark.parametrize(
    ("spec", "variants", "power", "precision", "reason", "missing"),
    [
        # nothing asked: the model file
        ({"runtime": {"precision": "fp32"}}, ALL, PowerState(hm(12)), "fp32", "Requested", False),
        ({"runtime": {"precision": "int8"}}, ALL, PowerState(hm(12)), "int8", "Requested", False),
        # a window, outside and inside; it wraps past midnight; "to" is exclusive
        ({"power": NIGHT}, ALL, PowerState(hm(12)), "fp32", "Default", False),
        ({"power": NIGHT}, ALL, PowerState(hm(23)), "fp16", "PowerWindow", False),
        ({"power": NIGHT}, ALL, PowerState(hm(5, 59)), "fp16", "PowerWindow", False),
        ({"power": NIGHT}, ALL, PowerState(hm(6)), "fp32", "Default", False),
        ({"power": NIGHT}, ALL, PowerState(hm(22)), "fp16", "PowerWindow", False),
        # a window wins over runtime.precision
        (
            {"power": NIGHT, "runtime": {"precision": "int8"}},
            ALL,
            PowerState(hm(1)),
            "fp16",
            "PowerWindow",
            False,
        ),
        # a low battery wins over a window; on mains, or no battery, it does not apply
        (
            {"power": NIGHT_AND_BATTERY},
            ALL,
            PowerState(hm(1), True, 20),
            "int8",
            "LowBattery",
            False,
        ),
        (
            {"power": NIGHT_AND_BATTERY},
            ALL,
            PowerState(hm(1), False, 20),
            "fp16",
            "PowerWindow",
            False,
        ),
        ({"power": NIGHT_AND_BATTERY}, ALL, PowerState(hm(12), True, 30), "fp32", "Default", False),
        (
            {"power": NIGHT_AND_BATTERY},
            ALL,
            PowerState(hm(12), True, None),
            "fp32",
            "Default",
            False,
        ),
        # a device without the variant keeps what it would serve without the rule, and says so
        ({"power": NIGHT}, ONLY_FP32, PowerState(hm(23)), "fp32", "Default", True),
        (
            {"runtime": {"precision": "int8"}},
            {"fp32": FP32, "fp16": FP16},
            PowerState(hm(12)),
            "fp32",
            "Default",
            True,
        ),
        (
            {"power": NIGHT, "runtime": {"precision": "int8"}},
            {"fp32": FP32, "int8": INT8},
            PowerState(hm(23)),
            "int8",
            "Requested",
            True,
        ),
    ],
)
def test_choose_precision(
    spec: dict[str, Any],
    variants: dict[str, str],
    power: PowerState,
    precision: str,
    reason: str,
    missing: bool,
) -> None:
    choice = choose_precision(deployment(**spec).spec, variants, power)
    assert (choice.precision, choice.sha256, choice.reason) == (
        precision,
        variants[precision],
        reason,
    )
    conds = [(c.type, c.status.value, c.reason) for c in choice.conditions]
    assert conds == ([("PrecisionAvailable", "False", "VariantMissing")] if missing else [])
    if missing:
        assert f"serving {precision}" in choice.conditions[0].message


def test_missing_variant_message_names_what_is_missing_and_what_there_is() -> None:
    choice = choose_precision(deployment(power=NIGHT).spec, ONLY_FP32, PowerState(hm(23)))
    (cond,) = choice.conditions
    assert "no variant for fp16 (power window 22:00-06:00)" in cond.message
    assert "it has fp32" in cond.message


@pytest.mark.parametrize(
    ("now", "expected"),
    [(hm(12), hm(10)), (hm(22), hm(8)), (hm(23), hm(7)), (hm(5, 59), 60.0), (hm(6), hm(16))],
)
def test_recheck_at_the_next_window_edge(now: float, expected: float) -> None:
    spec = deployment(power=NIGHT).spec
    assert seconds_to_next_edge(spec.power.schedule if spec.power else (), now) == expected
    assert choose_precision(spec, ALL, PowerState(now)).recheck_after == expected


def test_a_battery_rule_rechecks_the_battery() -> None:
    spec = deployment(power={"lowBattery": {"below": "30%", "precision": "int8"}}).spec
    assert choose_precision(spec, ALL, PowerState(hm(12))).recheck_after == BATTERY_RECHECK_S
    assert choose_precision(deployment().spec, ALL, PowerState(hm(12))).recheck_after is None


def test_variants_are_extras_named_by_precision() -> None:
    assert variant_file_name("mlp.onnx", "fp16") == "mlp.fp16.onnx"
    assert precision_of_extra("mlp.int8.onnx") == "int8"
    assert precision_of_extra("validation.npz") is None
    assert precision_of_extra("mlp.fp32.onnx") is None  # the model file is fp32
    extras = {"validation.npz": "d" * 64, "mlp.fp16.onnx": FP16, "mlp.int8.onnx": INT8}
    assert variants_of(FP32, extras) == ALL


# -- the planner: a change of precision is a zero-downtime switch -----------------------------


def desired() -> DesiredWorkload:
    extras = {"mlp.fp16.onnx": FP16}
    return DesiredWorkload(deployment(power=NIGHT, replicas={"perDevice": 1}), FP32, "m", extras)


def chosen(precision: str) -> PrecisionChoice:
    sha = {"fp32": FP32, "fp16": FP16}[precision]
    return PrecisionChoice(precision, sha, "PowerWindow", "power window", (), 60.0)


def ready(revision: str, slot: int = 0) -> ReplicaObservation:
    return ReplicaObservation(
        replica_id(NAME, revision, slot), revision, slot, Phase.READY, 100, 1.0, ready_since=2.0
    )


def test_the_model_files_revision_is_the_workloads_own() -> None:
    d = desired()
    assert d.revision_with(None, FP32) == d.revision == d.revision_with(None)
    assert d.revision_with(None, FP16) != d.revision


def test_a_window_opening_starts_the_variant_before_the_old_revision_stops() -> None:
    d = desired()
    fp32_rev, fp16_rev = d.revision, d.revision_with(None, FP16)
    p = plan(NAME, d, ObservedWorkload(replicas=(ready(fp32_rev),), precision=chosen("fp16")), 10.0)
    assert p.actions == (StartReplica(NAME, replica_id(NAME, fp16_rev, 0), fp16_rev, 0, (), FP16),)
    assert p.status is not None and p.status.precision == "fp16"
    assert p.requeue_after == 60.0
    # the new one ready: the old one drains
    both = (ready(fp32_rev), ready(fp16_rev))
    p = plan(NAME, d, ObservedWorkload(replicas=both, precision=chosen("fp16")), 11.0)
    assert p.actions == (StopReplica(NAME, replica_id(NAME, fp32_rev, 0), "Superseded"),)
    # and back when the window closes
    p = plan(NAME, d, ObservedWorkload(replicas=(ready(fp16_rev),), precision=chosen("fp32")), 12.0)
    assert p.actions == (StartReplica(NAME, replica_id(NAME, fp32_rev, 0), fp32_rev, 0, (), FP32),)


def test_missing_variant_condition_reaches_the_status() -> None:
    d = desired()
    choice = choose_precision(
        deployment(runtime={"precision": "int8"}).spec, variants_of(FP32, d.extras), PowerState(0)
    )
    p = plan(NAME, d, ObservedWorkload(replicas=(ready(d.revision),), precision=choice), 10.0)
    assert p.actions == ()
    assert p.status is not None
    assert ("PrecisionAvailable", "VariantMissing") in {
        (c.type, c.reason) for c in p.status.conditions
    }
