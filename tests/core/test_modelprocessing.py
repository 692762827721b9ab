"""The processing section of a ModelConfig (``edgefleet.io/processing``): read as a table, every
malformed shape refused with its path (edged refuses such a config before writing it)."""

from __future__ import annotations

from typing import Any

import pytest

from edgefleet.modelprocessing import (
    NONE,
    PROCESSING_KEY,
    InputStep,
    OutputStep,
    ProcessingInvalid,
    read_processing,
)

K = repr(PROCESSING_KEY)


def test_no_section_is_no_processing() -> None:
    assert read_processing({"threshold": 0.5}) is NONE
    assert NONE.empty


def test_a_full_section_is_read_with_its_defaults() -> None:
    got = read_processing(
        {
            PROCESSING_KEY: {
                "inputs": {"image": {"scale": 0.5, "mean": [1, 2, 3], "std": 2, "channelAxis": -1}},
                "outputs": {"scores": {"threshold": 0.25}, "boxes": {"classMap": [1, 0]}},
            }
        }
    )
    assert got.inputs == {"image": InputStep(0.5, (1.0, 2.0, 3.0), (2.0,), -1)}
    assert got.outputs == {
        "scores": OutputStep(None, 0.25, 0.0),
        "boxes": OutputStep((1, 0), None, 0.0),
    }
    assert not got.empty


BAD: list[tuple[Any, str]] = [
    ([1], f"data[{K}]: must be a mapping"),
    ({"input": {}}, f"data[{K}].input: unknown field (inputs, outputs)"),
    ({"inputs": []}, f"data[{K}].inputs: must be a mapping of tensor names"),
    ({"inputs": {"x": {}}}, f"data[{K}].inputs['x']: must be a mapping of scale"),
    ({"inputs": {"x": {"scael": 1}}}, f"data[{K}].inputs['x'].scael: unknown field"),
    ({"inputs": {"x": {"scale": "1"}}}, f"data[{K}].inputs['x'].scale: must be a finite number"),
    ({"inputs": {"x": {"scale": True}}}, "scale: must be a finite number"),
    ({"inputs": {"x": {"std": [1, 0]}}}, f"data[{K}].inputs['x'].std[1]: must not be 0"),
    ({"inputs": {"x": {"std": 0}}}, "std: must not be 0"),
    ({"inputs": {"x": {"scale": 0}}}, f"data[{K}].inputs['x'].scale: must not be 0"),
    ({"inputs": {"x": {"mean": []}}}, "mean: a number or a list of 1 to 4096 numbers"),
    ({"inputs": {"x": {"mean": [0.0] * 4097}}}, "mean: a number or a list of 1 to 4096"),
    ({"inputs": {"x": {"mean": [1, None]}}}, "mean[1]: must be a finite number"),
    ({"inputs": {"x": {"channelAxis": 9}}}, "channelAxis: an integer from -8 to 7"),
    ({"inputs": {str(i): {"scale": 1} for i in range(17)}}, "at most 16 tensors, got 17"),
    ({"outputs": {"y": {"threshold": float("nan")}}}, "threshold: must be a finite number"),
    ({"outputs": {"y": {"classMap": [0, -1]}}}, "classMap: must be a list of 1 to 4096 class"),
    ({"outputs": {"y": {"classMap": 2}}}, "classMap: must be a list"),
    ({"outputs": {"y": {"below": "0"}}}, "below: must be a finite number"),
]


@pytest.mark.parametrize(("section", "says"), BAD)
def test_a_malformed_section_is_refused_with_its_path(section: Any, says: str) -> None:
    with pytest.raises(ProcessingInvalid) as err:
        read_processing({PROCESSING_KEY: section})
    assert says in str(err.value)


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(ProcessingInvalid) as err:
        read_processing(
            {PROCESSING_KEY: {"inputs": {"a": {"scale": "x"}}, "outputs": {"b": {"below": []}}}}
        )
    assert "inputs['a'].scale" in str(err.value) and "outputs['b'].below" in str(err.value)
