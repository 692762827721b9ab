"""Precision variants and power schedules with a real edged and real ONNX Runtime workers.

The artifact holds the model at fp32 plus fp16 and int8 variants built with the ecosystem's
tools (``edgectl models variants``: onnxconverter-common, onnxruntime's quantization), each
file signed in the same metadata. A ``power.schedule`` window that opens during the test
switches the workload to the fp16 variant with zero failed requests from a client looping
throughout, and closing it switches back; a low battery switches to int8, mains back. The
local time and the battery are read from files the test writes (edged's test-only seams
``EDGED_TEST_LOCAL_TIME`` and ``EDGED_TEST_BATTERY``), so the window opens without waiting
for the wall clock. A deployment asking for a precision its artifact lacks keeps serving the
model file and says why.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from harness import Edged, wait_for

from edgectl.variants import build_variants
from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.trust.signing import create_root, generate_key_pair, sign_artifact

pytestmark = pytest.mark.scenario

X = np.linspace(-1, 1, TINY_MLP[0], dtype=np.float32).reshape(1, -1)

SCHEDULED = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: mlp}
spec:
  model: {name: mlp, version: "1.0.0", path: mlp.onnx}
  runtime: {maxBatchSize: 4, executionProviders: [CPUExecutionProvider]}
  replicas: {perDevice: 1}
  probes: {readiness: {periodSeconds: 1}}
  power:
    schedule: [{from: "01:00", to: "02:00", precision: fp16}]
    lowBattery: {below: 20%, precision: int8}
"""

LACKING = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: plain}
spec:
  model: {name: plain, version: "1.0.0", path: plain.onnx}
  runtime: {precision: int8, executionProviders: [CPUExecutionProvider]}
  replicas: {perDevice: 1}
"""


def outputs(model: Path) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"input": X})[0], dtype=np.float32).ravel()


class Client:
    """Sends one request after another until stopped; counts failures and which variant's
    answer each was."""

    def __init__(self, e: Edged, references: dict[str, np.ndarray]) -> None:
        self.e = e
        self.references = references
        self.failed: list[str] = []
        self.answered: dict[str, int] = dict.fromkeys(references, 0)
        self.last = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Client:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status, doc = self.e.infer("mlp", X)
            except OSError as exc:
                self.failed.append(f"{type(exc).__name__}: {exc}")
                continue
            if status != 200:
                self.failed.append(f"{status}: {doc}")
                continue
            got = np.asarray(doc["outputs"][0]["data"], dtype=np.float32)
            diffs = {p: float(np.abs(got - ref).max()) for p, ref in self.references.items()}
            self.last = min(diffs, key=lambda p: diffs[p])
            self.answered[self.last] += 1


def test_a_power_window_switches_to_the_fp16_variant_and_back_with_no_failed_request(
    tmp_path: Path, edged_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    model = manifests / "mlp.onnx"
    build_mlp(model, TINY_MLP, seed=3)
    report = build_variants(model)
    files = {v["precision"]: Path(v["file"]) for v in report["variants"]}
    assert set(files) == {"fp32", "fp16", "int8"}
    assert files["fp16"].name == "mlp.fp16.onnx" and files["int8"].name == "mlp.int8.onnx"
    references = {p: outputs(files[p]) for p in ("fp32", "fp16", "int8")}
    assert float(np.abs(references["fp32"] - references["fp16"]).max()) > 0  # told apart

    generate_key_pair(tmp_path / "publisher")
    key = tmp_path / "publisher.key"
    root = tmp_path / "trust-root.json"
    create_root(root_keys=[key], artifact_keys=[tmp_path / "publisher.pub"], out=root)
    sign_artifact(
        model, name="mlp", version="1.0.0", keys=[key], extras=[files["fp16"], files["int8"]]
    )
    plain = manifests / "plain.onnx"
    build_mlp(plain, TINY_MLP, seed=4)
    sign_artifact(plain, name="plain", version="1.0.0", keys=[key])
    (manifests / "mlp.yaml").write_text(SCHEDULED)
    (manifests / "plain.yaml").write_text(LACKING)

    clock = tmp_path / "local-time"

    def local_time(text: str) -> None:
        tmp = clock.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(clock)

    battery = tmp_path / "battery"

    def battery_at(text: str) -> None:
        tmp = battery.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(battery)

    local_time("12:00")
    battery_at("100 plugged")
    monkeypatch.setenv("EDGED_TEST_LOCAL_TIME", str(clock))
    monkeypatch.setenv("EDGED_TEST_BATTERY", str(battery))
    config = f'[trust]\nrootFile = "{root}"\n[reconcile]\nresyncPeriod = "500ms"\n'
    e: Edged = edged_factory(manifests, config=config).start()
    e.wait_ready(120)

    def serving(precision: str) -> bool:
        w = e.workload("mlp")
        return (
            w["precision"]["serving"] == precision
            and w["phase"] == "Running"
            and all(r["sha256"] == sha[precision] for r in w["replicas"])
        )

    sha = {v["precision"]: v["sha256"] for v in report["variants"]}
    wait_for(lambda: serving("fp32"), 60, "fp32 served outside the window")
    assert e.workload("mlp")["precision"]["variants"] == ["fp16", "fp32", "int8"]

    with Client(e, references) as client:
        wait_for(lambda: client.answered["fp32"] > 20, 60, "answers from fp32")
        local_time("01:30")  # the window opens
        wait_for(lambda: serving("fp16"), 120, "the fp16 variant serving")
        wait_for(lambda: client.answered["fp16"] > 20 and client.last == "fp16", 60, "fp16")
        local_time("02:00")  # "to" is exclusive: the window closes
        wait_for(lambda: serving("fp32"), 120, "back to fp32")
        before = client.answered["fp32"]
        wait_for(lambda: client.answered["fp32"] > before + 20, 60, "fp32 answers again")
        battery_at("10 on-battery")  # below lowBattery's 20%: the int8 variant
        wait_for(lambda: serving("int8"), 120, "the int8 variant on a low battery")
        wait_for(lambda: client.answered["int8"] > 20 and client.last == "int8", 60, "int8")
        assert "on battery at 10%" in e.logs()
        battery_at("10 plugged")  # on mains again
        wait_for(lambda: serving("fp32"), 120, "fp32 on mains")
    assert client.failed == [], client.failed[:5]
    logs = e.logs()
    assert "precision chosen" in logs and "PowerWindow" in logs

    # the artifact without an int8 variant: the model file serves, and the device says why
    plain_status = e.workload("plain")
    assert plain_status["precision"]["serving"] == "fp32"
    assert plain_status["readyReplicas"] == 1
    cond = next(c for c in plain_status["conditions"] if c["type"] == "PrecisionAvailable")
    assert (cond["status"], cond["reason"]) == ("False", "VariantMissing")
    assert "no variant for int8" in cond["message"]
    assert "precision variant missing" in logs
    assert e.infer("plain", X)[0] == 200
    assert e.terminate() == 0
