"""A model's accuracy on a validation set (an artifact's signed ``validation.npz``).

The artifact's signed metadata may list an extra file ``validation.npz`` (the format:
docs/rollouts.md): a NumPy ``.npz`` archive (no pickles) holding

* ``inputs`` (a model with one input) or ``inputs.NAME`` for each input NAME: the samples
  along the first axis; each sample is fed with a batch dimension of 1, or several at once
  when the model's first dimension is dynamic;
* and either ``labels`` (integers, one per sample): a sample is correct when the arg-max of
  the output's last axis is its label; or ``outputs`` (the expected output, one per sample):
  correct when every element is within ``atol + rtol * |expected|`` (``atol`` and ``rtol``:
  optional scalars, default 1e-5 and 1e-3);
* optionally ``output``: the name of the output compared (default: the first one).

The worker evaluates it once the session is loaded and warmed up, before it says READY (the
startup probe covers the time it takes), on replica slot 0 only; the verified bytes are read
again and checked against their digest like the model's. Bounds: at most
:data:`MAX_SAMPLES` samples and :data:`MAX_UNPACKED_BYTES` unpacked. A set that does not fit
the model is not a failure of the revision: it is reported (``ValidationInvalid``) and the
hub's analysis, when it asks for ``minAccuracy``, fails the canary with that reason.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from typing import Any

MAX_SAMPLES = 100_000
MAX_UNPACKED_BYTES = 256 << 20
CHUNK = 64
FILE_NAME = "validation.npz"


class ValidationInvalid(Exception):
    pass


def evaluate(session: Any, path: str, sha256: str) -> dict[str, Any]:
    """``{"accuracy", "samples", "correct"}``, or ``{"reason", "message"}`` when there is no
    accuracy to report."""
    if not path:
        return {
            "reason": "NoValidationSet",
            "message": f"the artifact ships no {FILE_NAME} (docs/rollouts.md)",
        }
    try:
        return _evaluate(session, path, sha256)
    except ValidationInvalid as exc:
        return {"reason": "ValidationInvalid", "message": str(exc)[:1000]}
    except MemoryError:
        return {
            "reason": "ValidationFailed",
            "message": "the validation set does not fit in memory",
        }
    except Exception as exc:  # onnxruntime's own errors on a sample
        return {"reason": "ValidationFailed", "message": f"{type(exc).__name__}: {exc}"[:1000]}


def _evaluate(session: Any, path: str, sha256: str) -> dict[str, Any]:
    import numpy as np

    with open(path, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValidationInvalid(f"{FILE_NAME} does not match its signed digest")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            unpacked = sum(i.file_size for i in z.infolist())
    except zipfile.BadZipFile as exc:
        raise ValidationInvalid(f"{FILE_NAME} is not an .npz archive: {exc}") from None
    if unpacked > MAX_UNPACKED_BYTES:
        raise ValidationInvalid(
            f"{FILE_NAME} unpacks to {unpacked} bytes, more than {MAX_UNPACKED_BYTES}"
        )
    try:
        archive = np.load(io.BytesIO(data), allow_pickle=False)
        arrays = {name: archive[name] for name in archive.files}
    except (ValueError, OSError) as exc:
        raise ValidationInvalid(f"{FILE_NAME} cannot be read: {exc}") from None
    inputs = session.get_inputs()
    feeds: dict[str, Any] = {}
    for spec in inputs:
        key = f"inputs.{spec.name}"
        if len(inputs) == 1 and key not in arrays:
            key = "inputs"
        if key not in arrays:
            raise ValidationInvalid(f"{FILE_NAME} has no array {key!r} for input {spec.name!r}")
        feeds[spec.name] = arrays[key]
    counts = {len(a) if a.ndim else 0 for a in feeds.values()}
    if len(counts) != 1:
        raise ValidationInvalid(f"the inputs of {FILE_NAME} differ in their number of samples")
    n = counts.pop()
    if not 0 < n <= MAX_SAMPLES:
        raise ValidationInvalid(f"{FILE_NAME} must hold 1 to {MAX_SAMPLES} samples, got {n}")
    outputs = [o.name for o in session.get_outputs()]
    wanted = str(arrays["output"]) if "output" in arrays else outputs[0]
    if wanted not in outputs:
        raise ValidationInvalid(f"the model has no output {wanted!r} (it has {outputs})")
    labels = arrays.get("labels")
    expected = arrays.get("outputs")
    if (labels is None) == (expected is None):
        raise ValidationInvalid(f"{FILE_NAME} must hold exactly one of labels or outputs")
    reference = labels if labels is not None else expected
    assert reference is not None
    if len(reference) != n:
        raise ValidationInvalid(
            f"{FILE_NAME} has {n} samples but {len(reference)} "
            + ("labels" if labels is not None else "expected outputs")
        )
    rtol = float(arrays["rtol"]) if "rtol" in arrays else 1e-3
    atol = float(arrays["atol"]) if "atol" in arrays else 1e-5
    batched = all(s.shape and not isinstance(s.shape[0], int) for s in inputs)
    step = CHUNK if batched else 1
    dtypes = {s.name: _dtype(s.type) for s in inputs}
    correct = 0
    for start in range(0, n, step):
        chunk = {
            name: np.ascontiguousarray(a[start : start + step], dtype=dtypes[name] or a.dtype)
            for name, a in feeds.items()
        }
        (got,) = session.run([wanted], chunk)
        got = np.asarray(got)
        ref = reference[start : start + step]
        if labels is not None:
            predicted = got.reshape(len(ref), -1).argmax(axis=-1)
            correct += int((predicted == ref.reshape(len(ref))).sum())
        else:
            got = got.reshape(ref.shape) if got.size == ref.size else got
            if got.shape != ref.shape:
                raise ValidationInvalid(
                    f"expected outputs have the shape {ref.shape[1:]} per sample, the model "
                    f"gives {got.shape[1:]}"
                )
            close = np.isclose(got, ref, rtol=rtol, atol=atol).reshape(len(ref), -1).all(axis=1)
            correct += int(close.sum())
    return {"accuracy": correct / n, "samples": n, "correct": correct}


_TYPES = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}


def _dtype(ort_type: str) -> str | None:
    return _TYPES.get(ort_type)
