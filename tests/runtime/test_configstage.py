"""The worker's processing stage (edged.runtime.configstage) on a real ONNX Runtime session, and
in a real worker process: the ModelConfig's processing changes the answers and the validation
set's accuracy, a change is taken without a restart, and a config that does not fit the model
is refused with its reason while the previous one stays in force."""

from __future__ import annotations

import hashlib
import io
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
import pytest
from workerprocess import Worker, launch_spec

from edged.runtime.configstage import ConfigStage, ConfigUnfit
from edged.runtime.framing import HEADER, NO_HEADER_LENGTH, RESULT_PREFIX, U32, FrameType
from edged.runtime.launching import SandboxSpec
from edged.runtime.tensors import spec_from_ort
from edged.runtime.validating import evaluate
from edged.state.modelconfigs import ConfigVolumes
from edgefleet.api.modelconfigs import config_digest
from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.modelprocessing import PROCESSING_KEY

X = np.random.default_rng(0).standard_normal((20, 64)).astype(np.float32)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mlp(tmp_path_factory.mktemp("m") / "m.onnx", TINY_MLP, seed=3)


@pytest.fixture
def session(model_path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])


def doc(processing: dict[str, Any] | None, **data: Any) -> dict[str, Any]:
    if processing is not None:
        data[PROCESSING_KEY] = processing
    return {"data": data, "files": {}}


def stage_of(
    session: ort.InferenceSession, volumes: ConfigVolumes, evaluating: Any = None
) -> ConfigStage:
    inputs = {n.name: spec_from_ort(n) for n in session.get_inputs()}
    outputs = [spec_from_ort(n) for n in session.get_outputs()]
    return ConfigStage(session, str(volumes.config_path("w")), inputs, outputs, evaluating)


def raw(session: ort.InferenceSession, x: np.ndarray) -> np.ndarray:
    return np.asarray(session.run(["logits"], {"input": x})[0])


def test_the_answers_follow_the_config_and_a_change_needs_no_restart(
    session: ort.InferenceSession, tmp_path: Path
) -> None:
    volumes = ConfigVolumes(tmp_path)
    volumes.ensure("w")
    stage = stage_of(session, volumes)
    stage.start()
    assert stage.report() == {"digest": ""}
    assert np.array_equal(stage.run(["logits"], {"input": X})[0], raw(session, X))  # no config

    # input normalisation: (x * scale - mean) / std
    norm = {"inputs": {"input": {"scale": 2.0, "mean": 1.0, "std": 4.0}}}
    volumes.write("w", doc(norm, site="a"), None)
    stage.refresh()
    assert stage.digest == config_digest(doc(norm, site="a"))
    assert np.allclose(stage.run(["logits"], {"input": X})[0], raw(session, (X * 2 - 1) / 4))

    # the output: its classes remapped, then a threshold
    order = list(range(10))[::-1]
    post = {"outputs": {"logits": {"classMap": order, "threshold": 0.1, "below": -1.0}}}
    volumes.write("w", doc(post), None)
    stage.refresh()
    want = raw(session, X)[:, order]
    want = np.where(want < 0.1, np.float32(-1.0), want)
    got = stage.run(["logits"], {"input": X})[0]
    assert got.dtype == np.float32 and np.array_equal(got, want)

    # the config removed: the model alone again
    volumes.clear("w")
    stage.refresh()
    assert stage.digest == "" and np.array_equal(stage.run(None, {"input": X})[0], raw(session, X))


UNFIT = [
    ({"inputs": {"image": {"scale": 2}}}, "processing input 'image': the model has no such input"),
    ({"inputs": {"input": {"mean": [1, 2, 3]}}}, "mean has 3 values, the input has 64 channels"),
    ({"inputs": {"input": {"mean": [1, 2], "channelAxis": 2}}}, "channelAxis 2 is not an axis"),
    ({"outputs": {"scores": {"threshold": 1}}}, "processing output 'scores': the model has no"),
    ({"outputs": {"logits": {"classMap": [0, 1]}}}, "classMap must list 10 classes of 0 to 9"),
    ({"outputs": {"logits": {"classMap": [10] * 10}}}, "classMap must list 10 classes"),
]


@pytest.mark.parametrize(("processing", "says"), UNFIT)
def test_a_config_that_does_not_fit_the_model_is_refused_and_the_previous_stays(
    session: ort.InferenceSession, tmp_path: Path, processing: dict[str, Any], says: str
) -> None:
    volumes = ConfigVolumes(tmp_path)
    good = doc({"outputs": {"logits": {"threshold": 0.0}}})
    volumes.write("w", good, None)
    stage = stage_of(session, volumes)
    stage.start()
    kept = stage.run(["logits"], {"input": X})[0]

    volumes.write("w", doc(processing), None)
    stage.refresh()
    report = stage.report()
    assert report["digest"] == config_digest(good)  # still in force
    assert report["refused"] == config_digest(doc(processing))
    assert says in report["error"], report
    assert np.array_equal(stage.run(["logits"], {"input": X})[0], kept)

    volumes.write("w", doc(None, fixed=True), None)  # fixed: in force, no error any more
    stage.refresh()
    assert stage.report() == {"digest": config_digest(doc(None, fixed=True))}

    # a worker starting with a config that does not fit: it does not start
    volumes.write("w", doc(processing), None)
    with pytest.raises(ConfigUnfit, match="processing"):
        stage_of(session, volumes).start()


def validation_set(tmp_path: Path, session: ort.InferenceSession) -> tuple[str, str]:
    buf = io.BytesIO()
    np.savez(buf, inputs=X, labels=raw(session, X).argmax(axis=1))
    path = tmp_path / "validation.npz"
    path.write_bytes(buf.getvalue())
    return str(path), hashlib.sha256(buf.getvalue()).hexdigest()


def test_the_validation_set_is_evaluated_again_with_each_config(
    session: ort.InferenceSession, tmp_path: Path
) -> None:
    path, sha = validation_set(tmp_path, session)
    volumes = ConfigVolumes(tmp_path / "configs")
    volumes.ensure("w")
    stage = stage_of(session, volumes, lambda s: evaluate(s, path, sha))
    stage.start()
    assert stage.report() == {"digest": "", "validationDigest": ""}
    assert evaluate(stage, path, sha)["accuracy"] == 1.0  # the model alone: its own labels

    # classes reversed: the arg-max moves, the accuracy falls
    harmful = doc({"outputs": {"logits": {"classMap": list(range(10))[::-1]}}})
    volumes.write("w", harmful, None)
    stage.refresh()
    thread = stage._validating
    assert thread is not None
    thread.join(60)
    report = stage.report()
    assert report["validationDigest"] == config_digest(harmful)
    assert report["validation"]["accuracy"] < 0.5, report

    # changes while one evaluates: the last config is always evaluated in the end
    for i in range(5):
        volumes.write("w", doc({"outputs": {"logits": {"threshold": float(i)}}}), None)
        stage.refresh()
    last = config_digest(doc({"outputs": {"logits": {"threshold": 4.0}}}))
    deadline = time.monotonic() + 60
    while stage.report().get("validationDigest") != last and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stage.report()["validationDigest"] == last
    assert stage._validating is None or stage._validating.join(60) is None


def _infer(req_id: int, x: np.ndarray) -> bytes:
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32"}
    body = orjson.dumps({"inputs": [{**tensor, "data": x.ravel().tolist()}]})
    payload = U32.pack(NO_HEADER_LENGTH) + body
    return HEADER.pack(len(payload), FrameType.INFER, req_id) + payload


def _ask(worker: Worker, req_id: int, frame: bytes) -> tuple[int, bytes]:
    worker.sock.sendall(frame)
    while True:
        ftype, rid, payload = worker.read_frame(60)
        if rid == req_id:
            return ftype, payload


def _answer(worker: Worker, req_id: int, x: np.ndarray) -> np.ndarray:
    ftype, payload = _ask(worker, req_id, _infer(req_id, x))
    assert ftype == FrameType.RESULT
    status, _ = RESULT_PREFIX.unpack_from(payload, 0)
    body = orjson.loads(payload[RESULT_PREFIX.size :])
    assert status == 200, body
    (out,) = body["outputs"]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def _pong(worker: Worker, req_id: int) -> dict[str, Any]:
    ftype, payload = _ask(worker, req_id, HEADER.pack(0, FrameType.PING, req_id))
    assert ftype == FrameType.PONG
    return dict(orjson.loads(payload))


def test_a_real_worker_serves_with_its_config_and_takes_a_change_without_a_restart(
    model_path: Path, session: ort.InferenceSession, tmp_path: Path
) -> None:
    from dataclasses import replace

    volumes = ConfigVolumes(tmp_path / "configs")
    first = doc({"outputs": {"logits": {"threshold": 0.0}}}, site="a")
    volumes.write("w", first, None)
    path, sha = validation_set(tmp_path, session)
    digest = hashlib.sha256(model_path.read_bytes()).hexdigest()
    spec = replace(
        launch_spec(model_path, digest, SandboxSpec()),
        config_dir=str(volumes.workload_dir("w")),
        validate=True,
        validation_path=path,
        validation_sha256=sha,
    )
    w = Worker(spec)
    try:
        kind, meta = w.first_frame()
        assert kind == "ready", meta
        assert meta["config"] == {
            "digest": config_digest(first),
            "validationDigest": config_digest(first),
        }
        assert meta["validation"]["accuracy"] == 1.0  # the threshold keeps the arg-max
        x = X[:2]
        assert np.array_equal(_answer(w, 1, x), np.maximum(raw(session, x), 0))

        # a change: taken by the same process (a PING looks at it), the answers follow
        second = doc({"outputs": {"logits": {"classMap": list(range(10))[::-1]}}})
        volumes.write("w", second, None)
        pong = _pong(w, 2)
        assert pong["config"]["digest"] == config_digest(second)
        assert np.array_equal(_answer(w, 3, x), raw(session, x)[:, ::-1])

        def revalidated() -> dict[str, Any]:
            for i in range(600):
                got = _pong(w, 100 + i)["config"]
                if got.get("validationDigest") == config_digest(second):
                    return dict(got)
                import time

                time.sleep(0.05)
            raise AssertionError("never evaluated again")

        assert revalidated()["validation"]["accuracy"] < 0.5

        # a config that does not fit: refused, said in the PONG, the previous one serves
        bad = doc({"inputs": {"pixels": {"scale": 2}}})
        volumes.write("w", bad, None)
        got = _pong(w, 4)["config"]
        assert got["digest"] == config_digest(second) and got["refused"] == config_digest(bad)
        assert "the model has no such input" in got["error"]
        assert np.array_equal(_answer(w, 5, x), raw(session, x)[:, ::-1])
        assert w.proc.poll() is None  # the same process throughout
    finally:
        w.close()


def test_the_bound_is_the_kinds() -> None:
    from edged.runtime import configstage
    from edgefleet.api import modelconfigs

    assert configstage.MAX_MERGED_BYTES == modelconfigs.MAX_MERGED_BYTES
