"""The autoscaler of one workload on this device: :mod:`edgefleet.autoscaling` (pure; the hub's
fleet autoscaler runs the same code, so both have the same semantics and windows)."""

from __future__ import annotations

from edgefleet.autoscaling import (
    Bounds,
    Decision,
    LoadSample,
    ScalerState,
    autoscale,
    initial_state,
    recommend,
)

__all__ = [
    "Bounds",
    "Decision",
    "LoadSample",
    "ScalerState",
    "autoscale",
    "initial_state",
    "recommend",
]
