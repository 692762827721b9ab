"""edgectl end to end: the real ``edgectl`` console script in subprocesses, against a real hub
AdminService (tests/edgectl/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import orjson
import pytest
import yaml
from edgectltesting import EDGECTL, MANIFESTS, edgectl, seed
from hubserving import ThreadedHub

from edgectl.client import ClientError, load_admin_config
from edgefleet.errors import ConfigError
from edgefleet.v1 import federation_pb2
from hub.state import storekeys
from hub.state.regions import RegionState, region_key


def test_apply_is_idempotent_and_reports_each_object(config: Path, tmp_path: Path) -> None:
    manifests = tmp_path / "fleet.yaml"
    manifests.write_text(MANIFESTS)
    first = edgectl(config, "apply", "-f", str(manifests))
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "modeldeployment/fraud created",
        "securitybaseline/fleet created",
        "devicehealthpolicy/needs-gpu created",
    ]
    again = edgectl(config, "apply", "-f", str(manifests))
    assert again.stdout.splitlines() == [
        "modeldeployment/fraud unchanged",
        "securitybaseline/fleet unchanged",
        "devicehealthpolicy/needs-gpu unchanged",
    ]
    policies = orjson.loads(edgectl(config, "get", "policies", "-o", "json").stdout)
    assert [i["metadata"]["name"] for i in policies["items"]] == ["needs-gpu"]
    changed = edgectl(config, "apply", "-f", "-", stdin=MANIFESTS.replace("false", "true"))
    assert changed.stdout.splitlines() == [
        "modeldeployment/fraud unchanged",
        "securitybaseline/fleet configured",
        "devicehealthpolicy/needs-gpu unchanged",
    ]
    dry = edgectl(config, "apply", "--dry-run", "-f", "-", stdin=MANIFESTS.replace("2.4.1", "3"))
    assert dry.stdout.splitlines()[0] == "modeldeployment/fraud configured (dry run)"
    shown = edgectl(config, "get", "deployment", "fraud", "-o", "json")
    assert orjson.loads(shown.stdout)["spec"]["model"]["version"] == "2.4.1"


def test_invalid_manifests_are_refused_with_the_field_and_change_nothing(
    config: Path, tmp_path: Path
) -> None:
    bad = MANIFESTS.replace("perDevice: 1", "perDevice: -1").replace("fraud", "other")
    result = edgectl(config, "apply", "-f", "-", stdin=bad)
    assert result.returncode == 1
    assert result.stderr.startswith(
        "error: INVALID_ARGUMENT: documents[0].spec.replicas.perDevice: "
    )
    assert edgectl(config, "get", "deployment", "other").returncode == 1
    broken = edgectl(config, "apply", "-f", "-", stdin="kind: [unclosed\n")
    assert broken.returncode == 1
    assert "invalid YAML at line" in broken.stderr
    missing = edgectl(config, "apply", "-f", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 1 and "cannot read" in missing.stderr


def test_get_tables_json_yaml_and_selectors(config: Path) -> None:
    edgectl(config, "apply", "-f", "-", stdin=MANIFESTS)
    table = edgectl(config, "get", "devices")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "NAME",
        "REGION",
        "STATUS",
        "HEALTH",
        "ATTESTATION",
        "DEPLOYMENTS",
        "LAST-HEARTBEAT",
        "AGE",
    ]
    assert [line.split()[0] for line in lines[1:]] == ["cam-1", "cam-2"]
    wide = edgectl(config, "get", "devices", "-o", "wide")
    assert "TAINTS" in wide.stdout.splitlines()[0]
    assert "node.edgefleet.io/not-ready:NoSchedule" in wide.stdout

    listed = orjson.loads(edgectl(config, "get", "devices", "-o", "json").stdout)
    assert listed["apiVersion"] == "v1" and listed["kind"] == "List"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["cam-1", "cam-2"]
    selected = yaml.safe_load(
        edgectl(config, "get", "devices", "-l", "accelerator=npu", "-o", "yaml").stdout
    )
    assert [i["metadata"]["name"] for i in selected["items"]] == ["cam-1"]

    deployments = edgectl(config, "get", "deployments").stdout.splitlines()
    assert deployments[0].split() == [
        "NAME",
        "REGION",
        "MODEL",
        "DESIRED",
        "UP-TO-DATE",
        "READY",
        "AVAILABLE",
        "AGE",
    ]
    assert deployments[1].split()[:3] == ["fraud", "eu-frankfurt", "fraud:2.4.1"]
    assert edgectl(config, "get", "models").stdout.strip() == "No resources found."

    bad = edgectl(config, "get", "devices", "-l", "a=b=c")
    assert bad.returncode == 1 and bad.stderr.startswith("error: INVALID_ARGUMENT: label_selector")
    missing = edgectl(config, "get", "device", "nope")
    assert missing.returncode == 1
    assert missing.stderr.strip() == 'error: NOT_FOUND: Device "nope" not found'
    unknown = edgectl(config, "get", "pods")
    assert unknown.returncode == 2 and "unknown resource type 'pods'" in unknown.stderr


def test_describe_device_and_deployment(config: Path) -> None:
    edgectl(config, "apply", "-f", "-", stdin=MANIFESTS)
    device = edgectl(config, "describe", "device", "cam-1")
    assert device.returncode == 0, device.stderr
    for text in ("Name:             cam-1", "accelerator=npu", "Status:           Ready"):
        assert text in device.stdout
    assert "Workloads:" in device.stdout and "Events:" in device.stdout
    deployment = edgectl(config, "describe", "deployment", "fraud")
    assert deployment.returncode == 0, deployment.stderr
    for text in ("Model:            fraud 2.4.1", "desired", "Conditions:", "Available", "Events:"):
        assert text in deployment.stdout


def test_devices_cordon_revoke_delete_and_events(config: Path, hub: ThreadedHub) -> None:
    assert hub.hub is not None
    devices = hub.hub.ctx.cache.devices
    result = edgectl(config, "devices", "cordon", "cam-2")
    assert (result.returncode, result.stdout.strip()) == (0, "device/cam-2 cordoned")
    assert devices["cam-2"].cordoned
    assert "SchedulingDisabled" in edgectl(config, "get", "device", "cam-2").stdout
    assert (
        edgectl(config, "devices", "uncordon", "cam-2").stdout.strip() == "device/cam-2 uncordoned"
    )
    assert not devices["cam-2"].cordoned

    revoked = edgectl(config, "devices", "revoke", "cam-2")
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    assert devices["cam-2"].revoked
    events = edgectl(config, "get", "events", "--for", "device/cam-2")
    reasons = [line.split()[2] for line in events.stdout.splitlines()[1:]]
    assert reasons == ["Cordoned", "Uncordoned", "Revoked"]

    deleted = edgectl(config, "delete", "device", "cam-2")
    assert deleted.stdout.strip() == "device/cam-2 deleted"
    assert "cam-2" not in devices
    again = edgectl(config, "delete", "device", "cam-2")
    assert again.returncode == 1 and "NOT_FOUND" in again.stderr
    hub.run(seed(hub.hub))  # back for the other tests


def test_regions_revoke(config: Path, hub: ThreadedHub) -> None:
    assert hub.hub is not None
    ctx = hub.hub.ctx
    assert ctx.regions is not None
    missing = edgectl(config, "regions", "revoke", "eu")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr
    assert "never enrolled" in missing.stderr
    state = RegionState("eu", "abc123", 1.0)
    hub.run(ctx.store.put(region_key("eu"), storekeys.dumps(state.to_json())))
    ctx.regions.regions["eu"] = state  # as an enrollment leaves it (tests/hub: the real one)
    revoked = edgectl(config, "regions", "revoke", "eu")
    assert (revoked.returncode, revoked.stdout.strip()) == (
        0,
        "region/eu revoked (certificates: abc123)",
    )
    assert "eu" not in ctx.regions.regions and ctx.cache.revoked["abc123"] == "eu"
    usage = edgectl(config, "regions", "forget", "eu")
    assert usage.returncode == 2


def test_get_regions(config: Path, hub: ThreadedHub) -> None:
    assert hub.hub is not None
    ctx = hub.hub.ctx
    assert ctx.regions is not None
    empty = edgectl(config, "get", "regions")
    assert (empty.returncode, empty.stdout.strip()) == (0, "No resources found.")
    now = time.time()
    ap = RegionState("ap", "abc1", now - 86400, not_after=now + 200 * 86400)
    ap.connected, ap.connected_at, ap.last_message = True, now - 60, now
    ap.generation_applied = ap.generation_sent = 12
    ap.report, ap.reported_at = (
        federation_pb2.RegionReport(
            generation=12,
            deployments=[federation_pb2.RegionDeploymentStatus(name="det")],
            inventory=federation_pb2.RegionInventory(total=3, by_phase={"Ready": 2, "Pending": 1}),
        ),
        now - 5,
    )
    sa = RegionState("sa", "abc2", now - 86400)  # enrolled, never connected
    for state in (ap, sa):
        hub.run(ctx.store.put(region_key(state.name), storekeys.dumps(state.to_json())))
        ctx.regions.regions[state.name] = state  # as a stream leaves it (tests/hub: the real one)
    try:
        table = edgectl(config, "get", "regions")
        assert table.returncode == 0, table.stderr
        rows = [line.split() for line in table.stdout.splitlines()]
        assert rows[0] == ["NAME", "CONNECTED", "LAST-REPORT", "DEVICES", "DEPLOYMENTS"]
        assert rows[1][:2] == ["ap", "true"] and rows[1][3:] == ["2/3", "1"]
        assert rows[1][2].endswith("s")  # 5s (or a little more on a loaded machine)
        assert rows[2] == ["sa", "false", "<none>", "<none>", "<none>"]
        wide = edgectl(config, "get", "regions", "-o", "wide").stdout.splitlines()
        assert wide[0].split()[5:] == ["REPLICA", "CERT-EXPIRES-IN", "GENERATION"]
        assert wide[1].split()[5:] in (["hub", "199d", "12"], ["hub", "200d", "12"])
        assert wide[2].split()[5:] == ["<none>", "<unknown>", "<unknown>"]
        doc = orjson.loads(edgectl(config, "get", "region/ap", "-o", "json").stdout)
        assert doc["kind"] == "Region" and doc["status"]["devices"]["ready"] == 2
        assert doc["status"]["replica"] == "hub" and doc["status"]["generationSent"] == 12
        names = edgectl(config, "get", "regions", "-o", "name").stdout.split()
        assert names == ["region/ap", "region/sa"]
        listed = yaml.safe_load(edgectl(config, "get", "regions", "-o", "yaml").stdout)
        assert [i["metadata"]["name"] for i in listed["items"]] == ["ap", "sa"]
        page = edgectl(config, "describe", "region", "ap")
        assert page.returncode == 0, page.stderr
        for line in ("Connected:", "to hub (here)", "2 ready of 3 (Pending 1, Ready 2)",
                     "applied 12, sent 12", "Certificate:      abc1"):  # fmt: skip
            assert line in page.stdout, page.stdout
        assert "no (never connected)" in edgectl(config, "describe", "region/sa").stdout
        missing = edgectl(config, "get", "region", "nope")
        assert missing.returncode == 1 and 'Region "nope" not found' in missing.stderr
        # read-only: delete, apply and label say so; a watch is a usage error
        deleted = edgectl(config, "delete", "region", "ap")
        assert deleted.returncode == 1 and "FAILED_PRECONDITION" in deleted.stderr
        assert "edgectl regions revoke" in deleted.stderr
        region_doc = "apiVersion: edgefleet.io/v1\nkind: Region\nmetadata: {name: ap}\n"
        applied = edgectl(config, "apply", "-f", "-", stdin=region_doc)
        assert applied.returncode == 1 and "Region objects are not applied" in applied.stderr
        assert edgectl(config, "label", "region", "ap", "a=b").returncode == 2
        watched = edgectl(config, "get", "regions", "-w")
        assert watched.returncode == 2 and "does not apply to regions" in watched.stderr
    finally:
        for name in ("ap", "sa"):
            ctx.regions.regions.pop(name, None)
            hub.run(ctx.store.delete(region_key(name)))


def test_tokens_create(config: Path, hub: ThreadedHub) -> None:
    result = edgectl(
        config, "tokens", "create", "--ttl", "1h", "--single-use", "--label", "site=retail"
    )
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert len(token) == 23 and token[6] == "."
    assert "CA hash sha256:" in result.stderr


def test_watch_prints_the_list_then_changes(config: Path) -> None:
    # a baseline to list (the other tests' applies may run on another xdist worker)
    fleet = MANIFESTS.split("---\n")[1]
    assert edgectl(config, "apply", "-f", "-", stdin=fleet).returncode == 0
    proc = subprocess.Popen(
        [EDGECTL, "--config", str(config), "get", "baselines", "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split()[0] == "NAME"
        doc = fleet.replace("name: fleet", "name: watched")
        assert edgectl(config, "apply", "-f", "-", stdin=doc).returncode == 0
        seen = []
        while not any(line.startswith("watched") for line in seen):
            seen.append(proc.stdout.readline())
    finally:
        proc.terminate()
        proc.wait(10)


def test_config_problems(tmp_path: Path, config: Path) -> None:
    missing = edgectl(tmp_path / "absent.toml", "get", "devices")
    assert missing.returncode == 2 and "absent.toml: cannot read" in missing.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('hub = "no-port"\nkey = 3\n')
    with pytest.raises(ConfigError) as info:
        load_admin_config(bad)
    text = str(info.value)
    for field in ("hub: ", "key: must be", "caCertificate: required", "certificate: required"):
        assert field in text
    result = edgectl(bad, "get", "devices")
    assert result.returncode == 2 and "hub: " in result.stderr

    unreachable = tmp_path / "admin.toml"
    text = config.read_text()
    unreachable.write_text(text.replace(text.split('"')[1], "127.0.0.1:1"))
    result = edgectl(unreachable, "get", "devices", env={"GRPC_VERBOSITY": "NONE"})
    assert result.returncode == 3
    assert result.stderr.startswith("error: UNAVAILABLE: cannot reach the hub at 127.0.0.1:1")
    from_env = subprocess.run(
        [EDGECTL, "get", "devices"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "EDGECTL_CONFIG": str(config)},
    )
    assert from_env.returncode == 0 and "cam-1" in from_env.stdout


def test_quickstart_is_still_a_command() -> None:
    result = subprocess.run(
        [EDGECTL, "--help"], check=False, capture_output=True, text=True, timeout=30
    )
    assert "quickstart" in result.stdout and "apply" in result.stdout
    assert ClientError("X", "y").exit_code == 1
