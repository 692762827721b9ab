"""DeviceService over real mutual TLS: a device enrolled through the real Enroll RPC talks Sync
with its own certificate and identity key; bad streams get precise statuses."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import grpc
import pytest
from asynctesting import async_test, eventually
from devicesynctesting import enrolled_device
from hubserving import AdminHub, make_hub_dir

from edgefleet.v1 import (
    admin_pb2,
    common_pb2,
    device_pb2,
    device_pb2_grpc,
)
from edgefleet.versioning import installed_version
from hub.api.admin import devices as admin_devices
from hub.initializing import HubPaths


@async_test
async def test_sync_sends_the_whole_state_and_refuses_bad_streams(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        creds = await enrolled_device(hub, tmp_path, "cam-1")
        async with grpc.aio.secure_channel(f"127.0.0.1:{hub.port}", creds) as ch:
            stub = device_pb2_grpc.DeviceServiceStub(ch)
            call = stub.Sync()
            await call.write(
                device_pb2.DeviceMessage(
                    hello=device_pb2.Hello(
                        edged_version=installed_version(),
                        device_name="cam-1",
                        labels={"arch": "arm64"},
                    )
                )
            )
            msg = await call.read()
            assert msg.WhichOneof("message") == "desired_state"
            assert msg.desired_state.generation >= 1
            assert list(msg.desired_state.manifests) == []
            await call.write(
                device_pb2.DeviceMessage(
                    ack=device_pb2.Ack(generation=msg.desired_state.generation)
                )
            )
            await call.done_writing()

            # the first message must be Hello
            call = stub.Sync()
            await call.write(device_pb2.DeviceMessage(heartbeat=device_pb2.Heartbeat()))
            await call.done_writing()
            assert await call.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "hello" in (await call.details())

            # bytes that are not a DeviceMessage, after a good Hello
            raw = ch.stream_stream(
                "/edgefleet.v1.DeviceService/Sync",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )()
            hello = device_pb2.DeviceMessage(
                hello=device_pb2.Hello(
                    edged_version=installed_version(), device_name="cam-1", labels={"arch": "arm64"}
                )
            )
            await raw.write(hello.SerializeToString())
            await raw.read()  # the desired state
            await raw.write(b"\xff\xff\xff\xff")
            assert await raw.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "malformed edgefleet.v1.DeviceMessage" in (await raw.details())

            # an artifact that is not in this device's desired state
            fetch = stub.FetchArtifact(device_pb2.FetchArtifactRequest(sha256="0" * 64))
            try:
                async for _ in fetch:
                    raise AssertionError("no bytes expected")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() is grpc.StatusCode.PERMISSION_DENIED
        device = hub.ctx.cache.devices["cam-1"]
        assert device.reported_labels == {"arch": "arm64"}
        assert device.generation_acked >= 1


def _synced_count(hub: AdminHub) -> int:
    text = hub.ctx.metrics.render()
    match = re.search(r"^hub_sync_latency_seconds_count (\d+)$", text, re.M)
    assert match, text
    return int(match.group(1))


@async_test
async def test_sync_latency_is_measured_and_a_revoked_device_keeps_its_status(
    tmp_path: Path,
) -> None:
    """The Sync handler times a desired state until its Ack (hub_sync_latency_seconds); the
    server still has its metrics interceptor, and a revoked device's new stream is refused
    with UNAUTHENTICATED (a wrapped Sync turned that into INTERNAL)."""
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        creds = await enrolled_device(hub, tmp_path, "cam-1")
        assert _synced_count(hub) == 0
        async with grpc.aio.secure_channel(f"127.0.0.1:{hub.port}", creds) as ch:
            stub = device_pb2_grpc.DeviceServiceStub(ch)
            call = stub.Sync()
            hello = device_pb2.DeviceMessage(
                hello=device_pb2.Hello(edged_version=installed_version(), device_name="cam-1")
            )
            await call.write(hello)
            generation = (await call.read()).desired_state.generation
            ack = device_pb2.DeviceMessage(ack=device_pb2.Ack(generation=generation))
            for _ in range(2):  # the second Ack of it is not timed again
                await call.write(ack)
            await eventually(
                lambda: hub.ctx.cache.devices["cam-1"].generation_acked >= generation,
                20,
                "the Ack to be recorded",
                interval=0.05,
            )
            await asyncio.sleep(0.2)
            assert _synced_count(hub) == 1

            async with hub.channel() as admin:
                await hub.stub(admin).RevokeDevice(
                    admin_pb2.RevokeDeviceRequest(device_name="cam-1")
                )
            assert await call.code() is grpc.StatusCode.UNAVAILABLE
            assert "revoked" in (await call.details() or "")

            again = stub.Sync()
            await again.write(hello)
            code, details = await _refused(again)
            assert code is grpc.StatusCode.UNAUTHENTICATED, (code, details)
            assert "revoked" in details
        text = hub.ctx.metrics.render()
        assert 'hub_grpc_requests_total{method="/edgefleet.v1.AdminService/RevokeDevice"' in text


@async_test
async def test_device_logs_are_asked_of_the_device_and_relayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeviceLogs: the hub sends a DeviceLogRequest on the device's stream and answers with
    the device's DeviceLogLines (nothing stored); a device that is not connected, or does not
    answer in time, gets a clear status; an answer over the bounds ends the stream."""
    monkeypatch.setattr(admin_devices, "LOG_ANSWER_TIMEOUT_S", 1.0)
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        creds = await enrolled_device(hub, tmp_path, "cam-1")
        ask = admin_pb2.DeviceLogsRequest(device_name="cam-1", workload="det", tail=2)
        code, details = await _code_of(stub.DeviceLogs(ask))
        assert code is grpc.StatusCode.FAILED_PRECONDITION
        assert details.startswith("device cam-1 is not connected")
        before = (await hub.ctx.store.range("/")).revision
        async with grpc.aio.secure_channel(f"127.0.0.1:{hub.port}", creds) as ch:
            call = device_pb2_grpc.DeviceServiceStub(ch).Sync()
            await call.write(
                device_pb2.DeviceMessage(
                    hello=device_pb2.Hello(edged_version=installed_version(), device_name="cam-1")
                )
            )
            assert (await call.read()).WhichOneof("message") == "desired_state"

            asked = asyncio.ensure_future(stub.DeviceLogs(ask, timeout=20))
            request = (await call.read()).log_request
            assert (request.workload, request.tail) == ("det", 2)
            lines = ['{"event": "worker started"}', '{"event": "worker ready"}']
            await call.write(
                device_pb2.DeviceMessage(
                    log_lines=device_pb2.DeviceLogLines(request_id=request.request_id, lines=lines)
                )
            )
            assert list((await asked).lines) == lines

            silent = await _code_of(stub.DeviceLogs(ask))  # the device reads, never answers
            assert silent[0] is grpc.StatusCode.DEADLINE_EXCEEDED
            assert (await call.read()).WhichOneof("message") == "log_request"

            huge = device_pb2.DeviceLogLines(request_id=1, lines=["x" * 3000])
            await call.write(device_pb2.DeviceMessage(log_lines=huge))
            assert await call.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "log_lines.lines[0]: at most 2048 characters" in (await call.details() or "")
        await hub.ctx.writer.flush()
        kvs = (await hub.ctx.store.range("/")).kvs
        assert not [kv for kv in kvs if kv.mod_revision > before and b"worker ready" in kv.value]


async def _code_of(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    raise AssertionError("the call succeeded")


def _set_config(paths: HubPaths, **values: object) -> None:
    text = paths.config.read_text()
    for key, value in values.items():
        text = re.sub(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
    paths.config.write_text(text)


async def _refused(call: grpc.aio.StreamStreamCall) -> tuple[grpc.StatusCode, str]:
    return await call.code(), await call.details() or ""


@async_test
async def test_what_a_hostile_device_sends_is_bounded_and_changes_nothing(
    tmp_path: Path,
) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    _set_config(paths, reservedLabels='["site"]', statusBurst=3, statusRate=0.01)
    async with AdminHub(paths) as hub:
        creds = await enrolled_device(hub, tmp_path, "cam-1")
        hello = device_pb2.DeviceMessage(
            hello=device_pb2.Hello(edged_version=installed_version(), device_name="cam-1")
        )
        async with grpc.aio.secure_channel(f"127.0.0.1:{hub.port}", creds) as ch:
            stub = device_pb2_grpc.DeviceServiceStub(ch)

            # a reserved label in Hello: the device cannot place itself
            call = stub.Sync()
            bad = device_pb2.Hello(
                edged_version=installed_version(), device_name="cam-1", labels={"site": "retail"}
            )
            await call.write(device_pb2.DeviceMessage(hello=bad))
            code, details = await _refused(call)
            assert code is grpc.StatusCode.INVALID_ARGUMENT and "hello.labels['site']" in details
            assert hub.ctx.cache.devices["cam-1"].reported_labels == {}

            # the store bloat: a status of megabytes is refused, nothing of it kept
            call = stub.Sync()
            await call.write(hello)
            await call.read()
            huge = device_pb2.Status(
                workloads=[
                    device_pb2.WorkloadStatus(
                        name=f"w{i}",
                        conditions=[common_pb2.Condition(message="m" * 1000)] * 16,
                    )
                    for i in range(230)
                ]
            )
            await call.write(device_pb2.DeviceMessage(status=huge))
            code, details = await _refused(call)
            assert code is grpc.StatusCode.INVALID_ARGUMENT
            assert details.startswith("status: at most 524288 bytes"), details[:200]
            assert hub.ctx.cache.devices["cam-1"].workloads == {}

            # status faster than the device's rate: the stream ends, the first ones counted
            call = stub.Sync()
            await call.write(hello)
            await call.read()
            for i in range(5):
                one = device_pb2.WorkloadStatus(name="det", model_version=f"1.0.{i}")
                try:
                    await call.write(
                        device_pb2.DeviceMessage(status=device_pb2.Status(workloads=[one]))
                    )
                except grpc.aio.AioRpcError:  # the hub ended the stream first: its status below
                    break
            code, details = await _refused(call)
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "status messages" in details
            assert hub.ctx.cache.devices["cam-1"].workloads["det"].model_version == "1.0.2"


@async_test
async def test_labels_in_a_status_replace_the_hellos_and_reserved_ones_are_refused(
    tmp_path: Path,
) -> None:
    """An accelerator unplugged mid-stream reaches the hub (the scheduler moves replicas that
    needed it); an empty map (an older edged) keeps the Hello's labels."""
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        creds = await enrolled_device(hub, tmp_path, "cam-1")
        gpu = {"arch": "amd64", "accelerator": "gpu", "accelerator.gpu": "1"}
        async with grpc.aio.secure_channel(f"127.0.0.1:{hub.port}", creds) as ch:
            stub = device_pb2_grpc.DeviceServiceStub(ch)
            call = stub.Sync()
            hello = device_pb2.Hello(
                edged_version=installed_version(), device_name="cam-1", labels=gpu
            )
            await call.write(device_pb2.DeviceMessage(hello=hello))
            await call.read()
            await call.write(device_pb2.DeviceMessage(status=device_pb2.Status()))
            await call.write(
                device_pb2.DeviceMessage(status=device_pb2.Status(labels={"arch": "amd64"}))
            )
            await call.write(device_pb2.DeviceMessage(heartbeat=device_pb2.Heartbeat()))
            await call.done_writing()
            await call.code()

            def labels() -> dict[str, str]:
                return dict(hub.ctx.cache.devices["cam-1"].reported_labels)

            await eventually(lambda: labels() == {"arch": "amd64"}, within=10)

            call = stub.Sync()
            await call.write(device_pb2.DeviceMessage(hello=hello))
            await call.read()
            reserved = {"arch": "amd64", "topology.edgefleet.io/zone": "fra-1"}
            await call.write(device_pb2.DeviceMessage(status=device_pb2.Status(labels=reserved)))
            code, details = await _refused(call)
            assert code is grpc.StatusCode.INVALID_ARGUMENT
            assert "status.labels['topology.edgefleet.io/zone']: reserved" in details


@async_test
async def test_a_gpu_that_disappears_moves_a_total_replica_to_the_device_with_an_npu(
    tmp_path: Path,
) -> None:
    """The fleet half of a GPU hotplug: edged reports its labels without the GPU in a Status;
    the scheduler moves the replica (``anyOf: [gpu, npu]``) to the device with an NPU."""
    from edgefleet.api import parse_manifest

    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        scheduler = hub.ctx.scheduler
        assert scheduler is not None
        labels = {
            "gpu-box": {"arch": "amd64", "accelerator": "gpu", "accelerator.gpu": "1"},
            "npu-box": {"arch": "arm64", "accelerator": "npu", "accelerator.npu": "1"},
        }
        calls = {}
        channels = []
        for name, own in labels.items():
            creds = await enrolled_device(hub, tmp_path, name)
            ch = grpc.aio.secure_channel(f"127.0.0.1:{hub.port}", creds)
            channels.append(ch)
            call = device_pb2_grpc.DeviceServiceStub(ch).Sync()
            hello = device_pb2.Hello(
                edged_version=installed_version(), device_name=name, labels=own
            )
            await call.write(device_pb2.DeviceMessage(hello=hello))
            await call.read()
            calls[name] = call
        try:
            manifest = {
                "apiVersion": "edgefleet.io/v1",
                "kind": "ModelDeployment",
                "metadata": {"name": "det"},
                "spec": {
                    "model": {"name": "det", "version": "1.0.0"},
                    "replicas": {"total": 1},
                    "resources": {"accelerator": {"anyOf": ["gpu", "npu"]}},
                },
            }
            hub.ctx.cache.put_object(parse_manifest(manifest).to_dict(), 1)
            await scheduler.pass_now()
            assert hub.ctx.cache.placements["det"] == {"gpu-box"}

            gone = {"arch": "amd64"}  # the GPU was unplugged: discovery labels say so
            await calls["gpu-box"].write(
                device_pb2.DeviceMessage(status=device_pb2.Status(labels=gone))
            )
            await eventually(
                lambda: hub.ctx.cache.devices["gpu-box"].reported_labels == gone, within=10
            )
            await scheduler.pass_now()
            assert hub.ctx.cache.placements["det"] == {"npu-box"}
            moved = [e for e in hub.ctx.cache.events if e["reason"] == "Rescheduled"]
            assert moved[-1]["message"] == (
                "replica taken off gpu-box: no longer fits: lack accelerator gpu|npu"
            )
        finally:
            for call in calls.values():
                await call.done_writing()
                await call.code()
            for ch in channels:
                await ch.close()
