"""A real ``edged run`` process and a small client for its sockets, for scenario tests.

Started, awaited and stopped by :mod:`edgefleet.launching`, the helper the quickstart and the
benchmarks use too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
from polltesting import wait_for  # noqa: F401 - re-exported: the one polling helper

from edgefleet.devicestatus import send_request
from edgefleet.inference import infer_path, infer_request_body
from edgefleet.launching import LaunchedEdged, LaunchError, start_edged

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


def python_without_sys_admin(tmp_path: Path) -> Path | None:
    """A "python" that runs this one with CAP_SYS_ADMIN out of its bounding set (an edged
    without it has no fanotify open watch), or None where setpriv cannot drop it."""
    probe = subprocess.run(
        ["setpriv", "--bounding-set=-sys_admin", "true"], check=False, capture_output=True
    )
    if probe.returncode != 0:
        return None
    wrapper = tmp_path / "python-no-sys-admin"
    run = f'exec setpriv --bounding-set=-sys_admin -- {sys.executable} "$@"'
    wrapper.write_text(f"#!/bin/sh\n{run}\n")
    wrapper.chmod(0o755)
    return wrapper


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
        self.launched: LaunchedEdged | None = None  # the latest process: start() again after a stop
        self.python: Path | None = None  # the interpreter edged runs on (None: this one)
        # its environment and working directory (None: this test's; a previous release's
        # come from tests/releasetesting.py)
        self.env: dict[str, str] | None = None
        self.cwd: Path | None = None
        self.all_pids: set[int] = set()

    def start(self, *extra: str) -> Edged:
        config = None
        if "--config" not in extra:
            config = self.log_path.with_suffix(".toml")
            config.write_text(self.config_text)
        self.launched = start_edged(
            self.data,
            manifests=self.manifests,
            config=config,
            log=self.log_path,
            args=extra,
            python=self.python,
            env=self.env,
            cwd=self.cwd,
        )
        self.all_pids.add(self.launched.pid)
        return self

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.launched.process if self.launched is not None else None

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
        return send_request(
            sock or self.infer_sock, method, path, body, headers=headers, timeout=timeout
        )

    def infer(self, model: str, x: Any, *, version: str | None = None) -> tuple[int, Any]:
        body = infer_request_body({"input": x})
        status, out, _ = self.request("POST", infer_path(model, version), body)
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
        assert self.launched is not None
        try:
            self.launched.wait_ready(timeout)
        except LaunchError as exc:
            raise AssertionError(str(exc)) from None
        self.status()

    def worker_pids(self, name: str) -> list[int]:
        return [r["pid"] for r in self.workload(name)["replicas"] if r["pid"]]

    def probe_results(self) -> list[Any]:
        """What each worker's test probe reported (``EDGEFLEET_TEST_WORKER_PROBE``): the
        worker writes it to its stderr, which edged forwards into its own log as a
        "worker output" record (edged/runtime/output.py)."""
        found = []
        for line in self.log_path.read_text().splitlines():
            if '"worker output"' not in line or "worker test probe: " not in line:
                continue
            text = str(json.loads(line).get("line", ""))
            if text.startswith("worker test probe: "):
                found.append(json.loads(text.split(": ", 1)[1]))
        return found

    def logs(self) -> str:
        try:
            return self.log_path.read_text()[-8000:]
        except OSError:
            return ""

    def log_records(self, event: str) -> list[dict[str, Any]]:
        """edged's log records of ``event``, parsed (lines that are not JSON skipped)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        found = []
        marker = f'"event":"{event}"'
        for line in text.splitlines():
            if marker in line:
                try:
                    found.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    continue
        return found

    def refusals(self) -> list[dict[str, Any]]:
        """The artifacts edged has logged refusing (workload, reason, message...). Its status
        shows a refusal only while the revision is desired, and a hub rolls back at once a
        revision that its only device refused, so a test that polls status can miss it."""
        return self.log_records("artifact refused")

    def refused(self, reason: str) -> bool:
        return any(r.get("reason") == reason for r in self.refusals())

    def terminate(self, timeout: float = 40.0) -> int:
        """SIGTERM; SIGKILL after ``timeout`` (then the exit code is -9, which tests refuse)."""
        assert self.launched is not None
        return self.launched.stop(timeout)

    def kill9(self) -> None:
        assert self.launched is not None
        self.status()
        self.launched.kill()
