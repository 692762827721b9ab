"""A model slowed deterministically, for tests of work that overlaps ONNX Runtime
(tests/runtime/test_overlap.py, tests/e2e/test_overlap_metrics.py): a long chain of MatMuls by
one shared permutation matrix, a Relu between each two, so the answer is the input with its
negatives zeroed and its columns permuted, exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np

WIDTH = 1024
LAYERS = 256  # about 270 M multiply-adds per row: tens of milliseconds per batch of 8


def slow_model(path: Path, layers: int = LAYERS) -> tuple[Path, np.ndarray]:
    """The model (input "input", output "out", both [batch, WIDTH] float32), and where each
    input column lands in its output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    perm = np.random.default_rng(3).permutation(WIDTH)
    w = np.zeros((WIDTH, WIDTH), dtype=np.float32)
    w[np.arange(WIDTH), perm] = 1.0  # x @ w moves column i to column perm[i]
    nodes = []
    prev = "input"
    for i in range(layers):  # MatMul, Relu, MatMul, ...: nothing for the optimizer to fold
        out = "out" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, "w"], [out if i == 0 else f"m{i}"]))
        if i:
            nodes[-1:] = [
                helper.make_node("Relu", [prev], [f"r{i}"]),
                helper.make_node("MatMul", [f"r{i}", "w"], [out]),
            ]
        prev = out
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", WIDTH])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    moved = np.arange(WIDTH)  # where each column ends up after all the layers
    for _ in range(layers):
        moved = perm[moved]
    return path, moved


def expected(x: np.ndarray, moved: np.ndarray) -> np.ndarray:
    """The model's answer to ``x``."""
    y = np.empty_like(x)
    y[:, moved] = np.maximum(x, 0)
    return y
