"""The fleet's state as metrics after a real rollback, and the alerting rules over them: a real
hub (SQLite), two real edged devices, real ONNX Runtime workers (issue 33, item 1).

A version that cannot load is rolled out; its first device fails it and the rollout is rolled
back. The hub's /metrics then says so per deployment (a state set with RolledBack at 1, the
revisions, devices and replicas), per device, and ``promtool test rules`` over that very
output (packaging/prometheus/edgefleet-rules.yaml) fires EdgefleetDeploymentRolledBack for
the deployment and nothing else. The hub is restarted on the same store: the series read the
same, and the alert still fires, because they come from the store, not from counters.
"""

from __future__ import annotations

import http.client
import time
from pathlib import Path

import pytest
from fleet import HubProcess
from harness import Edged
from metricstesting import promtool_test, series_value
from rollouttesting import apply, push, run_until

from edgefleet.configfiles import parse_host_port
from edgefleet.versioning import installed_version
from hub.config import load_config

N = 2
ROLLED_BACK = 'hub_deployment_rollout_phase{deployment="det",phase="RolledBack"}'
DEPLOYMENT_SERIES = (
    ROLLED_BACK,
    'hub_deployment_rollout_phase{deployment="det",phase="Progressing"}',
    'hub_deployment_generation{deployment="det"}',
    'hub_deployment_observed_generation{deployment="det"}',
    'hub_deployment_rollout_stable_revision{deployment="det"}',
    'hub_deployment_rollout_changed_timestamp_seconds{deployment="det"}',
    'hub_deployment_devices_desired{deployment="det"}',
    'hub_deployment_replicas_desired{deployment="det"}',
)


@pytest.fixture
def fleet_size() -> int:
    return N


def scrape(hub: HubProcess) -> str:
    host, port = parse_host_port(load_config(hub.data / "hub.toml").metrics_listen)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200
        return response.read().decode()
    finally:
        conn.close()


def scrape_until(hub: HubProcess, wanted: dict[str, float], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = scrape(hub)
        except OSError:
            text = ""
        if all(series_value(text, s) == v for s, v in wanted.items()):
            return text
        assert time.monotonic() < deadline, f"never {wanted}:\n{text}"
        time.sleep(0.2)


def test_a_rolled_back_deployment_fires_its_alert_from_the_hubs_metrics_and_after_a_restart(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    push(hub, tmp_path, "1.0.0")
    push(hub, tmp_path, "2.0.0", bad=True)
    apply(hub, tmp_path, "1.0.0")
    run_until(hub, devices, lambda s: s["readyDevices"] == N, 120, new="1.0.0", budget=N)
    apply(hub, tmp_path, "2.0.0")  # the first device given it fails to load it: rolled back
    run_until(
        hub,
        devices,
        lambda s: s.get("rollout", {}).get("phase") == "RolledBack" and s["availableDevices"] == N,
        120,
        new="2.0.0",
        budget=1,
    )
    text = scrape_until(
        hub, {ROLLED_BACK: 1, 'hub_deployment_devices_available{deployment="det"}': N}
    )
    det = '{deployment="det"}'
    assert series_value(text, f"hub_deployment_generation{det}") == 2
    assert series_value(text, f"hub_deployment_observed_generation{det}") == 2
    assert series_value(text, f"hub_deployment_rollout_stable_revision{det}") == 1
    assert series_value(text, f"hub_deployment_devices_desired{det}") == N
    assert series_value(text, f"hub_deployment_devices_updated{det}") == 0  # 2.0.0 serves nowhere
    assert series_value(text, f"hub_deployment_replicas_available{det}") == N  # perDevice 1
    version = installed_version()
    for e in ("dev-0", "dev-1"):
        assert series_value(text, f'hub_device_ready{{device="{e}"}}') == 1
        assert series_value(text, f'hub_device_agent_info{{device="{e}",version="{version}"}}') == 1
        assert 0 <= series_value(text, f'hub_device_last_report_age_seconds{{device="{e}"}}') < 60

    rolled_back = {"EdgefleetDeploymentRolledBack": [{"deployment": "det", "phase": "RolledBack"}]}
    tested = promtool_test(tmp_path, text, rolled_back)
    assert tested.returncode == 0, tested.stdout + tested.stderr

    # the same hub, restarted on the same SQLite store: the same series at once
    hub.stop()
    hub.start()
    again = scrape_until(hub, {ROLLED_BACK: 1})
    for series in DEPLOYMENT_SERIES:
        assert f"\n{series} " in again, f"{series} missing after the restart"
        assert series_value(again, series) == series_value(text, series), series
    assert series_value(again, 'hub_rollout_steps_total{reason="RolledBack"}') == 0  # a counter
    tested = promtool_test(tmp_path, again, rolled_back)
    assert tested.returncode == 0, tested.stdout + tested.stderr
