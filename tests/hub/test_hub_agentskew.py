"""The version window at the hub's door (edgefleet.agentskew, hub.api.devicesync): a device
whose edged is outside what the hub accepts is refused at its Hello with
FAILED_PRECONDITION ``AgentVersionOutsideWindow`` naming the window, one event (not one per
retry), and its record shows the version and why; nothing else of its Hello is kept. A device
inside the window syncs as before, and the refusal is cleared. Operators see each device's
version: the Device object (edgectl get -o wide, describe), the dashboard, a metric. Real
mutual TLS, a device enrolled through the real Enroll RPC."""

from __future__ import annotations

from pathlib import Path

import grpc
import orjson
from asynctesting import async_test
from devicesynctesting import enrolled_device
from hubserving import AdminHub, make_hub_dir

from edgectl import printing
from edgefleet.agentskew import window_text
from edgefleet.trust.versions import version_key
from edgefleet.v1 import admin_pb2, device_pb2, device_pb2_grpc
from edgefleet.versioning import installed_version
from hub.decide.devices import Device
from hub.state.metrics import MAX_AGENT_VERSION_SERIES as MAX_SERIES
from hub.state.metrics import agent_versions

HUB = installed_version()
MAJOR, MINOR = (version_key(HUB)[0] + (0, 0))[:2]


async def _hello(
    stub: device_pb2_grpc.DeviceServiceStub, version: str
) -> grpc.aio.StreamStreamCall:
    call = stub.Sync()
    hello = device_pb2.Hello(device_name="cam-1", edged_version=version, labels={"arch": "arm64"})
    await call.write(device_pb2.DeviceMessage(hello=hello))
    return call


@async_test
async def test_an_edged_outside_the_window_is_refused_and_shown(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        creds = await enrolled_device(hub, tmp_path, "cam-1")
        async with grpc.aio.secure_channel(f"127.0.0.1:{hub.port}", creds) as ch:
            stub = device_pb2_grpc.DeviceServiceStub(ch)
            newer = f"{MAJOR}.{MINOR + 1}.0"
            for _ in range(2):  # a refused edged reconnects: one event, not one each
                call = await _hello(stub, newer)
                assert await call.code() is grpc.StatusCode.FAILED_PRECONDITION
                details = await call.details()
                assert details.startswith("AgentVersionOutsideWindow: "), details
                assert newer in details and window_text(HUB) in details, details
            device = hub.ctx.cache.devices["cam-1"]
            assert device.agent_version == newer
            assert device.agent_refused == details
            assert device.reported_labels == {}  # nothing else of the Hello was kept
            # operators see it: edgectl get/describe (the Device object), the metrics
            async with hub.channel() as admin:
                got = await hub.stub(admin).Get(admin_pb2.GetRequest(kind="Device", name="cam-1"))
            status = orjson.loads(got.json)["status"]
            assert (status["agentVersion"], status["agentRefused"]) == (newer, details)
            assert (
                printing.rows_of("Device", [{"status": status}], now=0.0, wide=True)[0][
                    printing.header_of("Device", wide=True).index("AGENT")
                ]
                == f"{newer}(refused)"
            )
            assert 'hub_devices_by_agent_version{agent_version="refused"} 1' in (
                hub.ctx.metrics.render()
            )
            events = [e for e in hub.ctx.cache.events if e["object"]["name"] == "cam-1"]
            refusals = [e for e in events if e["reason"] == "AgentVersionOutsideWindow"]
            assert len(refusals) == 1, events
            assert refusals[0]["type"] == "Warning" and window_text(HUB) in refusals[0]["message"]

            for bad, reason in (
                (f"{MAJOR + 1}.{MINOR}.0", "AgentVersionOutsideWindow"),  # another major
                ("", "AgentVersionNotComparable"),  # an edged always says its version
                ("banana", "AgentVersionNotComparable"),
            ):
                call = await _hello(stub, bad)
                assert await call.code() is grpc.StatusCode.FAILED_PRECONDITION, bad
                assert (await call.details()).startswith(f"{reason}: "), bad
                assert hub.ctx.cache.devices["cam-1"].agent_version == bad

            # the oldest minor the window holds syncs as before, and the refusal is gone
            oldest = f"{MAJOR}.{max(0, MINOR - 2)}.7"
            call = await _hello(stub, oldest)
            msg = await call.read()
            assert msg.WhichOneof("message") == "desired_state", msg
            await call.done_writing()
        device = hub.ctx.cache.devices["cam-1"]
        assert (device.agent_version, device.agent_refused) == (oldest, "")
        assert device.reported_labels == {"arch": "arm64"}
        metrics = hub.ctx.metrics.render()
        assert f'hub_devices_by_agent_version{{agent_version="{oldest}"}} 1' in metrics
        assert 'agent_version="refused"' not in metrics


def test_the_version_series_are_bounded() -> None:
    """A version is what a device says: at most MAX_AGENT_VERSION_SERIES series, the rest
    counted as other."""
    devices = [Device(f"d{i}", agent_version=f"0.2.{i}") for i in range(MAX_SERIES + 5)]
    devices += [Device("d-new", agent_version="0.2.0"), Device("never")]
    series = agent_versions(devices)
    assert len(series) == MAX_SERIES + 1 and series[("other",)] == 6
    assert series[("0.2.0",)] == 2 and sum(series.values()) == len(devices)
    assert agent_versions([Device("never")]) == {("unknown",): 1}
