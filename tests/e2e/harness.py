"""A real ``edged run`` process and a small client for its sockets, for scenario tests."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from edgefleet.devicestatus import UnixHTTPConnection


def wait_for(cond: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except (OSError, KeyError, IndexError, ValueError) as exc:
            last_exc = exc
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last error: {last_exc})")


MANIFEST = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {name}}}
spec:
  model: {{name: {model}, version: "{version}", path: {path}}}
  runtime: {{maxBatchSize: {batch}, executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: {replicas}}}
  resources: {{cpu: 500m, memory: 1Gi}}
  probes:
    startup: {{timeoutSeconds: 60}}
    readiness: {{periodSeconds: {period}, timeoutSeconds: 1}}
    liveness: {{periodSeconds: {period}, timeoutSeconds: 2}}
"""


def write_manifest(
    directory: Path,
    *,
    name: str = "mlp",
    model: str | None = None,
    version: str = "1.0.0",
    path: str = "mlp.onnx",
    batch: int = 8,
    replicas: int = 1,
    period: float = 1,
    file: str | None = None,
) -> Path:
    target = directory / (file or f"{name}.yaml")
    text = MANIFEST.format(
        name=name,
        model=model or name,
        version=version,
        path=path,
        batch=batch,
        replicas=replicas,
        period=period,
    )
    tmp = target.with_name("." + target.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(target)
    return target


# Tests that are not about trust run with unsigned models allowed and no trust root (the
# machine's /etc/edged/trust-root.json must not leak in); tests/e2e/test_trust.py and the
# quickstart run fully signed.
UNSIGNED_CONFIG = '[trust]\nallowUnsigned = true\nrootFile = "{absent}"\n'


class Edged:
    """One ``edged run`` process and a small client for its two sockets."""

    def __init__(
        self, data: Path, manifests: Path | None, log: Path, config: str | None = None
    ) -> None:
        self.data = data
        self.manifests = manifests
        self.log_path = log
        self.config_text = (
            config
            if config is not None
            else UNSIGNED_CONFIG.format(absent=log.parent / "no-trust-root.json")
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.all_pids: set[int] = set()

    def start(self, *extra: str) -> Edged:
        cmd = [sys.executable, "-m", "edged", "run", "--data-dir", str(self.data)]
        if self.manifests is not None:
            cmd += ["--manifests", str(self.manifests)]
        if "--config" not in extra:
            config = self.log_path.with_suffix(".toml")
            config.write_text(self.config_text)
            cmd += ["--config", str(config)]
        cmd += list(extra)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log)
        self.all_pids.add(self.proc.pid)
        return self

    @property
    def infer_sock(self) -> str:
        return str(self.data / "infer.sock")

    @property
    def status_sock(self) -> str:
        return str(self.data / "edged.sock")

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        sock: str | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 10.0,
    ) -> tuple[int, bytes, dict[str, str]]:
        conn = UnixHTTPConnection(sock or self.infer_sock, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()

    def infer(self, model: str, x: Any, *, version: str | None = None) -> tuple[int, Any]:
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
        prefix = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
        status, out, _ = self.request("POST", prefix + "/infer", body)
        return status, orjson.loads(out)

    def status(self) -> dict[str, Any]:
        _, body, _ = self.request("GET", "/v1/status", sock=self.status_sock)
        doc: dict[str, Any] = orjson.loads(body)
        for w in doc.get("workloads", []):
            for r in w.get("replicas", []):
                if r.get("pid"):
                    self.all_pids.add(r["pid"])
        return doc

    def workload(self, name: str) -> dict[str, Any]:
        for w in self.status()["workloads"]:
            if w["name"] == name:
                return w
        raise KeyError(name)

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"edged exited with {self.proc.returncode}:\n{self.logs()}")
            return self.request("GET", "/v2/health/ready")[0] == 200

        wait_for(ready, timeout, "edged to become ready")
        self.status()

    def worker_pids(self, name: str) -> list[int]:
        return [r["pid"] for r in self.workload(name)["replicas"] if r["pid"]]

    def logs(self) -> str:
        try:
            return self.log_path.read_text()[-8000:]
        except OSError:
            return ""

    def terminate(self, timeout: float = 40.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill9(self) -> None:
        assert self.proc is not None
        self.status()
        self.proc.kill()
        self.proc.wait(10)
