"""``edgectl models variants``: real onnxruntime quantization (int8) and onnxconverter-common
(fp16) on a small MLP built with ``onnx``; the accuracy change on a validation set in the
devices' format, and on sample inputs without one. Faked: nothing (in process, no hub)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgectl.cli import main
from edgefleet.demo import TINY_MLP, build_mlp


def fp32_labels(model: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rows = [session.run(None, {"input": x[i : i + 1]})[0] for i in range(len(x))]
    return np.concatenate(rows).argmax(axis=-1)


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["models", "variants", *args, "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_variants_with_the_artifacts_validation_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "mlp.onnx"
    build_mlp(model, TINY_MLP, seed=1)
    x = np.random.default_rng(0).standard_normal((64, TINY_MLP[0])).astype(np.float32)
    np.savez(tmp_path / "validation.npz", inputs=x, labels=fp32_labels(model, x))
    report = run_json(capsys, str(model))
    by = {v["precision"]: v for v in report["variants"]}
    assert list(by) == ["fp32", "fp16", "int8"]
    assert report["measuredOn"]["file"].endswith("validation.npz")
    assert report["measuredOn"]["samples"] == 64
    assert (by["fp32"]["accuracy"], by["fp32"]["accuracyChange"]) == (1.0, 0.0)
    for p in ("fp16", "int8"):
        assert Path(by[p]["file"]) == tmp_path / f"mlp.{p}.onnx"
        assert 0.5 <= by[p]["accuracy"] <= 1.0
        assert by[p]["accuracyChange"] == pytest.approx(by[p]["accuracy"] - 1.0)
    assert by["fp16"]["bytes"] < by["fp32"]["bytes"]
    assert by["int8"]["bytes"] < by["fp16"]["bytes"]
    # the text report names each file and how to sign them with the model
    assert main(["models", "variants", str(model), "--precision", "int8"]) == 0
    text = capsys.readouterr().out
    assert "mlp.int8.onnx" in text and "mlp.fp16.onnx" not in text
    assert f"edgectl models push {model} --extra {tmp_path / 'mlp.int8.onnx'}" in text


def test_variants_on_sample_inputs_without_a_validation_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "mlp.onnx"
    build_mlp(model, TINY_MLP, seed=2)
    x = np.random.default_rng(1).standard_normal((32, TINY_MLP[0])).astype(np.float32)
    np.savez(tmp_path / "inputs.npz", input=x)
    out = tmp_path / "out"
    report = run_json(
        capsys, str(model), "--input", str(tmp_path / "inputs.npz"), "--out", str(out)
    )
    by = {v["precision"]: v for v in report["variants"]}
    assert report["measuredOn"]["metric"] == "agreement with fp32"
    assert by["fp32"]["agreement"] == 1.0 and by["fp32"]["maxAbsDiff"] == 0.0
    assert 0 < by["fp16"]["maxAbsDiff"] < 0.05
    assert (out / "mlp.fp16.onnx").is_file() and (out / "mlp.int8.onnx").is_file()


def test_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "variants", str(tmp_path / "absent.onnx")]) == 1
    assert "models variants:" in capsys.readouterr().err
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    assert main(["models", "variants", str(junk)]) == 1
    assert "not an ONNX model" in capsys.readouterr().err
