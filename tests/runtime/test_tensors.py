"""The Open Inference Protocol tensor codec: JSON and the binary tensor data extension.

Model signatures are hand-written TensorSpecs; no onnxruntime session is involved.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from edged.runtime import tensors
from edged.runtime.tensors import (
    BinaryPlans,
    DecodedRequest,
    InferenceRequestError,
    TensorSpec,
    decode_request,
    encode_response,
    encode_response_parts,
)

INPUTS = {"input": TensorSpec("input", "FP32", (-1, 4))}
TWO_INPUTS = {
    "input": TensorSpec("input", "FP32", (-1, 4)),
    "mask": TensorSpec("mask", "BOOL", (-1, 4)),
}
OUTPUTS = ("logits", "probs")


def tensor(name: str, shape: list[int], data: Any, datatype: str = "FP32") -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def binary_tensor(name: str, arr: np.ndarray, datatype: str = "FP32") -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(arr.shape),
        "parameters": {"binary_data_size": arr.nbytes},
    }


def decode(
    doc: Any,
    inputs: dict[str, TensorSpec] = INPUTS,
    *,
    blobs: tuple[bytes, ...] = (),
    batchable: bool = True,
) -> DecodedRequest:
    """Decode ``doc`` (JSON-encoded here) followed by ``blobs`` in the binary extension."""
    head = orjson.dumps(doc)
    header_length = len(head) if blobs else None
    return decode_request(
        head + b"".join(blobs), header_length, inputs, OUTPUTS, batchable=batchable
    )


def read_response(body: bytes, header_length: int | None) -> tuple[dict[str, Any], bytes]:
    if header_length is None:
        return orjson.loads(body), b""
    return orjson.loads(body[:header_length]), body[header_length:]


def results(rows: int = 2) -> list[np.ndarray]:
    logits = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) - 2.5
    return [logits, np.full((rows, 3), 1 / 3, dtype=np.float32)]


X = np.arange(8, dtype=np.float32).reshape(2, 4) / 4


@pytest.fixture(params=["simdjson", "orjson"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Decode JSON bodies with simdjson's fast path, or with orjson alone (as without
    pysimdjson installed): every answer and every error must be the same."""
    if request.param == "orjson":
        monkeypatch.setattr(tensors, "simdjson", None)
    elif tensors.simdjson is None:
        pytest.skip("pysimdjson is not installed")
    return str(request.param)


# -- decoding ----------------------------------------------------------------------------------


def test_json_request_with_flat_data() -> None:
    req = decode({"id": "r-1", "inputs": [tensor("input", [2, 4], X.ravel().tolist())]})
    assert req.request_id == "r-1"
    assert req.feeds["input"].dtype == np.float32
    np.testing.assert_array_equal(req.feeds["input"], X)
    assert (req.rows, req.outputs, req.binary_outputs) == (2, OUTPUTS, frozenset())


def test_json_request_with_nested_data() -> None:
    req = decode({"inputs": [tensor("input", [2, 4], X.tolist())]})
    np.testing.assert_array_equal(req.feeds["input"], X)
    assert req.request_id is None


def test_not_batchable_counts_one_row() -> None:
    req = decode({"inputs": [tensor("input", [2, 4], X.tolist())]}, batchable=False)
    assert req.rows == 1


def test_binary_request() -> None:
    mask = np.array([[True, False, True, True]] * 2)
    doc = {"inputs": [binary_tensor("input", X), binary_tensor("mask", mask, "BOOL")]}
    req = decode(doc, TWO_INPUTS, blobs=(X.tobytes(), mask.tobytes()))
    np.testing.assert_array_equal(req.feeds["input"], X)
    np.testing.assert_array_equal(req.feeds["mask"], mask)
    assert req.feeds["mask"].dtype == np.bool_


def test_binary_and_json_inputs_mix() -> None:
    mask = np.ones((2, 4), dtype=np.bool_)
    doc = {
        "inputs": [
            tensor("mask", [2, 4], mask.tolist(), "BOOL"),
            binary_tensor("input", X),
        ]
    }
    req = decode(doc, TWO_INPUTS, blobs=(X.tobytes(),))
    np.testing.assert_array_equal(req.feeds["input"], X)
    np.testing.assert_array_equal(req.feeds["mask"], mask)


def test_requests_that_batch_together_share_a_key() -> None:
    one = decode({"inputs": [tensor("input", [1, 4], [0, 1, 2, 3])]})
    two = decode({"id": "b", "inputs": [tensor("input", [2, 4], X.tolist())]})
    only_logits = decode(
        {"inputs": [tensor("input", [1, 4], [0, 1, 2, 3])], "outputs": [{"name": "logits"}]}
    )
    assert one.batch_key == two.batch_key
    assert one.batch_key != only_logits.batch_key


# -- errors ------------------------------------------------------------------------------------

GOOD = tensor("input", [2, 4], X.tolist())

ERRORS: dict[str, tuple[Any, str]] = {
    "not an object": ([GOOD], "request body must be a JSON object"),
    "no inputs": ({"inputs": []}, "'inputs' must be a non-empty list"),
    "input not an object": ({"inputs": ["input"]}, "inputs[0] must be an object"),
    "input without a name": ({"inputs": [{"shape": [1, 4]}]}, "inputs[0]: 'name' must be a string"),
    "wrong datatype": (
        {"inputs": [{**GOOD, "datatype": "INT32"}]},
        "input 'input': datatype INT32 does not match the model's FP32",
    ),
    "wrong rank": (
        {"inputs": [tensor("input", [8], X.ravel().tolist())]},
        "input 'input': shape [8] does not match the model's [-1, 4]",
    ),
    "wrong fixed dimension": (
        {"inputs": [tensor("input", [2, 5], [0] * 10)]},
        "input 'input': shape [2, 5] does not match",
    ),
    "negative dimension": (
        {"inputs": [tensor("input", [-2, 4], [0] * 8)]},
        "input 'input': 'shape' must be a list of non-negative integers",
    ),
    "too few elements": (
        {"inputs": [tensor("input", [2, 4], [0] * 7)]},
        "input 'input': 'data' has 7 elements, shape [2, 4] needs 8",
    ),
    "ragged nested data": (
        {"inputs": [tensor("input", [2, 4], [[0, 1, 2, 3], [4, 5, 6]])]},
        "input 'input': 'data' is not a tensor of FP32",
    ),
    "strings for FP32": (
        {"inputs": [tensor("input", [1, 4], ["0", "1", "2", "3"])]},
        "input 'input': 'data' is not a tensor of FP32: it takes numbers, got strings",
    ),
    "null for FP32": (
        {"inputs": [tensor("input", [1, 4], [0, 1, None, 3])]},
        "input 'input': 'data' is not a tensor of FP32: it takes numbers, got nulls",
    ),
    "fractions for INT64": (
        {"inputs": [tensor("ids", [1, 2], [1, 2.5], "INT64")]},
        "input 'ids': 'data' is not a tensor of INT64: it takes integers, got numbers with "
        "fractions",
    ),
    "out of range for UINT8": (
        {"inputs": [tensor("pixels", [1, 2], [1, 300], "UINT8")]},
        "input 'pixels': 'data' is not a tensor of UINT8",
    ),
    "out of range for FP32": (
        {"inputs": [tensor("input", [1, 4], [0, 1e39, 2, 3])]},
        "input 'input': 'data' is not a tensor of FP32: values out of range for FP32 "
        "(its largest is 3.40282e+38)",
    ),
    "out of range for FP16": (
        {"inputs": [tensor("half", [1, 2], [1.0, -70000.0], "FP16")]},
        "input 'half': 'data' is not a tensor of FP16: values out of range for FP16",
    ),
    "numbers for BOOL": (
        {"inputs": [tensor("flags", [1, 2], [0, 2], "BOOL")]},
        "input 'flags': 'data' is not a tensor of BOOL: it takes booleans, got integers",
    ),
    "no data": (
        {"inputs": [{k: v for k, v in GOOD.items() if k != "data"}]},
        "input 'input': 'data' is missing",
    ),
    "unknown input": (
        {"inputs": [GOOD, {**GOOD, "name": "nope"}]},
        "input 'nope' is not an input of this model (inputs: input)",
    ),
    "duplicate input": ({"inputs": [GOOD, GOOD]}, "input 'input' is given twice"),
    "unknown output": (
        {"inputs": [GOOD], "outputs": [{"name": "logits"}, {"name": "nope"}]},
        "outputs[1]: 'nope' is not an output of this model (outputs: logits, probs)",
    ),
    "binary size without the header length": (
        {"inputs": [binary_tensor("input", X)]},
        "input 'input' has binary_data_size but the request has no Inference-Header-Content-Length",
    ),
}
SPECS = {
    **INPUTS,
    "ids": TensorSpec("ids", "INT64", (-1, 2)),
    "pixels": TensorSpec("pixels", "UINT8", (-1, 2)),
    "flags": TensorSpec("flags", "BOOL", (-1, 2)),
    "half": TensorSpec("half", "FP16", (-1, 2)),
}


@pytest.mark.parametrize(("doc", "message"), ERRORS.values(), ids=ERRORS.keys())
def test_bad_request_names_the_problem(doc: Any, message: str, parser: str) -> None:
    tensors = doc.get("inputs") if isinstance(doc, dict) else None
    first = tensors[0] if tensors and isinstance(tensors[0], dict) else {}
    spec = SPECS.get(first.get("name", ""), SPECS["input"])
    with pytest.raises(InferenceRequestError) as info:
        decode(doc, {spec.name: spec})
    assert message in str(info.value)


def test_missing_input_is_named() -> None:
    with pytest.raises(InferenceRequestError, match=r"^missing input\(s\): mask$"):
        decode({"inputs": [GOOD]}, TWO_INPUTS)


def test_inputs_with_different_batch_sizes() -> None:
    doc = {"inputs": [GOOD, tensor("mask", [1, 4], [True] * 4, "BOOL")]}
    with pytest.raises(InferenceRequestError, match="same batch size"):
        decode(doc, TWO_INPUTS)
    assert decode(doc, TWO_INPUTS, batchable=False).rows == 1


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [
        (b"{", None, "request body is not valid JSON"),
        (b"", None, "request body is not valid JSON"),
        (b"\xff\xfe", None, "request body is not valid JSON"),
        (b"{}", 3, "Inference-Header-Content-Length is larger than the request body"),
    ],
)
def test_unreadable_body(body: bytes, header_length: int | None, message: str) -> None:
    with pytest.raises(InferenceRequestError, match=message):
        decode_request(body, header_length, INPUTS, OUTPUTS, batchable=True)


@pytest.mark.parametrize(
    ("blob", "size", "message"),
    [
        (
            X.tobytes()[:-4],
            28,
            "input 'input': binary_data_size is 28 bytes, shape [2, 4] of FP32 needs 32",
        ),
        (X.tobytes(), 64, "input 'input': bad binary_data_size 64"),
        (X.tobytes(), -1, "input 'input': bad binary_data_size -1"),
        (X.tobytes(), "32", "input 'input': bad binary_data_size '32'"),
    ],
)
def test_bad_binary_sizes(blob: bytes, size: Any, message: str) -> None:
    doc = {"inputs": [{**binary_tensor("input", X), "parameters": {"binary_data_size": size}}]}
    with pytest.raises(InferenceRequestError) as info:
        decode(doc, blobs=(blob,))
    assert str(info.value) == message


# -- encoding ----------------------------------------------------------------------------------


def test_json_response_echoes_the_id() -> None:
    req = decode({"id": "abc", "inputs": [GOOD]})
    body, header_length = encode_response("mnist", "1.0", req, results())
    assert header_length is None
    doc, _ = read_response(body, header_length)
    assert doc["id"] == "abc"
    assert (doc["model_name"], doc["model_version"]) == ("mnist", "1.0")
    logits, probs = doc["outputs"]
    assert logits == {
        "name": "logits",
        "datatype": "FP32",
        "shape": [2, 3],
        "data": (np.arange(6) - 2.5).tolist(),
    }
    assert probs["name"] == "probs"
    assert np.allclose(probs["data"], 1 / 3)


def test_response_without_an_id_has_none() -> None:
    body, _ = encode_response("m", "1", decode({"inputs": [GOOD]}), results())
    assert "id" not in orjson.loads(body)


def test_binary_data_output_makes_every_output_binary() -> None:
    req = decode({"inputs": [GOOD], "parameters": {"binary_data_output": True}})
    assert req.binary_outputs == frozenset(OUTPUTS)
    body, header_length = encode_response("m", "1", req, results())
    assert header_length is not None
    doc, rest = read_response(body, header_length)
    sizes = [o["parameters"]["binary_data_size"] for o in doc["outputs"]]
    assert sizes == [24, 24] and len(rest) == 48
    assert all("data" not in o for o in doc["outputs"])
    np.testing.assert_array_equal(
        np.frombuffer(rest[:24], dtype=np.float32).reshape(2, 3), results()[0]
    )
    np.testing.assert_array_equal(
        np.frombuffer(rest[24:], dtype=np.float32).reshape(2, 3), results()[1]
    )


def test_per_output_binary_data_and_output_selection() -> None:
    req = decode(
        {
            "inputs": [GOOD],
            "outputs": [{"name": "probs", "parameters": {"binary_data": True}}, {"name": "logits"}],
        }
    )
    assert req.outputs == ("probs", "logits")
    assert req.binary_outputs == frozenset({"probs"})
    probs, logits = results()[1], results()[0]
    body, header_length = encode_response("m", "1", req, [probs, logits])
    doc, rest = read_response(body, header_length)
    first, second = doc["outputs"]
    assert first["name"] == "probs" and first["parameters"] == {"binary_data_size": 24}
    assert second["name"] == "logits" and second["data"] == logits.ravel().tolist()
    np.testing.assert_array_equal(np.frombuffer(rest, dtype=np.float32).reshape(2, 3), probs)


def test_outputs_of_a_batch_slice_are_encoded() -> None:
    """The worker answers each request of a batch with a row slice of the batch's outputs."""
    req = decode({"inputs": [tensor("input", [1, 4], [0, 1, 2, 3])]})
    batch = np.arange(12, dtype=np.float32).reshape(4, 3)
    body, _ = encode_response("m", "1", req, [batch[1:2, 1:], batch[1:2]])
    logits, probs = orjson.loads(body)["outputs"]
    assert logits["shape"] == [1, 2] and logits["data"] == [4.0, 5.0]
    assert probs["data"] == [3.0, 4.0, 5.0]


def test_binary_outputs_of_a_batch_slice_are_views_of_its_memory() -> None:
    """Zero-copy answers: a contiguous row slice of a batch's output goes out as a view of the
    output array's own memory, not a copy; a strided one is copied into C order."""
    req = decode({"inputs": [GOOD], "parameters": {"binary_data_output": True}})
    batch = np.arange(24, dtype=np.float32).reshape(4, 6)
    rows = batch[1:3]
    parts, header_length = encode_response_parts("m", "1", req, [rows[:, :3], rows[:, 3:]])
    head, first, second = parts
    assert header_length == len(head)
    assert isinstance(first, bytes)  # columns of a row slice: strided, copied
    assert isinstance(second, bytes)
    parts, _ = encode_response_parts("m", "1", req, [batch[1:3], batch[2:4]])
    _, first, second = parts
    assert isinstance(first, memoryview) and isinstance(second, memoryview)
    assert np.shares_memory(np.frombuffer(first, dtype=np.float32), batch)
    np.testing.assert_array_equal(np.frombuffer(second, dtype=np.float32).reshape(2, 6), batch[2:4])
    body, hlen = encode_response("m", "1", req, [batch[1:3], batch[2:4]])
    assert body == b"".join(bytes(p) for p in parts) and hlen == header_length


ROUND_TRIPS = {
    "FP16": ("FP16", np.array([[0.5, -2.0], [65504.0, 0.0]], dtype=np.float16)),
    "INT64": ("INT64", np.array([[2**53 + 1, -(2**62)], [0, 7]], dtype=np.int64)),
    "BOOL": ("BOOL", np.array([[True, False], [False, True]])),
    "UINT8": ("UINT8", np.array([[0, 255], [1, 128]], dtype=np.uint8)),
}


@pytest.mark.parametrize(("datatype", "arr"), ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_round_trip(datatype: str, arr: np.ndarray, binary: bool) -> None:
    inputs = {"x": TensorSpec("x", datatype, (-1, 2))}
    outputs = ("y",)
    if binary:
        head = orjson.dumps(
            {
                "inputs": [binary_tensor("x", arr, datatype)],
                "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
            }
        )
        req = decode_request(head + arr.tobytes(), len(head), inputs, outputs, batchable=True)
    else:
        body = orjson.dumps({"inputs": [tensor("x", [2, 2], arr.tolist(), datatype)]})
        req = decode_request(body, None, inputs, outputs, batchable=True)
    fed = req.feeds["x"]
    assert fed.dtype == arr.dtype
    np.testing.assert_array_equal(fed, arr)

    body, header_length = encode_response("m", "1", req, [fed])
    doc, rest = read_response(body, header_length)
    (out,) = doc["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("y", datatype, [2, 2])
    if binary:
        back = np.frombuffer(rest, dtype=arr.dtype).reshape(out["shape"])
    else:
        back = np.asarray(out["data"], dtype=arr.dtype).reshape(out["shape"])
        assert out["data"] == arr.ravel().tolist()
    np.testing.assert_array_equal(back, arr)


FLAT = {
    "FP32 from floats": ("FP32", [0.5, -1.25, 3e38, 1e-30]),
    "FP32 from integers": ("FP32", [1, -2, 3, 2**40]),
    "FP16": ("FP16", [0.5, -1.5, 65504.0, 0.0]),
    "FP64": ("FP64", [1e300, -2.5, 0.1, 7]),
    "mixed numbers and a bool, as numpy reads them": ("FP32", [0.5, True, 2, 3.0]),
}


@pytest.mark.parametrize(("datatype", "values"), FLAT.values(), ids=FLAT.keys())
def test_flat_float_data_decodes_as_numpy_would(
    datatype: str, values: list[Any], parser: str
) -> None:
    spec = TensorSpec("x", datatype, (-1, 4))
    got = decode({"inputs": [tensor("x", [1, 4], values, datatype)]}, {"x": spec}).feeds["x"]
    want = np.asarray(values).astype(got.dtype).reshape(1, 4)
    assert got.dtype == np.dtype(datatype.replace("FP", "float"))
    np.testing.assert_array_equal(got, want)


# -- the simdjson fast path ----------------------------------------------------------------------


@pytest.mark.skipif(tensors.simdjson is None, reason="pysimdjson is not installed")
def test_flat_float_data_skips_python_floats() -> None:
    body = orjson.dumps({"inputs": [tensor("input", [2, 4], X.ravel().tolist())], "id": "a"})
    doc = tensors._simd_loads(body)
    assert doc is not None
    assert type(doc["inputs"][0]["data"]) is tensors._Numbers
    assert doc["id"] == "a" and doc["inputs"][0]["shape"] == [2, 4]
    got = decode_request(body, None, INPUTS, OUTPUTS, batchable=True)
    np.testing.assert_array_equal(got.feeds["input"], X)
    assert got.feeds["input"].dtype == np.float32 and got.request_id == "a"


def test_feeds_outlive_the_next_parse(parser: str) -> None:
    """A decoded request waits in the batch queue while later ones are parsed: its arrays
    must never be views of the parser's memory."""
    first = decode({"inputs": [tensor("input", [2, 4], X.ravel().tolist())]})
    decode({"inputs": [tensor("input", [2, 4], (X + 100).ravel().tolist())]})
    np.testing.assert_array_equal(first.feeds["input"], X)


ODD_JSON = {
    "duplicate data: the last one, as orjson": (
        b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,4],'
        b'"data":[1,2,3,4],"data":[5,6,7,8]}]}',
        [[5, 6, 7, 8]],
    ),
    "duplicate inputs key": (
        b'{"inputs":[{"name":"nope"}],"inputs":[{"name":"input","datatype":"FP32",'
        b'"shape":[1,4],"data":[1,2,3,4]}]}',
        [[1, 2, 3, 4]],
    ),
    "nested data": (
        b'{"inputs":[{"name":"input","datatype":"FP32","shape":[2,4],'
        b'"data":[[1,2,3,4],[5,6,7,8]]}]}',
        [[1, 2, 3, 4], [5, 6, 7, 8]],
    ),
    "integers and floats": (
        b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,4],"data":[1,2.5,-3,4e3]}]}',
        [[1, 2.5, -3, 4000]],
    ),
}


@pytest.mark.parametrize(("body", "want"), ODD_JSON.values(), ids=ODD_JSON.keys())
def test_odd_json_decodes_as_orjson_reads_it(body: bytes, want: Any, parser: str) -> None:
    got = decode_request(body, None, INPUTS, OUTPUTS, batchable=True)
    np.testing.assert_array_equal(got.feeds["input"], np.array(want, dtype=np.float32))


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,4],"data":[1,2,3,'
        + b"9" * 400
        + b"]}]}",
        b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,4],"data":[1,2,3,1e400]}]}',
        b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}',
    ],
    ids=["a 400-digit integer", "1e400", "unfinished"],
)
def test_numbers_json_cannot_hold_are_refused(body: bytes, parser: str) -> None:
    with pytest.raises(InferenceRequestError, match=r"input 'input'|not valid JSON"):
        decode_request(body, None, INPUTS, OUTPUTS, batchable=True)


# -- binary plans -------------------------------------------------------------------------------


def binary_body(arr: np.ndarray, **extra: Any) -> tuple[bytes, int]:
    head = orjson.dumps({"inputs": [binary_tensor("input", arr)], **extra})
    return head + arr.tobytes(), len(head)


def test_a_binary_header_is_checked_once_per_model() -> None:
    plans = BinaryPlans()
    body, hlen = binary_body(X, id="r1", parameters={"binary_data_output": True})
    first = decode_request(body, hlen, INPUTS, OUTPUTS, batchable=True, plans=plans)
    again_body = body[:hlen] + (X * 2).tobytes()
    again = decode_request(again_body, hlen, INPUTS, OUTPUTS, batchable=True, plans=plans)
    assert plans.get((body[:hlen], X.nbytes)) is not None
    np.testing.assert_array_equal(first.feeds["input"], X)
    np.testing.assert_array_equal(again.feeds["input"], X * 2)
    for field in ("request_id", "rows", "outputs", "binary_outputs", "batch_key"):
        assert getattr(again, field) == getattr(first, field)


def test_a_binary_plan_never_serves_another_length() -> None:
    plans = BinaryPlans()
    body, hlen = binary_body(X)
    decode_request(body, hlen, INPUTS, OUTPUTS, batchable=True, plans=plans)
    with pytest.raises(InferenceRequestError, match="bad binary_data_size"):
        decode_request(body[:-4], hlen, INPUTS, OUTPUTS, batchable=True, plans=plans)


def test_binary_plans_are_bounded_and_skip_json_inputs() -> None:
    plans = BinaryPlans()
    for i in range(plans.capacity + 10):
        body, hlen = binary_body(X, id=str(i))
        decode_request(body, hlen, INPUTS, OUTPUTS, batchable=True, plans=plans)
    assert len(plans._plans) == plans.capacity
    mixed = {"inputs": [binary_tensor("input", X), tensor("mask", [2, 4], [True] * 8, "BOOL")]}
    head = orjson.dumps(mixed)
    plans = BinaryPlans()
    decode_request(head + X.tobytes(), len(head), TWO_INPUTS, OUTPUTS, batchable=True, plans=plans)
    assert not plans._plans  # a JSON input's data is in the header: nothing to reuse
