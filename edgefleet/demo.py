"""Small ONNX models built with the ``onnx`` package (the ``demo`` extra).

Used by ``edgectl quickstart``, the tests and the benchmarks. Never imported by the daemon.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

TINY_MLP = (64, 256, 10)
MEDIUM_MLP = (1024, 2048, 2048, 1000)


def build_mlp(
    path: str | Path,
    sizes: Sequence[int] = TINY_MLP,
    *,
    seed: int = 0,
    input_name: str = "input",
    output_name: str = "logits",
    dynamic_batch: bool = True,
    scale: float = 1.0,
) -> Path:
    """Write a float32 MLP (Gemm + Relu between layers) to ``path`` and return the path.

    The batch dimension is symbolic (``batch``) unless ``dynamic_batch`` is false. ``scale``
    multiplies every weight, so two models of the same shape can give different outputs.
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes = []
    inits = []
    prev = input_name
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        w = (rng.standard_normal((n_in, n_out)) * scale / np.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal(n_out) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(sizes) - 2
        out = output_name if last else f"h{i}"
        gemm_out = out if last else f"g{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [gemm_out]))
        if not last:
            nodes.append(helper.make_node("Relu", [gemm_out], [out]))
        prev = out
    batch: str | int = "batch" if dynamic_batch else 1
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [batch, sizes[0]])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [batch, sizes[-1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(path)
    return path
