"""``edgectl models variants MODEL``: precision variants of an fp32 ONNX model, and what they
cost in accuracy.

* int8: ONNX Runtime's dynamic quantization (``onnxruntime.quantization.quantize_dynamic``,
  int8 weights, activations quantized per batch at run time).
* fp16: ``onnxconverter_common.float16.convert_float_to_float16`` with the inputs and outputs
  kept in float32, so that a client sends the same request to every variant (a switch of
  precision is invisible to it).

Each variant is written as ``<stem>.<precision>.onnx`` (the name devices know a variant by:
:mod:`edgefleet.artifacts.variants`) next to the model or in ``--out``; sign and push them
with the model as extras (``edgectl models push MODEL --extra mlp.fp16.onnx --extra
mlp.int8.onnx``), so every file is signed in the same metadata.

The accuracy change is measured on the artifact's validation set (``validation.npz`` next to
the model, or ``--validation``; the format of docs/rollouts.md) with the devices' own code
(:mod:`edgefleet.validationsets`); without one, on ``--input FILE.npz`` (arrays named like the
model's inputs, or ``inputs``): the share of samples whose arg-max agrees with fp32's and the
largest absolute difference of the outputs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

from edgectl.errors import EXIT_USAGE, EdgectlError
from edgefleet.artifacts.variants import BASE_PRECISION, variant_file_name
from edgefleet.validationsets import FILE_NAME as VALIDATION_FILE

VARIANTS = ("fp16", "int8")
MAX_INPUT_SAMPLES = 100_000


class VariantsError(EdgectlError):
    def __init__(self, message: str, exit_code: int = EdgectlError.exit_code) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def add_command(models: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    v = models.add_parser(
        "variants",
        help="build fp16 and int8 variants of an fp32 model and report their accuracy change",
    )
    v.add_argument("file", type=Path, help="the fp32 model file (.onnx)")
    v.add_argument(
        "--precision",
        action="append",
        choices=VARIANTS,
        default=[],
        help="a variant to build (repeat; default: fp16 and int8)",
    )
    v.add_argument("--out", type=Path, default=None, help="folder (default: next to the model)")
    v.add_argument(
        "--validation",
        type=Path,
        default=None,
        help=f"the validation set (default: {VALIDATION_FILE} next to the model, if present)",
    )
    v.add_argument(
        "--input",
        type=Path,
        default=None,
        help="without a validation set: sample inputs (.npz) to compare the outputs with fp32's",
    )
    v.add_argument("-o", "--output", choices=("text", "json"), default="text")


def run(args: argparse.Namespace) -> int | None:
    if args.command != "models" or getattr(args, "models_cmd", None) != "variants":
        return None
    try:
        report = build_variants(
            args.file,
            precisions=tuple(dict.fromkeys(args.precision)) or VARIANTS,
            out=args.out,
            validation=args.validation,
            sample_input=args.input,
        )
    except VariantsError as exc:
        raise VariantsError(f"models variants: {exc}", exc.exit_code) from None
    except (OSError, ValueError) as exc:
        raise VariantsError(f"models variants: {exc}") from None
    if args.output == "json":
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    print(_render(report))
    return 0


def _render(report: dict[str, Any]) -> str:
    measured = report["measuredOn"]
    lines = [f"{'PRECISION':<10} {'FILE':<32} {'BYTES':>12}  {measured['metric'].upper()}"]
    for v in report["variants"]:
        figure = v.get("accuracy", v.get("agreement"))
        change = v.get("accuracyChange")
        text = f"{figure:.4f}" if figure is not None else "-"
        if change is not None:
            text += f" ({change:+.4f})"
        if v.get("maxAbsDiff") is not None:
            text += f", max |diff| {v['maxAbsDiff']:.3g}"
        lines.append(f"{v['precision']:<10} {Path(v['file']).name:<32} {v['bytes']:>12}  {text}")
    lines.append(f"measured on {measured['file'] or 'nothing'} ({measured['samples']} samples)")
    extras = " ".join(f"--extra {v['file']}" for v in report["variants"][1:])
    lines.append(f"sign them with the model: edgectl models push {report['model']} {extras}")
    return "\n".join(lines)


def _imports() -> tuple[Any, Any, Any, Any]:
    try:
        import onnx
        import onnxruntime
        from onnxconverter_common import float16
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        raise VariantsError(
            f"needs onnx and onnxconverter-common ({exc.name} is missing): "
            "pip install 'edgefleet[variants]'",
            EXIT_USAGE,
        ) from None
    return onnx, onnxruntime, float16, (quantize_dynamic, QuantType)


def check_fp32(onnx: Any, model: Any, path: Path) -> None:
    """The model's floating-point weights are float32 (the base every variant is made from)."""
    kinds = {init.data_type for init in model.graph.initializer}
    other = kinds & {onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
    if other or onnx.TensorProto.FLOAT not in kinds:
        raise VariantsError(f"{path}: not an fp32 model (its weights must be float32)")


def write_variant(src: Path, precision: str, target: Path) -> None:
    """Write ``src`` (fp32) at ``precision`` to ``target``."""
    onnx, _, float16, (quantize_dynamic, quant_type) = _imports()
    tmp = target.with_name(f".{target.name}.tmp")
    if precision == "int8":
        quantize_dynamic(str(src), str(tmp), weight_type=quant_type.QInt8)
    elif precision == "fp16":
        model = onnx.load(str(src))
        with warnings.catch_warnings():  # weights below fp16's range become its smallest: known
            warnings.simplefilter("ignore", UserWarning)
            converted = float16.convert_float_to_float16(model, keep_io_types=True)
        onnx.save(converted, str(tmp))
    else:
        raise VariantsError(f"--precision: {precision!r} is not one of {', '.join(VARIANTS)}")
    tmp.replace(target)


def build_variants(
    model: Path,
    *,
    precisions: tuple[str, ...] = VARIANTS,
    out: Path | None = None,
    validation: Path | None = None,
    sample_input: Path | None = None,
) -> dict[str, Any]:
    """Write the variants and measure them; the report (``-o json`` prints it)."""
    onnx, ort, _, _ = _imports()
    if not model.is_file():
        raise VariantsError(f"{model}: no such file")
    try:
        loaded = onnx.load(str(model))
    except Exception as exc:  # onnx's DecodeError and friends
        raise VariantsError(f"{model}: not an ONNX model: {exc}") from None
    check_fp32(onnx, loaded, model)
    folder = out or model.parent
    folder.mkdir(parents=True, exist_ok=True)
    if validation is None and (model.parent / VALIDATION_FILE).is_file():
        validation = model.parent / VALIDATION_FILE
    files = {BASE_PRECISION: model}
    for precision in precisions:
        target = folder / variant_file_name(model.name, precision)
        write_variant(model, precision, target)
        files[precision] = target
    sessions = {
        p: ort.InferenceSession(str(f), providers=["CPUExecutionProvider"])
        for p, f in files.items()
    }
    if validation is not None:
        measured, figures = _on_validation(sessions, validation)
    elif sample_input is not None:
        measured, figures = _on_inputs(sessions, sample_input)
    else:
        measured, figures = {"file": "", "metric": "accuracy", "samples": 0}, {}
    return {
        "model": str(model),
        "measuredOn": measured,
        "variants": [
            {
                "precision": p,
                "file": str(f),
                "bytes": f.stat().st_size,
                "sha256": hashlib.sha256(f.read_bytes()).hexdigest(),
                **figures.get(p, {}),
            }
            for p, f in files.items()
        ],
    }


def _on_validation(
    sessions: dict[str, Any], path: Path
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    from edgefleet.validationsets import evaluate

    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    results = {p: evaluate(s, str(path), sha) for p, s in sessions.items()}
    base = results[BASE_PRECISION]
    if "accuracy" not in base:
        raise VariantsError(f"{path}: {base['reason']}: {base['message']}")
    figures: dict[str, dict[str, Any]] = {}
    for p, r in results.items():
        if "accuracy" not in r:
            raise VariantsError(f"{p} variant on {path}: {r['reason']}: {r['message']}")
        figures[p] = {
            "accuracy": r["accuracy"],
            "accuracyChange": r["accuracy"] - base["accuracy"],
        }
    measured = {"file": str(path), "metric": "accuracy", "samples": base["samples"]}
    return measured, figures


def _on_inputs(
    sessions: dict[str, Any], path: Path
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (ValueError, OSError) as exc:
        raise VariantsError(f"--input {path}: not an .npz archive of arrays: {exc}") from None
    base = sessions[BASE_PRECISION]
    inputs = base.get_inputs()
    feeds: dict[str, Any] = {}
    for spec in inputs:
        key = spec.name if spec.name in arrays else "inputs" if len(inputs) == 1 else spec.name
        if key not in arrays:
            raise VariantsError(f"--input {path}: no array {spec.name!r} (or inputs)")
        feeds[spec.name] = np.ascontiguousarray(arrays[key], dtype=np.float32)
    n = len(next(iter(feeds.values())))
    if not 0 < n <= MAX_INPUT_SAMPLES:
        raise VariantsError(f"--input {path}: 1 to {MAX_INPUT_SAMPLES} samples, got {n}")
    batched = all(s.shape and not isinstance(s.shape[0], int) for s in inputs)

    def outputs(session: Any) -> Any:
        if batched:
            return np.asarray(session.run(None, feeds)[0], dtype=np.float32)
        rows = [session.run(None, {k: a[i : i + 1] for k, a in feeds.items()})[0] for i in range(n)]
        return np.concatenate([np.asarray(r, dtype=np.float32) for r in rows])

    reference = outputs(base)
    figures: dict[str, dict[str, Any]] = {}
    for p, session in sessions.items():
        got = outputs(session)
        agree = got.reshape(n, -1).argmax(axis=1) == reference.reshape(n, -1).argmax(axis=1)
        figures[p] = {
            "agreement": float(agree.mean()),
            "accuracyChange": float(agree.mean()) - 1.0,
            "maxAbsDiff": float(np.abs(got - reference).max()),
        }
    return {"file": str(path), "metric": "agreement with fp32", "samples": n}, figures
