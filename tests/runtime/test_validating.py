"""The validation set on a real ONNX Runtime session: accuracy from labels or expected
outputs, and every way a set can be unusable (reported, never raised)."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from edged.runtime.validating import MAX_UNPACKED_BYTES, evaluate
from edgefleet.demo import TINY_MLP, build_mlp


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    path = build_mlp(tmp_path_factory.mktemp("m") / "m.onnx", TINY_MLP, seed=3)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def write(tmp_path: Path, **arrays: Any) -> tuple[str, str]:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path = tmp_path / "validation.npz"
    path.write_bytes(buf.getvalue())
    return str(path), hashlib.sha256(buf.getvalue()).hexdigest()


def predictions(session: ort.InferenceSession, x: np.ndarray) -> np.ndarray:
    return np.asarray(session.run(None, {"input": x})[0])


def test_accuracy_from_labels(session: ort.InferenceSession, tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((150, 64)).astype(np.float32)
    labels = predictions(session, x).argmax(axis=1)
    labels[:30] = (labels[:30] + 1) % 10  # 30 of 150 wrong: 0.8
    got = evaluate(session, *write(tmp_path, inputs=x, labels=labels))
    assert got == {"accuracy": 0.8, "samples": 150, "correct": 120}


def test_accuracy_from_outputs_with_a_tolerance(
    session: ort.InferenceSession, tmp_path: Path
) -> None:
    x = np.random.default_rng(1).standard_normal((10, 64)).astype(np.float32)
    expected = predictions(session, x)
    expected[0] += 1.0  # far off
    expected[1] += 1e-6  # within the tolerance
    got = evaluate(session, *write(tmp_path, inputs=x, outputs=expected, atol=np.float32(1e-4)))
    assert got == {"accuracy": 0.9, "samples": 10, "correct": 9}
    # named input and output, float64 inputs cast to the model's type
    got = evaluate(
        session,
        *write(
            tmp_path, **{"inputs.input": x.astype(np.float64)}, outputs=expected, output="logits"
        ),
    )
    assert got["correct"] == 9


@pytest.mark.parametrize(
    ("arrays", "says"),
    [
        ({"labels": np.zeros(3)}, "no array 'inputs'"),
        ({"inputs": np.zeros((3, 64), np.float32)}, "exactly one of labels or outputs"),
        ({"inputs": np.zeros((3, 64), np.float32), "labels": np.zeros(2)}, "3 samples but 2"),
        (
            {"inputs": np.zeros((3, 64), np.float32), "labels": np.zeros(3), "output": "nope"},
            "no output 'nope'",
        ),
        ({"inputs": np.zeros((0, 64), np.float32), "labels": np.zeros(0)}, "1 to 100000"),
    ],
)
def test_an_unusable_set_is_reported(
    session: ort.InferenceSession, tmp_path: Path, arrays: dict[str, Any], says: str
) -> None:
    got = evaluate(session, *write(tmp_path, **arrays))
    assert got["reason"] == "ValidationInvalid" and says in got["message"], got


def test_no_set_a_wrong_digest_junk_and_a_bomb(
    session: ort.InferenceSession, tmp_path: Path
) -> None:
    assert evaluate(session, "", "")["reason"] == "NoValidationSet"
    path, _ = write(tmp_path, inputs=np.zeros((1, 64), np.float32), labels=np.zeros(1))
    assert "signed digest" in evaluate(session, path, "0" * 64)["message"]
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    assert (
        "not an .npz"
        in evaluate(session, str(junk), hashlib.sha256(b"not a zip").hexdigest())["message"]
    )
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("inputs.npy", b"\0" * (MAX_UNPACKED_BYTES + 1))
    digest = hashlib.sha256(bomb.read_bytes()).hexdigest()
    assert "unpacks to" in evaluate(session, str(bomb), digest)["message"]
    # a sample the model cannot take: ONNX Runtime's own error, reported
    path, digest = write(tmp_path, inputs=np.zeros((2, 5), np.float32), labels=np.zeros(2))
    got = evaluate(session, path, digest)
    assert got["reason"] == "ValidationFailed", got
