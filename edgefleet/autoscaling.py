"""The old name of :mod:`edgefleet.autoscaler`, kept only while ``hub/`` imports it (the hub
is being moved into its wings at the same time); import :mod:`edgefleet.autoscaler` and delete
this module once nothing imports it."""

from __future__ import annotations

from edgefleet.autoscaler import (
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
