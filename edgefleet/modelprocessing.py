"""The processing stage a ModelConfig drives in the worker (docs/model-config.md, "The
processing stage"): pure, standard library only (edged's control process checks it too).

A merged config's data may hold the key :data:`PROCESSING_KEY`; the worker applies it around
every inference (and around the validation set's, so the canary's accuracy is the model's
*with* its config)::

    edgefleet.io/processing:
      inputs:
        input:                     # a model input (a float tensor)
          scale: 0.0039215686      # x * scale           (default 1)
          mean: [0.485, 0.456]     # then - mean         (default 0; a number, or one a channel)
          std: [0.229, 0.224]      # then / std          (default 1; never 0)
          channelAxis: 1           # the axis mean and std lists run along (default 1)
      outputs:
        logits:                    # a model output (a float tensor)
          classMap: [2, 0, 1]      # the answer's class j is the model's class classMap[j]
          threshold: 0.5           # then values below it become `below`
          below: 0.0               # (default 0)

:func:`read_processing` checks the shape of that section (types, bounds, finite numbers) and
names each problem's path; whether the names and sizes fit the model is the worker's check
(``edged.runtime.configstage``), and a config that does not fit is refused there with its
reason, the previous one kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PROCESSING_KEY = "edgefleet.io/processing"
MAX_TENSORS = 16  # inputs, outputs: each at most this many
MAX_VALUES = 4096  # a mean, std or classMap list
MAX_AXIS = 8
_INPUT_KEYS = ("scale", "mean", "std", "channelAxis")
_OUTPUT_KEYS = ("classMap", "threshold", "below")


class ProcessingInvalid(ValueError):
    """The processing section is malformed; the message names the path of each problem."""


@dataclass(frozen=True, slots=True)
class InputStep:
    scale: float = 1.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    channel_axis: int = 1


@dataclass(frozen=True, slots=True)
class OutputStep:
    class_map: tuple[int, ...] | None = None
    threshold: float | None = None
    below: float = 0.0


@dataclass(frozen=True, slots=True)
class Processing:
    inputs: Mapping[str, InputStep]
    outputs: Mapping[str, OutputStep]

    @property
    def empty(self) -> bool:
        return not self.inputs and not self.outputs


NONE = Processing({}, {})


def read_processing(data: Mapping[str, Any]) -> Processing:
    """The processing of a merged config's ``data`` (:data:`NONE` when it has none);
    ProcessingInvalid naming every problem's path otherwise."""
    section = data.get(PROCESSING_KEY)
    if section is None:
        return NONE
    base = f"data[{PROCESSING_KEY!r}]"
    problems: list[str] = []
    if not isinstance(section, Mapping):
        raise ProcessingInvalid(f"{base}: must be a mapping of inputs and outputs")
    for extra in sorted(set(section) - {"inputs", "outputs"}):
        problems.append(f"{base}.{extra}: unknown field (inputs, outputs)")
    inputs: dict[str, InputStep] = {}
    outputs: dict[str, OutputStep] = {}
    for part, keys in (("inputs", _INPUT_KEYS), ("outputs", _OUTPUT_KEYS)):
        given = section.get(part, {})
        where = f"{base}.{part}"
        if not isinstance(given, Mapping):
            problems.append(f"{where}: must be a mapping of tensor names")
            continue
        if len(given) > MAX_TENSORS:
            problems.append(f"{where}: at most {MAX_TENSORS} tensors, got {len(given)}")
            continue
        for name, step in given.items():
            path = f"{where}[{name!r}]"
            if not isinstance(step, Mapping) or not step:
                problems.append(f"{path}: must be a mapping of {', '.join(keys)}")
                continue
            for extra in sorted(set(step) - set(keys)):
                problems.append(f"{path}.{extra}: unknown field ({', '.join(keys)})")
            before = len(problems)
            if part == "inputs":
                made: Any = _input_step(step, path, problems)
            else:
                made = _output_step(step, path, problems)
            if len(problems) == before:
                (inputs if part == "inputs" else outputs)[str(name)] = made
    if problems:
        raise ProcessingInvalid("; ".join(problems[:20]))
    return Processing(inputs, outputs)


def _number(value: object, path: str, problems: list[str]) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        problems.append(f"{path}: must be a finite number, got {value!r:.40}")
        return None
    return float(value)


def _numbers(value: object, path: str, problems: list[str], *, nonzero: bool) -> tuple[float, ...]:
    items = value if isinstance(value, list) else [value]
    if not 1 <= len(items) <= MAX_VALUES:
        problems.append(f"{path}: a number or a list of 1 to {MAX_VALUES} numbers")
        return ()
    out = []
    for i, v in enumerate(items):
        where = f"{path}[{i}]" if isinstance(value, list) else path
        n = _number(v, where, problems)
        if n is None:
            return ()
        if nonzero and n == 0.0:
            problems.append(f"{where}: must not be 0 (it divides)")
            return ()
        out.append(n)
    return tuple(out)


def _input_step(step: Mapping[str, Any], path: str, problems: list[str]) -> InputStep:
    scale = _number(step.get("scale", 1.0), f"{path}.scale", problems)
    if scale == 0.0:  # every input would be 0: a mistake, never taken as "no scale"
        problems.append(f"{path}.scale: must not be 0 (every input would be 0)")
    mean = _numbers(step.get("mean", 0.0), f"{path}.mean", problems, nonzero=False)
    std = _numbers(step.get("std", 1.0), f"{path}.std", problems, nonzero=True)
    axis = step.get("channelAxis", 1)
    if isinstance(axis, bool) or not isinstance(axis, int) or not -MAX_AXIS <= axis < MAX_AXIS:
        problems.append(f"{path}.channelAxis: an integer from {-MAX_AXIS} to {MAX_AXIS - 1}")
        axis = 1
    return InputStep(1.0 if scale is None else scale, mean or (0.0,), std or (1.0,), axis)


def _output_step(step: Mapping[str, Any], path: str, problems: list[str]) -> OutputStep:
    class_map: tuple[int, ...] | None = None
    if "classMap" in step:
        given = step["classMap"]
        if (
            not isinstance(given, list)
            or not 1 <= len(given) <= MAX_VALUES
            or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in given)
        ):
            problems.append(
                f"{path}.classMap: must be a list of 1 to {MAX_VALUES} class indices (>= 0)"
            )
        else:
            class_map = tuple(given)
    threshold = None
    if "threshold" in step:
        threshold = _number(step["threshold"], f"{path}.threshold", problems)
    below = _number(step.get("below", 0.0), f"{path}.below", problems)
    return OutputStep(class_map, threshold, below or 0.0)
