"""Memory-aware batching (pure): the most rows a batch may merge, from the memory available.

A batch of ``n`` rows costs a worker about ``n * row_bytes`` on top of its model. The cost of
a row is the larger of an estimate from the model's shapes (:func:`shape_row_bytes`: every
input value as JSON text in the request, as a decoded Python float and as the tensor; every
output value as the tensor and as JSON text) and what was observed: the growth of a replica's
resident memory since it became ready, divided by the most rows a batch could hold.

The budget is ``MemAvailable`` above the eviction floor, shared by the batching replicas of
the device. The effective ``maxBatchSize`` is the declared one while the budget holds it,
else the largest power of two that fits (at least 1): powers of two, so that small moves of
``MemAvailable`` do not change it back and forth. It grows back the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

_SIZES = {
    "BOOL": 1,
    "UINT8": 1,
    "INT8": 1,
    "UINT16": 2,
    "INT16": 2,
    "FP16": 2,
    "UINT32": 4,
    "INT32": 4,
    "FP32": 4,
    "UINT64": 8,
    "INT64": 8,
    "FP64": 8,
}
JSON_VALUE_BYTES = 48  # the most one value takes in a request body (serving/bounding.py)
PY_FLOAT_BYTES = 32  # a decoded float object and its list slot
JSON_OUT_BYTES = 24  # one output value written as JSON


def _values_per_row(shape: Iterable[Any]) -> int:
    dims = list(shape)[1:]  # the first is the batch
    n = 1
    for d in dims:
        n *= d if isinstance(d, int) and d > 0 else 1
    return n


def shape_row_bytes(
    inputs: Iterable[Mapping[str, Any]], outputs: Iterable[Mapping[str, Any]]
) -> int:
    """Bytes one batch row costs, estimated from the model's metadata (``inputs``/``outputs``
    as the worker reports them: name, datatype, shape)."""
    total = 0
    for t in inputs:
        size = _SIZES.get(str(t.get("datatype")), 8)
        total += _values_per_row(t.get("shape") or ()) * (JSON_VALUE_BYTES + PY_FLOAT_BYTES + size)
    for t in outputs:
        size = _SIZES.get(str(t.get("datatype")), 8)
        total += _values_per_row(t.get("shape") or ()) * (size + JSON_OUT_BYTES)
    return max(total, 1)


def row_bytes(shape_estimate: int, growth_bytes: int, declared: int) -> int:
    """The larger of the shape estimate and the observed growth per row of a full batch."""
    return max(shape_estimate, growth_bytes // max(declared, 1), 1)


def effective_batch(
    declared: int, *, available: int, reserve: int, sharing: int, per_row: int
) -> int:
    """The most rows a batch may merge now: ``declared`` when the budget holds it, else the
    largest power of two that fits, at least 1."""
    if declared <= 1:
        return 1
    budget = (available - reserve) // max(sharing, 1)
    rows = budget // max(per_row, 1) if budget > 0 else 0
    if rows >= declared:
        return declared
    if rows < 1:
        return 1
    return 1 << (rows.bit_length() - 1)
