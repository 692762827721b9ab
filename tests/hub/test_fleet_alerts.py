"""The fleet's state as metrics (hub_deployment_*, hub_device_*, hub_region_*) and the alerting
rules shipped in packaging/prometheus/edgefleet-rules.yaml, checked by ``promtool check rules``
and ``promtool test rules`` over what a hub really exports: an in-process hub (real store,
writer, projector, rollout controller) with an unavailable deployment, NotReady devices and a
region cut off, then its rollout aborted; a canary its analysis rolls back (the last analysis
with its figures); and a real ``hub serve`` process restarted on the same SQLite store, whose
deployment series come back as they were (they are read from the store, not counted).

The rollback alert over a real rollback (real edged devices): tests/e2e/test_fleet_metrics.py.
"""

from __future__ import annotations

import http.client
import shutil
import subprocess
import sys
import time
from pathlib import Path

import canarytesting
import orjson
from asynctesting import async_test, eventually
from hubserving import AdminHub, make_hub_dir
from metricstesting import RULES, promtool_test, series_value

from edgefleet.launching import LaunchedHub, free_port_pair, start_hub
from edgefleet.v1 import admin_pb2
from hub.decide.devices import Device, DevicePhase
from hub.state import storekeys as objects
from hub.state.regions import region_key

EDGECTL = str(Path(sys.executable).with_name("edgectl"))
HUB = str(Path(sys.executable).with_name("hub"))

DEPLOYMENT = {
    "apiVersion": "edgefleet.io/v1",
    "kind": "ModelDeployment",
    "metadata": {"name": "fraud"},
    "spec": {
        "model": {"name": "fraud", "version": "2.4.1"},
        "replicas": {"perDevice": 2},
        "placement": {"nodeSelector": {"site": "retail"}},
    },
}
NEXT = {"name": "fraud", "version": "2.5.0"}


def test_the_rules_pass_promtool_check() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/install-system-deps installs prometheus"
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)],
        check=False, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert checked.returncode == 0 and "4 rules found" in checked.stdout, (
        checked.stdout + checked.stderr
    )


@async_test
async def test_unavailable_notready_and_cut_off_fire_from_a_hubs_metrics(tmp_path: Path) -> None:
    """Two Ready devices are given a deployment none serves yet, two more are NotReady (half
    the fleet), region eu is enrolled and never connected: the three alerts fire with the
    deployment's and the region's labels, the rollback alert does not. Then the same after
    the devices serve: none fires but NotReady and the region."""
    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        now = time.time()
        for name, phase, labels in (
            ("cam-1", DevicePhase.READY, {"site": "retail"}),
            ("cam-2", DevicePhase.READY, {"site": "retail"}),
            ("cam-3", DevicePhase.NOT_READY, {}),
            ("cam-4", DevicePhase.NOT_READY, {}),
        ):
            hub.ctx.writer.update(
                Device(name=name, labels=labels, phase=phase, last_heartbeat=now - 30)
            )
        for version, digest in (("2.4.1", "ab"), ("2.5.0", "cd")):
            model = objects.ModelRecord("fraud", version, digest * 32, 1234, b"{signed}", 1.0)
            key = objects.model_key("fraud", version)
            await hub.ctx.store.put(key, objects.dumps(model.to_json()))
            hub.ctx.cache.models[("fraud", version)] = model
        record = {"region": "eu", "certificateSerial": "s1", "enrolledAt": now - 3600}
        await hub.ctx.store.put(region_key("eu"), objects.dumps(record))
        assert hub.ctx.regions is not None
        hub.ctx.regions.take(region_key("eu"), await hub.ctx.store.get(region_key("eu")))
        await hub.stub(channel).Apply(admin_pb2.ApplyRequest(documents=[orjson.dumps(DEPLOYMENT)]))

        def rendered() -> str | None:
            text = hub.ctx.metrics.render()
            observed = 'hub_deployment_observed_generation{deployment="fraud"}'
            placed = 'hub_deployment_devices_desired{deployment="fraud"}'
            done = series_value(text, observed) == 1 and series_value(text, placed) == 2
            return text if done else None

        text: str = await eventually(
            rendered, 20, "the deployment placed on cam-1 and cam-2", interval=0.05
        )
        second = {**DEPLOYMENT, "spec": {**DEPLOYMENT["spec"], "model": NEXT}}
        await hub.stub(channel).Apply(admin_pb2.ApplyRequest(documents=[orjson.dumps(second)]))

        def rolling() -> str | None:
            text = hub.ctx.metrics.render()
            series = 'hub_deployment_rollout_phase{deployment="fraud",phase="Progressing"}'
            return text if series_value(text, series) == 1 else None

        await eventually(rolling, 20, "2.5.0 rolling out", interval=0.05)
        abort = admin_pb2.RolloutActionRequest(
            name="fraud", action=admin_pb2.RolloutActionRequest.ABORT
        )
        await hub.stub(channel).RolloutAction(abort)

        def rolled_back() -> str | None:
            text = hub.ctx.metrics.render()
            series = 'hub_deployment_rollout_phase{deployment="fraud",phase="RolledBack"}'
            return text if series_value(text, series) == 1 else None

        aborted_text: str = await eventually(rolled_back, 20, "aborted", interval=0.05)

    def value(series: str) -> float:
        return series_value(text, series)

    fraud = '{deployment="fraud"}'
    assert value(f"hub_deployment_devices_desired{fraud}") == 2
    assert value(f"hub_deployment_devices_available{fraud}") == 0
    assert value(f"hub_deployment_replicas_desired{fraud}") == 4  # perDevice 2 on 2 devices
    assert value(f"hub_deployment_generation{fraud}") == 1
    assert value('hub_deployment_rollout_phase{deployment="fraud",phase="RolledBack"}') == 0
    assert value('hub_device_ready{device="cam-1"}') == 1
    assert value('hub_device_ready{device="cam-3"}') == 0
    assert value('hub_device_attestation{device="cam-1",state="Unknown"}') == 1
    assert value('hub_device_agent_info{device="cam-1",version="unknown"}') == 1
    assert 29 <= value('hub_device_last_report_age_seconds{device="cam-1"}') < 120
    assert value('hub_region_connected{region="eu"}') == 0
    assert value("hub_device_series_omitted") == 0

    tested = promtool_test(
        tmp_path,
        text,
        {
            "EdgefleetDeploymentUnavailable": [{"deployment": "fraud"}],
            "EdgefleetDevicesNotReady": [{}],
            "EdgefleetRegionCutOff": [{"region": "eu"}],
        },
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr

    # the same checks would catch a rule that fires too much: the rollback alert, asked to
    # fire here, makes promtool fail
    wrong = promtool_test(tmp_path, text, {"EdgefleetDeploymentRolledBack": [{"deployment": "x"}]})
    assert wrong.returncode != 0 and "EdgefleetDeploymentRolledBack" in wrong.stdout + wrong.stderr

    # an operator aborts the rollout: rolled back (reason Aborted), and no rollback alert
    aborted = aborted_text
    assert series_value(
        aborted, 'hub_deployment_rollout_reason{deployment="fraud",reason="Aborted"}'
    )
    tested = promtool_test(
        tmp_path,
        aborted,
        {
            "EdgefleetDeploymentUnavailable": [{"deployment": "fraud"}],
            "EdgefleetDevicesNotReady": [{}],
            "EdgefleetRegionCutOff": [{"region": "eu"}],
        },
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def _serve(data: Path, address: str, metrics_port: int, log: Path) -> LaunchedHub:
    hub = start_hub(
        data, listen=address, log=log, args=["--metrics-listen", f"127.0.0.1:{metrics_port}"]
    )
    hub.wait_listening(30)
    deadline = time.monotonic() + 30
    while True:
        try:
            if _get(metrics_port, "/readyz")[0] == 200:
                return hub
        except OSError:
            pass  # not listening yet: asked again until the deadline, which fails loudly
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


FLEET_SERIES = (
    'hub_deployment_generation{deployment="fraud"}',
    'hub_deployment_observed_generation{deployment="fraud"}',
    'hub_deployment_rollout_phase{deployment="fraud",phase="Complete"}',
    'hub_deployment_rollout_phase{deployment="fraud",phase="Progressing"}',
    'hub_deployment_rollout_stable_revision{deployment="fraud"}',
    'hub_deployment_rollout_changed_timestamp_seconds{deployment="fraud"}',
    'hub_deployment_devices_desired{deployment="fraud"}',
)


def test_deployment_series_survive_a_hub_restart_on_the_same_store(tmp_path: Path) -> None:
    """A real hub (SQLite store) takes a deployment and a second version of it; it is stopped
    and started again on the same data directory: every deployment series reads the same at
    once, while the counter of rollout steps started again from nothing."""
    data = tmp_path / "hub"
    port = free_port_pair()
    address = f"127.0.0.1:{port}"
    subprocess.run(
        [HUB, "init", "--data-dir", str(data), "--hub-address", address],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    metrics_port = free_port_pair()
    while metrics_port in (port - 1, port, port + 1, port + 2):
        metrics_port = free_port_pair()
    config = data / "admin.toml"
    hub = _serve(data, address, metrics_port, tmp_path / "hub.log")
    try:
        for version in ("2.4.1", "2.5.0"):
            model = {"name": "fraud", "version": version}
            doc = {**DEPLOYMENT, "spec": {**DEPLOYMENT["spec"], "model": model}}
            manifest = tmp_path / f"fraud-{version}.json"
            manifest.write_bytes(orjson.dumps(doc))
            applied = subprocess.run(
                [EDGECTL, "--config", str(config), "apply", "-f", str(manifest)],
                check=False, capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert applied.returncode == 0, applied.stdout + applied.stderr
        deadline = time.monotonic() + 30
        while True:
            before = _get(metrics_port, "/metrics")[1]
            observed = series_value(before, FLEET_SERIES[1])
            if observed == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert observed == 2, before
        assert series_value(before, 'hub_rollout_steps_total{reason="RevisionCreated"}') >= 1
    finally:
        hub.stop()
    hub = _serve(data, address, metrics_port, tmp_path / "hub-again.log")
    try:
        after = _get(metrics_port, "/metrics")[1]
    finally:
        hub.stop()
    assert series_value(after, 'hub_rollout_steps_total{reason="RevisionCreated"}') == 0
    for series in FLEET_SERIES:
        assert f"\n{series} " in after, f"{series} missing after the restart:\n{after}"
        assert series_value(after, series) == series_value(before, series), series
    assert series_value(after, FLEET_SERIES[0]) == 2


@async_test
async def test_a_failed_canary_analysis_as_metrics_and_its_alert(tmp_path: Path) -> None:
    """The rollout controller of an in-process hub (real SQLite store) analyses a canary whose
    device reports an accuracy below minAccuracy and rolls it back: the last analysis, as it
    keeps it in the store, is exported with its figures, limit and verdicts, the rollout's
    reason is AnalysisFailed, and the rollback alert fires over that output."""
    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        for name in canarytesting.DEVICES:
            await canarytesting.report(hub, name, "1.0.0")
        for version in ("1.0.0", "2.0.0"):
            await canarytesting.push(hub, version)
        await stub.Apply(admin_pb2.ApplyRequest(documents=[canarytesting.deployment("1.0.0")]))
        for name in canarytesting.DEVICES:
            hub.ctx.cache.desired[name] = objects.DesiredRecord(7, ("det",), "d")
        await stub.Apply(admin_pb2.ApplyRequest(documents=[canarytesting.deployment("2.0.0")]))
        await canarytesting.step(hub)
        await canarytesting.report(hub, "dev-0", "2.0.0", accuracy=0.5)
        state = await canarytesting.step(hub)
        assert (state.phase.value, state.reason) == ("RolledBack", "AnalysisFailed"), state
        text = hub.ctx.metrics.render()

    def value(series: str) -> float:
        return series_value(text, series)

    det = 'deployment="det"'
    assert value(f'hub_deployment_rollout_reason{{{det},reason="AnalysisFailed"}}') == 1
    assert value(f'hub_deployment_analysis_verdict{{{det},verdict="Fail"}}') == 1
    assert value(f'hub_deployment_analysis_verdict{{{det},verdict="Pass"}}') == 0
    assert value(f'hub_deployment_analysis_figure{{{det},side="canary",figure="accuracy"}}') == 0.5
    assert value(f'hub_deployment_analysis_figure{{{det},side="canary",figure="devices"}}') == 1
    assert value(f'hub_deployment_analysis_limit{{{det},figure="accuracy"}}') == 0.9
    assert value(f'hub_deployment_analysis_check{{{det},check="accuracy",verdict="Fail"}}') == 1
    assert value(f"hub_deployment_analysis_revision{{{det}}}") == 2
    assert value(f"hub_deployment_rollout_canary_step{{{det}}}") == 1
    assert value(f"hub_deployment_rollout_canary_weight_percent{{{det}}}") == 25
    tested = promtool_test(
        tmp_path,
        text,
        {"EdgefleetDeploymentRolledBack": [{"deployment": "det", "phase": "RolledBack"}]},
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
