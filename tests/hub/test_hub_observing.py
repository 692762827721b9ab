"""The hub's /metrics, /healthz and /readyz: a real ``hub serve`` process (made by ``hub init``)
with its observability listener on loopback, real edgectl and gRPC calls against it, and the
exposition checked by ``promtool check metrics`` (Debian package ``prometheus``)."""

from __future__ import annotations

import http.client
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import orjson
import pytest
from asynctesting import async_test, eventually
from hubserving import AdminHub, client_credentials, make_hub_dir
from metricstesting import series_value

from edgefleet.launching import LaunchedHub, free_port_pair, start_hub
from edgefleet.v1 import admin_pb2, enrollment_pb2, enrollment_pb2_grpc
from hub.decide.devices import Device, DevicePhase
from hub.initializing import HubPaths
from hub.state import storekeys as objects

EDGECTL = str(Path(sys.executable).with_name("edgectl"))
HUB = str(Path(sys.executable).with_name("hub"))


def _get(port: int, path: str, method: str = "GET") -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read().decode()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LaunchedHub, int, Path]]:
    data = tmp_path_factory.mktemp("observed") / "hub"
    port = free_port_pair()
    address = f"127.0.0.1:{port}"
    subprocess.run(
        [HUB, "init", "--data-dir", str(data), "--hub-address", address],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    metrics_port = free_port_pair()
    while metrics_port in (port - 1, port, port + 1):  # none of them bound yet
        metrics_port = free_port_pair()
    hub = start_hub(
        data,
        listen=address,
        log=data.parent / "hub.log",
        args=["--metrics-listen", f"127.0.0.1:{metrics_port}"],
    )
    try:
        hub.wait_listening(30)
        deadline = time.monotonic() + 30
        while True:
            try:
                if _get(metrics_port, "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (data.parent / "hub.log").read_text()
            time.sleep(0.1)
        yield hub, metrics_port, data
    finally:
        hub.stop()


def _sample(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = "^" + re.escape(name + (f"{{{wanted}}}" if wanted else "")) + r" (\S+)$"
    found = re.search(pattern, text, re.M)
    assert found, f"{name} {labels} not in:\n{text}"
    return float(found[1])


def test_metrics_count_calls_enrollments_and_the_store(
    served: tuple[LaunchedHub, int, Path],
) -> None:
    _, port, data = served
    config = data / "admin.toml"
    for args in (["get", "devices"], ["get", "deployments"], ["tokens", "create"]):
        result = subprocess.run(
            [EDGECTL, "--config", str(config), *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, result.stderr
    paths = HubPaths.of(data)
    hub_port = int(config.read_text().split('"')[1].rsplit(":", 1)[1])
    channel = grpc.secure_channel(f"127.0.0.1:{hub_port + 1}", client_credentials(paths, None))
    with channel:
        stub = enrollment_pb2_grpc.EnrollmentServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as refused:
            stub.Enroll(enrollment_pb2.EnrollRequest(token="abcdef.0123456789abcdef"), timeout=10)
    code = refused.value.code().name  # type: ignore[attr-defined]
    assert code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"), refused.value

    # grpc aio sends an aborted call's status before the handler's coroutine resumes, so
    # the refused enrollment may be counted just after the client has its answer
    deadline = time.monotonic() + 10
    while True:
        status, content_type, text = _get(port, "/metrics")
        if f'hub_enrollments_total{{code="{code}"}}' in text or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    assert _sample(text, "hub_devices", phase="Ready") == 0
    assert _sample(text, "hub_device_streams") == 0
    assert _sample(text, "hub_objects", kind="ModelDeployment") == 0
    list_ok = _sample(
        text, "hub_grpc_requests_total", method="/edgefleet.v1.AdminService/List", code="OK"
    )
    assert list_ok == 2
    assert _sample(text, "hub_enrollments_total", code=code) == 1
    assert _sample(text, "hub_store_operations_total", operation="range", result="ok") >= 2
    assert "hub_grpc_request_duration_seconds_bucket{" in text
    assert "hub_store_operation_duration_seconds_count{" in text
    assert "# TYPE hub_sync_latency_seconds histogram" in text

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/install-system-deps installs prometheus"
    checked = subprocess.run(
        [promtool, "check", "metrics"],
        check=False,
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/healthz", 200),
        ("GET", "/readyz", 200),
        ("HEAD", "/metrics", 200),
        ("POST", "/metrics", 405),
        ("GET", "/", 404),
        ("GET", "/metrics/../x", 404),
    ],
)
def test_health_endpoints(
    served: tuple[LaunchedHub, int, Path], method: str, path: str, status: int
) -> None:
    assert _get(served[1], path, method)[0] == status


def test_the_listener_is_on_loopback_by_default(tmp_path: Path) -> None:
    from hub.config import load_config

    subprocess.run(
        [HUB, "init", "--data-dir", str(tmp_path / "h"), "--hub-address", "hub.example:9443"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    config = load_config(tmp_path / "h" / "hub.toml")
    assert (config.listen, config.metrics_listen) == ("0.0.0.0:9443", "127.0.0.1:9445")


@async_test
async def test_events_rollout_steps_and_placements_are_counted(tmp_path: Path) -> None:
    """An apply places a deployment on the devices that match (hub_placements,
    hub_placement_changes_total), its rollout's steps and every event are counted; a delete
    takes the placements off again. In-process hub (AdminHub): real store, writer, projector."""
    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        for name in ("cam-1", "cam-2"):
            hub.ctx.writer.update(
                Device(name=name, labels={"site": "retail"}, phase=DevicePhase.READY)
            )
        model = objects.ModelRecord("fraud", "2.4.1", "ab" * 32, 1234, b"{signed}", 1.0)
        await hub.ctx.store.put(objects.model_key("fraud", "2.4.1"), objects.dumps(model.to_json()))
        hub.ctx.cache.models[("fraud", "2.4.1")] = model
        doc = {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": "fraud"},
            "spec": {"model": {"name": "fraud", "version": "2.4.1"}, "replicas": {"perDevice": 1}},
        }
        stub = hub.stub(channel)
        await stub.Apply(admin_pb2.ApplyRequest(documents=[orjson.dumps(doc)]))

        async def until(series: str, value: float) -> str:
            def rendered() -> str | None:
                text = hub.ctx.metrics.render()
                return text if series_value(text, series) == value else None

            text: str = await eventually(
                rendered,
                20,
                f"{series} == {value}",
                interval=0.05,
                detail=hub.ctx.metrics.render,
            )
            return text

        text = await until('hub_placement_changes_total{change="placed"}', 2)
        assert series_value(text, "hub_placements") == 2
        assert series_value(text, 'hub_rollout_steps_total{reason="RevisionCreated"}') == 1
        created = 'hub_events_total{kind="ModelDeployment",type="Normal",reason="Created"}'
        assert series_value(text, created) == 1

        await stub.Delete(admin_pb2.DeleteRequest(kind="ModelDeployment", name="fraud"))
        text = await until('hub_placement_changes_total{change="removed"}', 2)
        assert series_value(text, "hub_placements") == 0
