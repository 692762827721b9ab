"""Open Inference Protocol (v2) requests from the client's side: the JSON body of an inference
request, built from arrays or nested lists, its path, and one call over a device's inference
socket. The one builder of request bodies for the quickstart, the tests and the benchmarks.

numpy is never imported here: an array is read through its ``shape``, ``dtype`` and ``ravel``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import orjson

from edgefleet.devicestatus import send_request

DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}
"""numpy dtype name -> OIP datatype."""

DEFAULT_DATATYPE = "FP32"
"""The datatype of nested lists when none is given."""


def input_tensor(name: str, value: object, *, datatype: str | None = None) -> dict[str, Any]:
    """One input of a request: ``name``, ``datatype``, ``shape`` and ``data`` (flat, row-major).

    ``value`` is an array (numpy or alike: its datatype from its dtype) or nested lists of
    numbers (FP32 unless ``datatype`` says otherwise; ValueError when they are ragged)."""
    if hasattr(value, "shape") and hasattr(value, "ravel"):
        array: Any = value
        shape = [int(n) for n in array.shape]
        data = array.ravel().tolist()
        if datatype is None:
            dtype = str(array.dtype)
            datatype = DATATYPES.get(dtype)
            if datatype is None:
                raise ValueError(f"{name}: no Open Inference Protocol datatype for dtype {dtype}")
    else:
        shape, data = _flattened(value, name)
    return {"name": name, "datatype": datatype or DEFAULT_DATATYPE, "shape": shape, "data": data}


def _flattened(value: object, name: str) -> tuple[list[int], list[Any]]:
    if not isinstance(value, list | tuple):
        return [], [value]
    if not value:
        return [0], []
    parts = [_flattened(item, name) for item in value]
    inner = parts[0][0]
    if any(shape != inner for shape, _ in parts):
        raise ValueError(f"{name}: nested lists of different lengths (a tensor is rectangular)")
    return [len(value), *inner], [x for _, data in parts for x in data]


def infer_request_body(inputs: Mapping[str, object], *, datatype: str | None = None) -> bytes:
    """The JSON body of ``POST /v2/models/M/infer`` with these inputs (name -> array or nested
    lists), e.g. ``infer_request_body({"input": x})``."""
    tensors = [input_tensor(name, value, datatype=datatype) for name, value in inputs.items()]
    return orjson.dumps({"inputs": tensors})


def infer_path(model: str, version: str | None = None) -> str:
    """``/v2/models/MODEL[/versions/VERSION]/infer``."""
    return f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"


def infer(
    sock_path: str | os.PathLike[str],
    model: str,
    inputs: Mapping[str, object],
    *,
    version: str | None = None,
    timeout: float = 10.0,
) -> tuple[int, Any]:
    """POST an inference request over the inference socket; the status and the decoded reply."""
    status, body, _ = send_request(
        sock_path,
        "POST",
        infer_path(model, version),
        infer_request_body(inputs),
        headers={"Content-Type": "application/json"},
        timeout=timeout,
    )
    return status, orjson.loads(body)
