"""One model name per device, end to end (issue 29 item 3): a real ``hub serve``, a real
enrolled ``edged run`` with a static manifests directory beside the hub, real ONNX Runtime
workers, real traffic on the inference socket.

* the hub refuses a second deployment of a model name that could land on a device the first
  is on, naming both and the model; one whose placement is disjoint is accepted;
* a device given one model name by two workloads anyway (a static manifest beside a hub
  deployment, as an older hub could have sent two) serves it from one and says so of the other;
  deleting the one that holds the route leaves the model served by the other, with no failed
  request in between;
* the 503s edged's own router answers (no ready replica) are counted as errors, in the metrics
  and in the workload's status, which is then not Running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for, write_manifest
from metricstesting import series_value

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.inference import infer_path, infer_request_body

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {name}}}
spec:
  model: {{name: det, version: "1.0.0"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  placement: {{nodeSelector: {{site: {site}}}}}
  probes:
    readiness: {{periodSeconds: 1, timeoutSeconds: 1}}
"""
# the static manifest (workload "zeta", model "det") is not signed
DEVICE_CONFIG = SIGNED_DEVICE_CONFIG.replace("[trust]\n", "[trust]\nallowUnsigned = true\n")
X = np.ones((1, 64), dtype=np.float32)


def apply(hub: HubProcess, tmp_path: Path, name: str, site: str) -> Any:
    doc = tmp_path / f"{name}.yaml"
    doc.write_text(DEPLOYMENT.format(name=name, site=site))
    return hub.edgectl("apply", "-f", str(doc), check=False)


def push(hub: HubProcess, tmp_path: Path) -> None:
    path = build_mlp(tmp_path / "det-1.0.0.onnx", TINY_MLP, seed=1)
    out = hub.edgectl("models", "push", str(path), "--name", "det", "--version", "1.0.0")
    assert "pushed" in out.stdout, out.stdout + out.stderr


def test_a_second_deployment_of_a_model_on_the_same_devices_is_refused(
    hub: HubProcess, tmp_path: Path
) -> None:
    push(hub, tmp_path)
    assert apply(hub, tmp_path, "det", "a").returncode == 0
    out = apply(hub, tmp_path, "det-copy", "a")
    assert out.returncode != 0, out.stdout
    said = out.stdout + out.stderr
    assert 'ModelDeployment "det-copy"' in said and 'ModelDeployment "det"' in said, said
    assert 'model "det"' in said and "documents[0].spec.model.name" in said, said
    listed = hub.edgectl("get", "deployments").stdout
    assert "det-copy" not in listed, listed  # nothing applied
    # on other devices (site b) the same model name is fine
    assert apply(hub, tmp_path, "det-b", "b").returncode == 0


class Traffic:
    """Infer requests to ``det``, one after another, until stopped: the answers' codes."""

    def __init__(self, e: Edged) -> None:
        self.e = e
        self.stop = threading.Event()
        self.codes: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = infer_request_body({"input": X.tolist()})
        while not self.stop.is_set():
            try:
                code = self.e.request("POST", infer_path("det"), body)[0]
            except OSError:
                code = 0
            self.codes.append(code)
            self.stop.wait(0.02)

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def answered_by(e: Edged, workload: str, code: str = "200") -> float:
    text = e.request("GET", "/metrics", sock=e.status_sock)[1].decode()
    return series_value(
        text, f'edged_inference_requests_total{{workload="{workload}",code="{code}"}}'
    )


def test_two_workloads_of_one_model_the_route_survives_deleting_either_and_503s_count(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    build_mlp(manifests / "mlp.onnx", TINY_MLP, seed=1)
    static = write_manifest(manifests, name="zeta", model="det")
    data = tmp_path / "dev-a"
    out = enroll(hub, data, "dev-a", {"site": "a"})
    assert out.returncode == 0, out.stdout + out.stderr
    e = edged_factory(manifests, data=data, config=DEVICE_CONFIG.format(absent=tmp_path / "no"))
    e.start()
    push(hub, tmp_path)
    assert apply(hub, tmp_path, "det", "a").returncode == 0

    def both_ready() -> bool:
        ready = {w["name"]: w.get("readyReplicas") for w in e.status()["workloads"]}
        return ready == {"det": 1, "zeta": 1}

    wait_for(both_ready, 90, "dev-a to run det (hub) and zeta (static), both of model det")

    # which workload holds the route: the one whose counter the requests raise
    for _ in range(5):
        assert e.infer("det", X)[0] == 200
    holder = "det" if answered_by(e, "det") >= 5 else "zeta"
    other = "zeta" if holder == "det" else "det"
    assert answered_by(e, other) == 0, "requests of one name went to two workloads"
    standing_by = e.workload(other)
    conflict = [c for c in standing_by["conditions"] if c["type"] == "ModelNameConflict"]
    assert conflict and holder in conflict[0]["message"], standing_by["conditions"]
    assert standing_by["phase"] != "Running"
    assert e.workload(holder)["phase"] == "Running"

    # deleting the workload that holds the route: the other serves, no request fails
    with Traffic(e) as traffic:
        wait_for(lambda: len(traffic.codes) >= 5, 30, "traffic to flow")
        if holder == "zeta":
            static.unlink()
        else:
            hub.edgectl("delete", "deployments", "det")
        wait_for(
            lambda: [w["name"] for w in e.status()["workloads"]] == [other],
            60,
            f"{holder} to be gone from dev-a",
        )
        seen = len(traffic.codes)
        wait_for(lambda: len(traffic.codes) >= seen + 20, 30, "traffic after the deletion")
    failed = [c for c in traffic.codes if c != 200]
    assert not failed, f"{len(failed)} of {len(traffic.codes)} requests failed: {set(failed)}"
    assert answered_by(e, other) >= 20
    assert e.workload(other)["phase"] == "Running"

    # the remaining replica stops answering: edged's router answers 503 and counts it
    pid = e.worker_pids(other)[0]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(
            lambda: e.request("GET", "/v2/models/det/ready")[0] == 503,
            30,
            "the replica to be seen not ready",
        )
        refused = [e.infer("det", X)[0] for _ in range(3)]
    finally:
        with contextlib.suppress(ProcessLookupError):  # the liveness probe may have killed it
            os.kill(pid, signal.SIGCONT)
    assert refused.count(503) >= 1, refused
    assert answered_by(e, other, "503") >= refused.count(503)
    w = e.workload(other)
    assert w["refusedRequests"] >= refused.count(503), w
    serving = [c for c in w["conditions"] if c["type"] == "Serving"]
    assert serving and serving[0]["reason"] == "NoReadyReplica", w["conditions"]
    assert w["phase"] != "Running"
    assert e.terminate() == 0
