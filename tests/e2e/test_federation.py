"""Federation end to end (docs/federation.md): a root hub, two regional hubs enrolled with it
(``hub init --parent``), real edged devices enrolled with the regions, all real processes with
real certificates on loopback. The eu region talks to the root through a TCP proxy that the
test cuts and heals.

* apply at the root -> only the devices of the region the deployment names run it; the root
  shows the whole fleet (a REGION column), each region its own;
* a region refuses to change or delete what the root owns;
* root <-> eu cut: eu keeps its last desired state, and reschedules a replica off a killed
  device on its own; a change made at the root meanwhile arrives once the link heals;
* a compromised region that injects a forged artifact (signed by a key the fleet's trust root
  does not list) gets it refused by its own devices.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from federationtesting import SLACK, forge_into_region, serving
from fleet import (
    SIGNED_DEVICE_CONFIG,
    HubProcess,
    TcpProxy,
    enroll,
    quick_rescheduling,
)
from harness import Edged, wait_for

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.launching import program_command

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: det}}
spec:
  model: {{name: det, version: "{version}"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{total: 1}}
  placement: {{regions: [eu], nodeSelector: {{site: a}}}}
  probes:
    readiness: {{periodSeconds: 1, timeoutSeconds: 1}}
"""


def get_json(hub: HubProcess, *args: str) -> Any:
    return json.loads(hub.edgectl("get", *args, "-o", "json").stdout)


def region_figures(root: HubProcess, region: str) -> dict[str, Any] | None:
    status = get_json(root, "deployments", "det")["status"]
    figures: dict[str, Any] | None = status.get("regions", {}).get(region)
    return figures


@pytest.mark.scenario
def test_root_regions_devices_partition_and_forgery(
    tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    root = HubProcess(tmp_path / "root", tmp_path / "root.log").init("--region", "root").start()
    regions: dict[str, HubProcess] = {}
    proxy = TcpProxy(("127.0.0.1", root.port))
    devices: dict[str, Edged] = {}
    try:
        for name in ("eu", "us"):
            if name == "eu":
                token, pin = root.token("--for-region", name)
            else:  # the operator's way, over the admin API
                made = root.edgectl("tokens", "create", "--for-region", name)
                token = made.stdout.strip()
                pin = made.stderr.split("CA hash ")[1].split()[0]
                assert f"--region {name} --token TOKEN --parent-ca-hash {pin}" in made.stderr
            hub = HubProcess(tmp_path / name, tmp_path / f"{name}.log")
            hub.init("--region", name, "--parent", root.address, "--token", token,
                     "--parent-ca-hash", pin)  # fmt: skip
            if name == "eu":  # the root <-> eu link goes through the proxy from now on
                parent = hub.data / "parent.json"
                doc = json.loads(parent.read_text())
                doc["parent"] = proxy.address
                parent.write_text(json.dumps(doc))
            quick_rescheduling(hub)
            regions[name] = hub.start()
        eu, us = regions["eu"], regions["us"]
        # the fleet's trust root reached the regions unchanged: devices pin the same root
        assert (eu.data / "trust-root.json").read_bytes() == (
            root.data / "trust-root.json"
        ).read_bytes()
        # a device token enrolls no regional hub
        device_token, pin = root.token()
        intruder = subprocess.run(
            program_command("hub", "init", "--data-dir", tmp_path / "intruder", "--region", "eu2",
                            "--parent", root.address, "--token", device_token,
                            "--parent-ca-hash", pin),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert intruder.returncode != 0 and "refused" in intruder.stderr, intruder.stderr
        for name, hub in (("dev-eu-0", eu), ("dev-eu-1", eu), ("dev-us-0", us)):
            out = enroll(hub, tmp_path / name, name, {"site": "a"})
            assert out.returncode == 0, out.stdout + out.stderr
            config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
            devices[name] = edged_factory(None, data=tmp_path / name, config=config).start()

        for version, seed in (("1.0.0", 1), ("2.0.0", 2)):
            model = tmp_path / f"det-{version}.onnx"
            build_mlp(model, TINY_MLP, seed=seed)
            out = root.edgectl("models", "push", str(model), "--name", "det", "--version", version)
            assert "pushed" in out.stdout, out.stdout + out.stderr
        doc = tmp_path / "det.yaml"
        doc.write_text(DEPLOYMENT.format(version="1.0.0"))
        root.edgectl("apply", "-f", str(doc))

        eu_devices = [devices["dev-eu-0"], devices["dev-eu-1"]]
        wait_for(
            lambda: sum(serving(e) for e in eu_devices) == 1, SLACK, "one eu device serving det"
        )
        assert devices["dev-us-0"].status()["workloads"] == []  # us is not in placement.regions
        wait_for(
            lambda: (region_figures(root, "eu") or {}).get("readyDevices") == 1,
            SLACK,
            "the root to see eu's device ready",
        )
        status = get_json(root, "deployments", "det")["status"]
        assert set(status["regions"]) == {"eu"} and status["readyDevices"] == 1, status
        listed = wait_for(
            lambda: (
                (d := get_json(root, "devices"))
                and {"dev-eu-0", "dev-eu-1", "dev-us-0"}
                <= {i["metadata"]["name"] for i in d["items"]}
                and d
            ),
            SLACK,
            "the root to list every region's devices",
        )
        shown = {i["metadata"]["name"]: i["status"]["region"] for i in listed["items"]}
        assert shown["dev-eu-0"] == "eu" and shown["dev-us-0"] == "us", shown
        table = root.edgectl("get", "devices").stdout.splitlines()
        assert table[0].split()[:2] == ["NAME", "REGION"], table
        assert any(line.split()[:2] == ["dev-us-0", "us"] for line in table), table
        at_eu = {i["metadata"]["name"] for i in get_json(eu, "devices")["items"]}
        assert at_eu == {"dev-eu-0", "dev-eu-1"}  # a region shows its own

        # the region refuses to change what the root owns
        refused_delete = eu.edgectl("delete", "deployment", "det", check=False)
        assert refused_delete.returncode == 1
        assert "owned by the root hub" in refused_delete.stderr, refused_delete.stderr
        doc2 = tmp_path / "det2.yaml"
        doc2.write_text(DEPLOYMENT.format(version="2.0.0"))
        refused_apply = eu.edgectl("apply", "-f", str(doc2), check=False)
        assert "owned by the root hub" in refused_apply.stderr, refused_apply.stderr

        # cut root <-> eu: eu reschedules on its own, and keeps version 1
        proxy.cut()
        wait_for(
            lambda: (region_figures(root, "eu") or {}).get("connected") is False,
            SLACK,
            "the root to see eu gone",
        )
        regions_shown = root.edgectl("get", "regions").stdout.splitlines()
        connected = {line.split()[0]: line.split()[1] for line in regions_shown[1:]}
        assert connected == {"eu": "false", "us": "true"}, regions_shown  # edgectl get regions
        root.edgectl("apply", "-f", str(doc2))  # not reaching eu while cut
        victim = next(e for e in eu_devices if serving(e))
        spare = next(e for e in eu_devices if e is not victim)
        victim.kill9()
        wait_for(lambda: serving(spare, version="1.0.0"), SLACK, "eu to reschedule det, cut off")
        assert "Rescheduled" in eu.edgectl("get", "events").stdout

        # heal: the root's state wins, eu converges to version 2 and reports it
        proxy.heal()
        wait_for(lambda: serving(spare, version="2.0.0"), SLACK * 2, "eu to take version 2")
        wait_for(
            lambda: (
                (f := region_figures(root, "eu") or {}).get("connected")
                and f.get("updatedDevices") == 1
                and f.get("readyDevices") == 1
            ),
            SLACK,
            "the root to see eu converged",
        )

        # a compromised region injects a forged artifact: its device refuses it
        us.stop()
        forge_into_region(us.data, tmp_path)
        us.start()
        dev_us = devices["dev-us-0"]

        def refused_forgery() -> bool:
            problems = dev_us.status()["hub"]["problems"]
            return any("forged" in json.dumps(p) for p in problems)

        wait_for(refused_forgery, SLACK, "dev-us-0 to refuse the forged artifact")
        assert not serving(dev_us, "forged")
        print("problems on dev-us-0:", dev_us.status()["hub"]["problems"])
    finally:
        for e in devices.values():
            if e.proc is not None and e.proc.poll() is None:
                e.terminate()
        for hub in regions.values():
            hub.stop()
        root.stop()
        proxy.close()
