"""Precision variants of one artifact: which signed file holds the model at which precision.

An artifact's model file is its fp32 (reference) model. A precision variant is one of the
artifact's signed extra files named ``<model stem>.<precision>.onnx`` (``mlp.fp16.onnx``,
``mlp.int8.onnx`` next to ``mlp.onnx``): signed in the same metadata as the model, fetched and
verified with it, kept in the store while the workload is desired. ``edgectl models variants``
writes them. Pure: names in, names out.
"""

from __future__ import annotations

from collections.abc import Mapping

BASE_PRECISION = "fp32"  # the precision of an artifact's model file
PRECISIONS = ("fp32", "fp16", "int8")


def variant_file_name(model_file: str, precision: str) -> str:
    """The extra file holding ``model_file`` at ``precision``: mlp.onnx -> mlp.fp16.onnx."""
    stem = model_file[: -len(".onnx")] if model_file.endswith(".onnx") else model_file
    return f"{stem}.{precision}.onnx"


def precision_of_extra(file_name: str) -> str | None:
    """The precision an extra file holds the model in, from its name; None: not a variant."""
    for precision in PRECISIONS:
        if precision != BASE_PRECISION and file_name.endswith(f".{precision}.onnx"):
            return precision
    return None


def variants_of(model_sha256: str, extras: Mapping[str, str]) -> dict[str, str]:
    """Precision -> sha256 of every variant the artifact holds, the model file as fp32. Two
    extras of one precision (``edgectl`` never signs that): the first by file name."""
    out = {BASE_PRECISION: model_sha256}
    for name in sorted(extras):
        precision = precision_of_extra(name)
        if precision is not None and precision not in out:
            out[precision] = extras[name]
    return out
