"""Open Inference Protocol (KServe v2) tensors: decode requests, check them, encode responses.

Runs inside the worker process (it imports numpy). Every problem with a request becomes an
:class:`InferenceRequestError` whose message names the input and the reason; the worker answers
it with HTTP 400 and keeps running.

The binary tensor data extension is supported both ways: a request whose body starts with
``Inference-Header-Content-Length`` bytes of JSON followed by raw tensor bytes (inputs carry
``parameters.binary_data_size``), and binary outputs when the request asks for them with
``parameters.binary_data_output`` (all outputs) or per output ``parameters.binary_data``.

JSON bodies up to :data:`FAST_JSON_MAX` bytes are parsed with simdjson (pysimdjson) when it is
installed: the ``data`` array of a float tensor goes from the parsed document straight into a
numpy buffer, without a Python float per value (about 3x faster than ``orjson.loads`` plus a
conversion for the medium MLP's 1,024 values); every other field becomes the Python value
``orjson`` would give, and the checks below are the same. Anything simdjson does not take as
is (invalid JSON, big integers, duplicate keys, nested or mixed ``data``) is decoded by the
general path (orjson), which names what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

simdjson: Any
try:
    import simdjson
except ImportError:  # pragma: no cover - optional: the orjson path serves every request
    simdjson = None

FAST_JSON_MAX = 4 << 20
"""Bodies up to this size take the simdjson path (its parser keeps buffers the size of the
largest document it parsed, so larger, rarer bodies go to orjson)."""

# OIP datatype <-> numpy dtype <-> ONNX Runtime type string
_OIP_TO_NUMPY: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
_ORT_TO_OIP = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}
_NUMPY_TO_OIP = {np.dtype(v).str: k for k, v in _OIP_TO_NUMPY.items()}
# numpy kind of a tensor -> (what JSON data it takes, kinds numpy infers for such data)
_JSON_KINDS = {
    "b": ("booleans", "b"),
    "i": ("integers", "iu"),
    "u": ("integers", "iu"),
    "f": ("numbers", "iuf"),
}
_KIND_NAMES = {
    "b": "booleans",
    "i": "integers",
    "u": "integers",
    "f": "numbers with fractions",
    "U": "strings",
    "O": "nulls, objects or integers out of range",
}


class InferenceRequestError(Exception):
    """The request is wrong (HTTP 400); the message says what and where."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str  # OIP datatype, e.g. FP32
    shape: tuple[int, ...]  # -1 for a dimension of any size

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def spec_from_ort(node: Any) -> TensorSpec:
    """A TensorSpec from an ``onnxruntime.NodeArg``."""
    dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in node.shape)
    return TensorSpec(node.name, _ORT_TO_OIP.get(node.type, node.type), dims)


@dataclass(slots=True)
class DecodedRequest:
    """One inference request, checked against the model's signature."""

    request_id: str | None
    feeds: dict[str, np.ndarray]
    rows: int  # size of the batch dimension (1 when the model does not batch)
    outputs: tuple[str, ...]
    binary_outputs: frozenset[str]
    batch_key: tuple[Any, ...] = field(default=())


def _as_array(
    name: str, spec: TensorSpec, tensor: dict[str, Any], binary: memoryview | None
) -> np.ndarray:
    datatype = tensor.get("datatype")
    shape = tensor.get("shape")
    if not isinstance(datatype, str):
        raise InferenceRequestError(f"input {name!r}: 'datatype' must be a string")
    if datatype != spec.datatype:
        raise InferenceRequestError(
            f"input {name!r}: datatype {datatype} does not match the model's {spec.datatype}"
        )
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise InferenceRequestError(
            f"input {name!r}: 'shape' must be a list of non-negative integers"
        )
    if len(shape) != len(spec.shape) or any(
        want not in (-1, got) for want, got in zip(spec.shape, shape, strict=True)
    ):
        raise InferenceRequestError(
            f"input {name!r}: shape {shape} does not match the model's {list(spec.shape)} "
            "(-1 is any size)"
        )
    dtype = _OIP_TO_NUMPY.get(datatype)
    if dtype is None:
        raise InferenceRequestError(f"input {name!r}: datatype {datatype} is not supported")
    count = 1
    for d in shape:
        count *= d
    if binary is not None:
        expected = count * np.dtype(dtype).itemsize
        if len(binary) != expected:
            raise InferenceRequestError(
                f"input {name!r}: binary_data_size is {len(binary)} bytes, shape {shape} of "
                f"{datatype} needs {expected}"
            )
        return np.frombuffer(binary, dtype=dtype).reshape(shape)
    data = tensor.get("data")
    if data is None:
        raise InferenceRequestError(f"input {name!r}: 'data' is missing")
    if type(data) is _Numbers:  # parsed by simdjson straight into numbers (float64)
        flat = _cast_numbers(data.values, dtype, count)
        if flat is not None:
            return flat.reshape(shape)
        data = data.values.tolist()  # the general path says what is wrong
    fast = _flat_floats(data, dtype, count)
    if fast is not None:
        return fast.reshape(shape)
    try:
        # JSON values must be of the tensor's kind: numpy alone would truncate 2.5 to an
        # integer, read "1.5" or null as a float, or 2 as a bool, and answer wrong silently.
        inferred = np.asarray(data)
        found = inferred.dtype.kind
        expected, kinds = _JSON_KINDS[np.dtype(dtype).kind]
        if found not in kinds and inferred.size > 0:
            raise InferenceRequestError(
                f"input {name!r}: 'data' is not a tensor of {datatype}: it takes {expected}, "
                f"got {_KIND_NAMES.get(found, 'other values')}"
            )
        target = np.dtype(dtype)
        if inferred.dtype == target:
            arr = inferred
        else:
            if target.kind in "iu" and inferred.size > 0:
                info = np.iinfo(target)
                if inferred.min() < info.min or inferred.max() > info.max:
                    raise OverflowError(f"values out of range for {datatype}")
            # One pass over the JSON list (above) plus a cheap cast: half the cost of
            # converting the list twice.
            if target.kind == "f":
                with np.errstate(over="ignore"):  # checked just below
                    arr = inferred.astype(target)
            else:
                arr = inferred.astype(target)
            if target.kind == "f" and not np.isfinite(arr).all():
                # JSON has no inf or nan: a value that became one does not fit the datatype
                raise OverflowError(
                    f"values out of range for {datatype} "
                    f"(its largest is {float(np.finfo(target).max):.6g})"
                )
    except (ValueError, TypeError, OverflowError) as exc:
        raise InferenceRequestError(
            f"input {name!r}: 'data' is not a tensor of {datatype}: {exc}"
        ) from None
    if arr.size != count:
        raise InferenceRequestError(
            f"input {name!r}: 'data' has {arr.size} elements, shape {shape} needs {count}"
        )
    return arr.reshape(shape)


_FLOAT_KINDS = frozenset({np.float16, np.float32, np.float64})


def _flat_floats(data: Any, dtype: Any, count: int) -> np.ndarray | None:
    """The common case, fast: a flat list of ``count`` JSON numbers for a float tensor,
    converted in one pass without numpy's type discovery. None when it is anything else (the
    general path then decodes it or says precisely what is wrong)."""
    if dtype not in _FLOAT_KINDS or type(data) is not list or len(data) != count or not count:
        return None
    if type(data[0]) is bool:
        return None
    try:
        sum(data)  # TypeError for strings, nulls and nested lists: numpy would take them
    except TypeError:
        return None
    try:
        with np.errstate(over="ignore"):  # checked just below
            arr = np.fromiter(data, dtype=dtype, count=count)
    except (OverflowError, ValueError):
        return None
    if not np.isfinite(arr).all():
        return None  # the general path names the value out of range
    return arr


class _Numbers:
    """A flat JSON array of numbers for a float tensor, already in a float64 buffer."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values


def _cast_numbers(values: np.ndarray, dtype: Any, count: int) -> np.ndarray | None:
    """``values`` as ``dtype`` (always a copy: never a view of the parser's memory); None when
    the count is wrong or a value does not fit (the general path then says so)."""
    if values.size != count or dtype not in _FLOAT_KINDS or not count:
        return None
    with np.errstate(over="ignore"):  # checked just below
        arr = values.astype(dtype)
    if not np.isfinite(arr).all():
        return None
    return arr


_FLOAT_DATATYPES = frozenset({"FP16", "FP32", "FP64"})
_parser: Any = None


def _simd_value(value: Any) -> Any:
    """A simdjson value as orjson would give it (dicts, lists, scalars)."""
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def _simd_tensor(tensor: Any) -> Any:
    """One element of ``inputs``: a float tensor's flat ``data`` as :class:`_Numbers`."""
    if not isinstance(tensor, simdjson.Object):
        return _simd_value(tensor)
    keys = list(tensor.keys())
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate keys")  # orjson keeps the last one: let it decide
    out: dict[str, Any] = {k: tensor[k] for k in keys}
    data: Any = out.get("data")
    numbers = isinstance(data, simdjson.Array) and out.get("datatype") in _FLOAT_DATATYPES
    for k, v in out.items():
        if k != "data" or not numbers:
            out[k] = _simd_value(v)
    if numbers:
        values = np.frombuffer(data.as_buffer(of_type="d"), dtype=np.float64)
        if values.size != len(data):
            raise ValueError("nested data")  # the general path checks the nesting
        out["data"] = _Numbers(values)
    return out


def _simd_loads(body: bytes | memoryview) -> Any:
    """The request document by simdjson (see the module doc), or None when the general path
    should decode it. Nothing of the parser's memory outlives this call."""
    global _parser
    if _parser is None:
        _parser = simdjson.Parser()
    try:
        doc = _parser.parse(body)
    except RuntimeError:  # e.g. a big integer; or a parser still in use: start a new one
        _parser = simdjson.Parser()
        return None
    except Exception:
        return None
    try:
        if not isinstance(doc, simdjson.Object):
            return _simd_value(doc)
        keys = list(doc.keys())
        if len(set(keys)) != len(keys):
            return None
        out = {}
        for k in keys:
            v = doc[k]
            if k == "inputs" and isinstance(v, simdjson.Array):
                out[k] = [_simd_tensor(t) for t in v]
            else:
                out[k] = _simd_value(v)
        return out
    except Exception:  # bools, nulls or strings in data, duplicate keys, nesting
        return None
    finally:
        del doc


@dataclass(frozen=True, slots=True)
class _BinaryPlan:
    """What a binary request's JSON header decoded to, all its inputs binary: where each
    input's bytes are and what they are."""

    # each input: name, offset and size in the binary part, dtype, shape
    inputs: tuple[tuple[str, int, int, Any, tuple[int, ...]], ...]
    request_id: str | None
    rows: int
    outputs: tuple[str, ...]
    binary_outputs: frozenset[str]
    batch_key: tuple[Any, ...]

    def decode(self, binary: memoryview) -> DecodedRequest:
        feeds = {
            name: np.frombuffer(binary[offset : offset + size], dtype=dtype).reshape(shape)
            for name, offset, size, dtype, shape in self.inputs
        }
        return DecodedRequest(
            self.request_id, feeds, self.rows, self.outputs, self.binary_outputs, self.batch_key
        )


class BinaryPlans:
    """Decoded binary-request headers, for one model: a client sends the same JSON header with
    every request (same shapes, same parameters), so the header is checked once and later
    requests with the same header bytes and binary length only wrap their bytes in arrays.
    Bounded: the newest :attr:`capacity` headers of at most :attr:`max_header` bytes."""

    capacity = 64
    max_header = 4096

    def __init__(self) -> None:
        self._plans: dict[tuple[bytes, int], _BinaryPlan] = {}

    def get(self, key: tuple[bytes, int]) -> _BinaryPlan | None:
        return self._plans.get(key)

    def put(self, key: tuple[bytes, int], plan: _BinaryPlan) -> None:
        if len(self._plans) >= self.capacity:
            del self._plans[next(iter(self._plans))]  # the oldest
        self._plans[key] = plan


def decode_request(
    body: bytes | memoryview,
    header_length: int | None,
    inputs: dict[str, TensorSpec],
    outputs: tuple[str, ...],
    *,
    batchable: bool,
    plans: BinaryPlans | None = None,
) -> DecodedRequest:
    """Parse and check a v2 infer request body against the model's inputs and outputs.
    ``plans``: the model's cache of binary-request headers (one per model, never shared)."""
    plan_key = None
    if header_length is not None:
        if header_length > len(body):
            raise InferenceRequestError(
                "Inference-Header-Content-Length is larger than the request body"
            )
        json_part: bytes | memoryview = memoryview(body)[:header_length]
        binary: memoryview = memoryview(body)[header_length:]
        binary_part: memoryview | None = binary
        if plans is not None and header_length <= plans.max_header:
            plan_key = (bytes(json_part), len(binary))
            plan = plans.get(plan_key)
            if plan is not None:
                return plan.decode(binary)
    else:
        json_part, binary_part = body, None
    doc = None
    if binary_part is None and simdjson is not None and len(body) <= FAST_JSON_MAX:
        doc = _simd_loads(body)
    if doc is None:
        try:
            doc = orjson.loads(json_part)
        except orjson.JSONDecodeError as exc:
            raise InferenceRequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InferenceRequestError("request body must be a JSON object")
    tensors = doc.get("inputs")
    if not isinstance(tensors, list) or not tensors:
        raise InferenceRequestError("'inputs' must be a non-empty list")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise InferenceRequestError("'parameters' must be an object")
    feeds: dict[str, np.ndarray] = {}
    offset = 0
    placed: list[tuple[str, int, int, Any, tuple[int, ...]]] = []  # binary inputs
    for i, tensor in enumerate(tensors):
        if not isinstance(tensor, dict):
            raise InferenceRequestError(f"inputs[{i}] must be an object")
        name = tensor.get("name")
        if not isinstance(name, str):
            raise InferenceRequestError(f"inputs[{i}]: 'name' must be a string")
        spec = inputs.get(name)
        if spec is None:
            raise InferenceRequestError(
                f"input {name!r} is not an input of this model (inputs: {', '.join(inputs)})"
            )
        if name in feeds:
            raise InferenceRequestError(f"input {name!r} is given twice")
        tparams = tensor.get("parameters") or {}
        size = tparams.get("binary_data_size") if isinstance(tparams, dict) else None
        chunk = None
        if size is not None:
            if binary_part is None:
                raise InferenceRequestError(
                    f"input {name!r} has binary_data_size but the request has no "
                    "Inference-Header-Content-Length"
                )
            if not isinstance(size, int) or size < 0 or offset + size > len(binary_part):
                raise InferenceRequestError(f"input {name!r}: bad binary_data_size {size!r}")
            chunk = binary_part[offset : offset + size]
        feeds[name] = arr = _as_array(name, spec, tensor, chunk)
        if chunk is not None:
            placed.append((name, offset, len(chunk), arr.dtype, arr.shape))
            offset += len(chunk)
    missing = [n for n in inputs if n not in feeds]
    if missing:
        raise InferenceRequestError(f"missing input(s): {', '.join(missing)}")
    wanted, binary_outputs = _requested_outputs(doc, params, outputs)
    rows = 1
    if batchable:
        firsts = {a.shape[0] for a in feeds.values()}
        if len(firsts) != 1:
            raise InferenceRequestError(
                "all inputs must have the same batch size (first dimension)"
            )
        rows = firsts.pop()
    request_id = doc.get("id")
    key = (
        tuple((n, a.dtype.str, a.shape[1:]) for n, a in feeds.items()),
        wanted,
    )
    rid = request_id if isinstance(request_id, str) else None
    if plan_key is not None and plans is not None and len(placed) == len(feeds):
        plans.put(plan_key, _BinaryPlan(tuple(placed), rid, rows, wanted, binary_outputs, key))
    return DecodedRequest(rid, feeds, rows, wanted, binary_outputs, key)


def _requested_outputs(
    doc: dict[str, Any], params: dict[str, Any], outputs: tuple[str, ...]
) -> tuple[tuple[str, ...], frozenset[str]]:
    all_binary = bool(params.get("binary_data_output", False))
    requested = doc.get("outputs")
    if requested is None:
        return outputs, frozenset(outputs) if all_binary else frozenset()
    if not isinstance(requested, list):
        raise InferenceRequestError("'outputs' must be a list")
    names: list[str] = []
    binary: set[str] = set()
    for i, out in enumerate(requested):
        name = out.get("name") if isinstance(out, dict) else None
        if not isinstance(name, str) or name not in outputs:
            raise InferenceRequestError(
                f"outputs[{i}]: {name!r} is not an output of this model "
                f"(outputs: {', '.join(outputs)})"
            )
        names.append(name)
        oparams = out.get("parameters") or {}
        if all_binary or (isinstance(oparams, dict) and oparams.get("binary_data")):
            binary.add(name)
    return tuple(names), frozenset(binary)


def encode_response(
    model_name: str,
    model_version: str,
    request: DecodedRequest,
    results: list[np.ndarray],
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header length when binary outputs follow it."""
    parts, header_length = encode_response_parts(model_name, model_version, request, results)
    return b"".join(parts), header_length  # one part: that same object, no copy


def encode_response_parts(
    model_name: str,
    model_version: str,
    request: DecodedRequest,
    results: list[np.ndarray],
) -> tuple[list[bytes | memoryview], int | None]:
    """The response body as parts to write one after the other (the JSON header, then each
    binary output as a view of its array's own memory: no copy when the array is contiguous,
    as a slice of a batch's output rows is), and the JSON header length when binary outputs
    follow it. The views keep their arrays alive; nothing writes to an output array after
    ONNX Runtime returns it."""
    outs: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for name, arr in zip(request.outputs, results, strict=True):
        datatype = _NUMPY_TO_OIP.get(arr.dtype.str, "BYTES")
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if name in request.binary_outputs:
            blob = _raw_bytes(arr)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = arr.ravel()
        outs.append(entry)
    doc: dict[str, Any] = {
        "model_name": model_name,
        "model_version": model_version,
        "outputs": outs,
    }
    if request.request_id is not None:
        doc["id"] = request.request_id
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return [head], None
    return [head, *blobs], len(head)


def _raw_bytes(arr: np.ndarray) -> bytes | memoryview:
    """``arr``'s bytes in C order: a view of its memory when it is C-contiguous (and not an
    object array), else a copy."""
    if arr.flags.c_contiguous and arr.dtype.kind in "biufc" and arr.ndim > 0 and arr.size:
        return arr.data.cast("B")
    return np.ascontiguousarray(arr).tobytes()


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})
