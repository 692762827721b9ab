"""edgefleet.inference: the request bodies clients send (pure; no server)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from edgefleet.inference import infer_path, infer_request_body, input_tensor


@pytest.mark.parametrize(
    ("value", "datatype", "shape", "data"),
    [
        (np.arange(6, dtype=np.float32).reshape(2, 3), "FP32", [2, 3], [0, 1, 2, 3, 4, 5]),
        (np.array([1, 2], dtype=np.int64), "INT64", [2], [1, 2]),
        (np.array([[True], [False]]), "BOOL", [2, 1], [True, False]),
        (np.zeros((1, 0), dtype=np.float16), "FP16", [1, 0], []),
        ([[0.5, 1.5], [2.5, 3.5]], "FP32", [2, 2], [0.5, 1.5, 2.5, 3.5]),  # lists: FP32
        ([], "FP32", [0], []),
        (7.0, "FP32", [], [7.0]),
    ],
)
def test_input_tensor(value: object, datatype: str, shape: list[int], data: list[object]) -> None:
    assert input_tensor("x", value) == {
        "name": "x",
        "datatype": datatype,
        "shape": shape,
        "data": data,
    }


def test_a_given_datatype_wins() -> None:
    assert input_tensor("x", [[1, 2]], datatype="INT32")["datatype"] == "INT32"
    assert input_tensor("x", np.ones(2, dtype=np.float64), datatype="FP32")["datatype"] == "FP32"


def test_problems_are_named() -> None:
    with pytest.raises(ValueError, match="x: nested lists of different lengths"):
        input_tensor("x", [[1.0, 2.0], [3.0]])
    with pytest.raises(ValueError, match="x: no Open Inference Protocol datatype for dtype"):
        input_tensor("x", np.array(["a"]))


def test_the_body_is_the_json_edged_reads() -> None:
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    body = orjson.loads(infer_request_body({"input": x, "mask": [[1, 0, 1, 1]]}))
    assert body == {
        "inputs": [
            {"name": "input", "datatype": "FP32", "shape": [1, 4], "data": x.ravel().tolist()},
            {"name": "mask", "datatype": "FP32", "shape": [1, 4], "data": [1, 0, 1, 1]},
        ]
    }


def test_infer_path() -> None:
    assert infer_path("mlp") == "/v2/models/mlp/infer"
    assert infer_path("mlp", "1.0.0") == "/v2/models/mlp/versions/1.0.0/infer"
