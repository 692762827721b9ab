"""``edgectl quickstart``: the main job on one machine, end to end.

Builds a small model, makes a publisher key and a trust root, signs the model, lays out a
manifests directory with the example ModelDeployment, starts ``edged run`` on it (with
``trust.rootFile`` set, so the model is verified before it is used), waits until the model is
ready, sends an Open Inference Protocol request over ``infer.sock`` and checks the answer
against ONNX Runtime called directly, shows ``edged status``, then stops edged with SIGTERM
(graceful drain).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from edgefleet.devicestatus import UnixHTTPConnection, fetch_status, render_status


def _request(sock: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = UnixHTTPConnection(sock, timeout=10)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def infer_request(sock: str, model: str, x: Any) -> tuple[int, Any]:
    """POST an Open Inference Protocol request with input ``x`` (float32) to ``model``."""
    body = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "data": x.ravel().tolist(),
                }
            ]
        }
    )
    status, out = _request(sock, "POST", f"/v2/models/{model}/infer", body)
    return status, orjson.loads(out)


def _wait_ready(sock: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            status, _ = _request(sock, "GET", "/v2/health/ready")
            if status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def _sign_demo(workdir: Path, model: Path) -> Path:
    """A publisher key, a trust root listing it, signed metadata for the model, and an
    edged.toml pointing at the root: the demo runs fully signed (docs/trust.md)."""
    from edgefleet.trust.signing import create_root, generate_key_pair, sign_artifact

    keys = workdir / "keys"
    keys.mkdir(exist_ok=True, mode=0o700)
    kid = generate_key_pair(keys / "publisher")
    root = workdir / "trust-root.json"
    create_root(
        root_keys=[keys / "publisher.key"], artifact_keys=[keys / "publisher.pub"], out=root
    )
    metadata, _ = sign_artifact(
        model, name="demo-classifier", version="1.0.0", keys=[keys / "publisher.key"]
    )
    config = workdir / "edged.toml"
    config.write_text(f'[trust]\nrootFile = "{root}"\n')
    print(f"   signed it with publisher key {kid[:16]}: {metadata.name}; trust root: {root}")
    return config


def run_quickstart(workdir: Path, example: Path, *, keep_running: bool = False) -> int:
    import numpy as np

    from edgefleet.demo import TINY_MLP, build_mlp

    workdir = workdir.resolve()
    manifests = workdir / "manifests"
    data = workdir / "edged"
    manifests.mkdir(parents=True, exist_ok=True)
    shutil.copy(example, manifests / "deployment.yaml")
    model = build_mlp(manifests / "model.onnx", TINY_MLP, seed=7)
    print(f"1. built a {'-'.join(map(str, TINY_MLP))} MLP: {model}")
    config = _sign_demo(workdir, model)
    print(f"2. manifests directory: {manifests}")
    log_path = workdir / "edged.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "edged",
                "run",
                "--data-dir",
                str(data),
                "--manifests",
                str(manifests),
                "--config",
                str(config),
            ],
            stdout=log,
            stderr=log,
        )
    print(f"3. started edged (pid {proc.pid}), log: {log_path}")
    infer = str(data / "infer.sock")
    try:
        if not _wait_ready(infer, proc, 90):
            print(f"edged did not become ready; see {log_path}", file=sys.stderr)
            return 1
        status, meta = _request(infer, "GET", "/v2/models/demo-classifier")
        print(f"4. model metadata ({status}): {meta.decode()}")
        x = np.random.default_rng(0).standard_normal((1, TINY_MLP[0])).astype(np.float32)
        status, reply = infer_request(infer, "demo-classifier", x)
        if status != 200:
            print(f"inference failed ({status}): {reply}", file=sys.stderr)
            return 1
        got = np.asarray(reply["outputs"][0]["data"], dtype=np.float32)
        import onnxruntime as ort

        direct = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        want = direct.run(None, {"input": x})[0].ravel()
        ok = bool(np.allclose(got, want, rtol=1e-5, atol=1e-5))
        print(f"5. POST /v2/models/demo-classifier/infer -> {status}, logits {np.round(got, 3)}")
        print(f"   class {int(got.argmax())}; matches ONNX Runtime called directly: {ok}")
        print("6. edged status:")
        print("   " + render_status(fetch_status(str(data / "edged.sock"))).replace("\n", "\n   "))
        if keep_running:
            print(f"edged keeps running (pid {proc.pid}); stop it with: kill {proc.pid}")
            return 0 if ok else 1
        return 0 if ok else 1
    finally:
        if not keep_running and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(30)
                print(f"7. edged stopped on SIGTERM (exit code {code})")
            except subprocess.TimeoutExpired:
                proc.kill()
