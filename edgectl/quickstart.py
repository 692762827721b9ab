"""``edgectl quickstart``: the main job on one machine, end to end.

Builds a small model, makes a publisher key and a trust root, signs the model, lays out a
manifests directory with the example ModelDeployment, starts ``edged run`` on it (with
``trust.rootFile`` set, so the model is verified before it is used), waits until the model is
ready, sends an Open Inference Protocol request over ``infer.sock`` and checks the answer
against ONNX Runtime called directly, shows ``edged status``, then stops edged with SIGTERM
(graceful drain).
"""

from __future__ import annotations

import sys
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from edgefleet.devicestatus import fetch_status, render_status, send_request
from edgefleet.inference import infer
from edgefleet.launching import LaunchError, start_edged

EXAMPLES = "examples"
"""edgectl's package data: the quickstart's ModelDeployments."""


def packaged_example(name: str) -> Traversable:
    """A manifest shipped with edgectl (``deployment.yaml``, ``fleet-deployment.yaml``): found
    in the installed package as well as in a checkout."""
    return files("edgectl") / EXAMPLES / name


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


def run_quickstart(workdir: Path, example: Traversable, *, keep_running: bool = False) -> int:
    import numpy as np

    from edgefleet.demo import TINY_MLP, build_mlp

    workdir = workdir.resolve()
    manifests = workdir / "manifests"
    data = workdir / "edged"
    manifests.mkdir(parents=True, exist_ok=True)
    (manifests / "deployment.yaml").write_bytes(example.read_bytes())
    model = build_mlp(manifests / "model.onnx", TINY_MLP, seed=7)
    print(f"1. built a {'-'.join(map(str, TINY_MLP))} MLP: {model}")
    config = _sign_demo(workdir, model)
    print(f"2. manifests directory: {manifests}")
    log_path = workdir / "edged.log"
    edged = start_edged(data, manifests=manifests, config=config, log=log_path)
    print(f"3. started edged (pid {edged.pid}), log: {log_path}")
    try:
        try:
            edged.wait_ready(90)
        except LaunchError:
            print(f"edged did not become ready; see {log_path}", file=sys.stderr)
            return 1
        infer_sock = edged.inference_socket
        status, meta, _ = send_request(infer_sock, "GET", "/v2/models/demo-classifier")
        print(f"4. model metadata ({status}): {meta.decode()}")
        x = np.random.default_rng(0).standard_normal((1, TINY_MLP[0])).astype(np.float32)
        status, reply = infer(infer_sock, "demo-classifier", {"input": x})
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
        print("   " + render_status(fetch_status(edged.status_socket)).replace("\n", "\n   "))
        if keep_running:
            print(f"edged keeps running (pid {edged.pid}); stop it with: kill {edged.pid}")
        return 0 if ok else 1
    finally:
        if not keep_running and edged.running():
            code = edged.stop(30)
            how = "on SIGTERM" if code >= 0 else "by SIGKILL: it did not stop on SIGTERM in 30 s"
            print(f"7. edged stopped {how} (exit code {code})")
