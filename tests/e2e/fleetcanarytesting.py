"""Canary traffic for the canary scenarios: labelled inputs, pushing a model version with its
validation labels, and a thread that keeps inference traffic going to every device."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
from fleet import HubProcess
from harness import Edged

from edgefleet.inference import infer_path, infer_request_body

INPUTS = np.random.default_rng(0).integers(0, 10, (200, 64)).astype(np.float32)


def labels_of(model: Path) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"input": INPUTS})[0]).argmax(axis=1)


def push(hub: HubProcess, tmp_path: Path, version: str, model: Path, labels: np.ndarray) -> None:
    """Push ``model`` with a validation set: INPUTS and ``labels``."""
    extra = tmp_path / f"v{version}" / "validation.npz"
    extra.parent.mkdir()
    with extra.open("wb") as f:
        np.savez(f, inputs=INPUTS, labels=labels)
    out = hub.edgectl(
        "models", "push", str(model), "--name", "det", "--version", version, "--extra", str(extra)
    )
    assert "pushed" in out.stdout, out.stdout + out.stderr


class Traffic:
    """Infer requests to every device, one after another, until stopped; every other request
    has a first value (50) that the erring model cannot take."""

    def __init__(self, devices: list[Edged]) -> None:
        self.devices = devices
        self.stop = threading.Event()
        self.answers: dict[int, int] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        good = infer_request_body({"input": INPUTS[:1].tolist()})
        bad = infer_request_body({"input": [[50.0] * 64]})
        i = 0
        while not self.stop.is_set():
            for e in self.devices:
                try:
                    code, _, _ = e.request("POST", infer_path("det"), bad if i % 2 else good)
                except OSError:
                    code = 0
                self.answers[code] = self.answers.get(code, 0) + 1
            i += 1
            self.stop.wait(0.02)

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
