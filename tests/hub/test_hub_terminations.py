"""A replica's last termination at the hub (OOMKilled, Error...): the bounds on what a device
may send (tables and a property, pure), the device record across a store round trip (an old
record holds none), the deployment's status per device and one event per new termination
(tables), and a hostile device on a real hub over real gRPC: refused with the field named,
nothing kept; an honest one's termination kept, one ``OOMKilled`` event however often it is
reported."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from asynctesting import async_test, eventually
from devicesynctesting import enrolled_device
from google.protobuf.timestamp_pb2 import Timestamp
from hubserving import AdminHub, make_hub_dir
from hypothesis import given
from hypothesis import strategies as st
from propertytesting import examples

from edgefleet.api import ModelDeployment, parse_manifest
from edgefleet.v1 import device_pb2, device_pb2_grpc
from edgefleet.versioning import installed_version
from hub.api import deviceinput as di
from hub.api.dashboard.pages import device_body
from hub.decide.devices import (
    Device,
    DevicePhase,
    RevisionPhase,
    RevisionReport,
    Termination,
    WorkloadReport,
)
from hub.decide.status import (
    MAX_TERMINATIONS_SHOWN,
    bound_termination_times,
    deployment_status,
    new_terminations,
    termination_message,
)

OOM = Termination("det-r-0", "OOMKilled", "worker killed by the kernel's OOM killer", 0, 9, 1e9)
NOW = 1_765_000_000


def _ended(**kw: object) -> device_pb2.ReplicaTermination:
    fields: dict[str, object] = {
        "replica": "det-r-0",
        "reason": "OOMKilled",
        "signal": 9,
        "finished_at": Timestamp(seconds=NOW),
    }
    fields.update(kw)
    return device_pb2.ReplicaTermination(**fields)  # type: ignore[arg-type]


def _status(ended: device_pb2.ReplicaTermination | None = None, **kw: object) -> device_pb2.Status:
    w = device_pb2.WorkloadStatus(
        name="det",
        model_version="1.0.0",
        desired_replicas=1,
        last_termination=ended,
        **kw,  # type: ignore[arg-type]
    )
    return device_pb2.Status(workloads=[w])


AT = "status.workloads[0].last_termination"


@pytest.mark.parametrize(
    ("status", "problem"),
    [
        (_status(), None),
        (_status(_ended()), None),
        (_status(_ended(signal=0, exit_code=1, reason="Error")), None),
        (_status(_ended(), restart_count=di.MAX_RESTART_COUNT), None),
        (_status(_ended(finished_at=None)), None),
        (_status(_ended(reason="")), f"{AT}.reason: required"),
        (_status(_ended(reason="R" * 65)), f"{AT}.reason: at most 64 characters, got 65"),
        (_status(_ended(reason="OOM Killed")), f"{AT}.reason: must be one CamelCase word"),
        (_status(_ended(reason="<script>")), f"{AT}.reason: must be one CamelCase word"),
        (_status(_ended(reason="Ünïcode")), f"{AT}.reason: must be one CamelCase word"),
        (_status(_ended(reason="9Lives")), f"{AT}.reason: must be one CamelCase word"),
        (_status(_ended(message="m" * 1025)), f"{AT}.message: at most 1024 characters"),
        (_status(_ended(replica="r" * 129)), f"{AT}.replica: at most 128 characters"),
        (_status(_ended(signal=0, exit_code=-1)), f"{AT}.exit_code: from 0 to 255, got -1"),
        (_status(_ended(signal=0, exit_code=256)), f"{AT}.exit_code: from 0 to 255, got 256"),
        (_status(_ended(signal=65)), f"{AT}.signal: at most 64, got 65"),
        (_status(_ended(exit_code=1)), f"{AT}: an exit code (1) or a signal (9), not both"),
        (
            _status(_ended(finished_at=Timestamp(seconds=-1))),
            f"{AT}.finished_at: a time from 1970 to 9999",
        ),
        (
            _status(_ended(finished_at=Timestamp(seconds=2**40))),
            f"{AT}.finished_at: a time from 1970 to 9999",
        ),
        (
            _status(_ended(finished_at=Timestamp(seconds=NOW, nanos=-1))),
            f"{AT}.finished_at: a time from 1970 to 9999",
        ),
        (
            _status(_ended(), restart_count=2**32 - 1),
            f"status.workloads[0].restart_count: at most {2**31 - 1}",
        ),
    ],
)
def test_termination_bounds_table(status: device_pb2.Status, problem: str | None) -> None:
    problems = di.check_status(status)
    assert problems == [] if problem is None else problem in "\n".join(problems), problems


@examples(500)
@given(
    reason=st.text(max_size=80),
    message=st.text(max_size=1100),
    replica=st.text(max_size=140),
    exit_code=st.integers(-(2**31), 2**31 - 1),
    sig=st.integers(0, 2**32 - 1),
    seconds=st.integers(-(2**63), 2**63 - 1),
    nanos=st.integers(-(2**31), 2**31 - 1),
    restarts=st.integers(0, 2**32 - 1),
)
def test_any_termination_passes_or_gets_field_named_problems(
    reason: str,
    message: str,
    replica: str,
    exit_code: int,
    sig: int,
    seconds: int,
    nanos: int,
    restarts: int,
) -> None:
    ended = device_pb2.ReplicaTermination(
        replica=replica,
        reason=reason,
        message=message,
        exit_code=exit_code,
        signal=sig,
        finished_at=Timestamp(seconds=seconds, nanos=nanos),
    )
    problems = di.check_status(_status(ended, restart_count=restarts))
    assert all(p.startswith("status.workloads[0].") for p in problems), problems
    if not problems:  # what passes is what the hub can show and store
        assert reason.isascii() and reason.isalnum() and len(reason) <= 64
        assert 0 <= exit_code <= 255 and sig <= 64 and not (exit_code and sig)
        assert Timestamp(seconds=seconds, nanos=nanos).ToDatetime().year <= 9999


def test_the_device_record_keeps_it_and_an_old_record_holds_none() -> None:
    report = WorkloadReport("1.0.0", "r", 1, 1, last_termination=OOM, restart_count=2)
    doc = report.to_json()
    assert doc["lastTermination"] == {
        "replica": "det-r-0",
        "reason": "OOMKilled",
        "message": "worker killed by the kernel's OOM killer",
        "exitCode": 0,
        "signal": 9,
        "finishedAt": 1e9,
    }
    assert doc["restartCount"] == 2
    assert WorkloadReport.from_json(doc) == report
    old = WorkloadReport("1.0.0", "r", 1, 1)
    assert "lastTermination" not in old.to_json() and "restartCount" not in old.to_json()
    assert WorkloadReport.from_json({"modelVersion": "1.0.0"}).last_termination is None


def _dep() -> ModelDeployment:
    d = parse_manifest(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": "det"},
            "spec": {"model": {"name": "det", "version": "1.0.0"}},
        }
    )
    assert isinstance(d, ModelDeployment)
    return d


def _device(name: str, ended: Termination | None, restarts: int = 0) -> Device:
    serving = RevisionReport("1.0.0", "", RevisionPhase.READY, 1, "r", wanted=True)
    report = WorkloadReport(
        "1.0.0", "r", 1, 1, revisions=(serving,), last_termination=ended, restart_count=restarts
    )
    return Device(name, phase=DevicePhase.READY, workloads={"det": report})


def test_the_deployment_status_shows_each_devices_last_termination() -> None:
    """OOM-killed once and serving again: available, not failing, and the termination shown."""
    devices = [_device("cam-1", OOM, restarts=1), _device("cam-2", None)]
    status = deployment_status(_dep(), devices, {"cam-1": ["det"], "cam-2": ["det"]})
    assert (status.available, status.failing) == (2, {})
    assert status.to_json()["terminations"] == {
        "cam-1": {"lastTermination": OOM.to_json(), "restartCount": 1}
    }
    assert status.to_json()["terminatedDevices"] == 1
    quiet = deployment_status(_dep(), devices[1:], {"cam-2": ["det"]})
    assert "terminations" not in quiet.to_json()  # nothing ended: the status as before


def test_a_fleet_wide_oom_lists_the_newest_devices_and_counts_them_all() -> None:
    many = 5 * MAX_TERMINATIONS_SHOWN
    devices = [
        _device(f"cam-{i:03d}", Termination("det-r-0", "OOMKilled", "m" * 1024, 0, 9, float(i)))
        for i in range(many)
    ]
    status = deployment_status(_dep(), devices, {d.name: ["det"] for d in devices}).to_json()
    assert status["terminatedDevices"] == many
    shown = sorted(status["terminations"])
    assert shown == [f"cam-{i:03d}" for i in range(many - MAX_TERMINATIONS_SHOWN, many)]


LATER = Termination("det-r-0", "OOMKilled", "again", 0, 9, 2e9)


@pytest.mark.parametrize(
    ("before", "after", "new"),
    [
        pytest.param({}, {}, [], id="nothing"),
        pytest.param({}, {"det": OOM}, [("det", OOM)], id="the first report of one"),
        pytest.param({"det": None}, {"det": OOM}, [("det", OOM)], id="a first termination"),
        pytest.param({"det": OOM}, {"det": OOM}, [], id="the same one reported again"),
        pytest.param({"det": OOM}, {"det": LATER}, [("det", LATER)], id="a later one"),
        pytest.param({"det": OOM}, {"det": None}, [], id="gone (edged restarted)"),
        pytest.param(
            {"a": OOM, "b": None},
            {"a": OOM, "b": LATER},
            [("b", LATER)],
            id="only the workload with a new one",
        ),
    ],
)
def test_new_terminations_table(
    before: dict[str, Termination | None],
    after: dict[str, Termination | None],
    new: list[tuple[str, Termination]],
) -> None:
    def reports(ends: dict[str, Termination | None]) -> dict[str, WorkloadReport]:
        return {k: WorkloadReport("1.0.0", last_termination=t) for k, t in ends.items()}

    assert new_terminations(reports(before), reports(after)) == new


AHEAD = Termination("det-r-0", "Killed", "", 0, 9, NOW + 3 * 3600.0)  # the device's clock ahead
HELD = Termination("det-r-0", "Killed", "", 0, 9, NOW, reported_finished_at=NOW + 3 * 3600.0)
AGAIN = Termination("det-r-0", "Killed", "", 0, 9, NOW + 4 * 3600.0)


@pytest.mark.parametrize(
    ("before", "after", "now", "bounded"),
    [
        pytest.param({}, {"det": OOM}, NOW, OOM, id="in the past: as the device said"),
        pytest.param({}, {"det": None}, NOW, None, id="none"),
        pytest.param({}, {"det": AHEAD}, NOW, HELD, id="in the future: held at its receipt"),
        pytest.param(
            {"det": HELD},
            {"det": AHEAD},
            NOW + 60,
            HELD,
            id="reported again: as given",
        ),
        pytest.param(
            {"det": HELD},
            {"det": AGAIN},
            NOW + 60,
            Termination("det-r-0", "Killed", "", 0, 9, NOW + 60, NOW + 4 * 3600.0),
            id="a later end, still ahead: a new one at its receipt",
        ),
        pytest.param({"det": HELD}, {"det": OOM}, NOW + 60, OOM, id="corrected: as it says"),
    ],
)
def test_a_devices_future_termination_is_bounded_by_the_hubs_clock(
    before: dict[str, Termination | None],
    after: dict[str, Termination | None],
    now: float,
    bounded: Termination | None,
) -> None:
    """A device's clock is its own (stepped ahead, or lying): a termination it dates after the
    hub received it is dated at that receipt, the device's own time kept beside it; reported
    again, it stays the same termination (no second event)."""

    def reports(ends: dict[str, Termination | None]) -> dict[str, WorkloadReport]:
        return {k: WorkloadReport("1.0.0", last_termination=t) for k, t in ends.items()}

    out = bound_termination_times(reports(before), reports(after), now)
    assert out["det"].last_termination == bounded
    repeated = bound_termination_times(out, reports(after), now + 3600)
    assert repeated == out  # the same end: the same record, no new termination
    assert new_terminations(out, repeated) == []
    back = Device.from_json(Device("cam-1", workloads=out).to_json())  # the store keeps both
    assert back.workloads["det"].last_termination == bounded


def test_a_device_whose_clock_is_ahead_does_not_hide_the_fleets_terminations() -> None:
    """Before the bound, one device reporting a termination years ahead held a place among
    the few newest shown in its deployment's status for good, ahead of every real one."""
    many = MAX_TERMINATIONS_SHOWN
    honest = [
        _device(f"cam-{i:03d}", Termination("det-r-0", "OOMKilled", "", 0, 9, NOW - 60.0 + i))
        for i in range(many)
    ]
    liar = WorkloadReport("1.0.0", last_termination=Termination("r", "Error", "", 1, 0, 4e9))
    bounded = bound_termination_times({}, {"det": liar}, NOW - 3600.0)
    devices = [*honest, Device("liar", phase=DevicePhase.READY, workloads=bounded)]
    status = deployment_status(_dep(), devices, {d.name: ["det"] for d in devices}).to_json()
    assert "liar" not in status["terminations"]
    assert status["terminatedDevices"] == many + 1


def test_termination_message() -> None:
    assert termination_message(OOM) == (
        "replica det-r-0 OOMKilled (signal 9): worker killed by the kernel's OOM killer"
    )
    assert termination_message(Termination("r", "Error", "", 3)) == "replica r Error (exit code 3)"


def test_the_dashboards_device_page_shows_it_escaped() -> None:
    ended = Termination("det-r-0", "OOMKilled", "<b>memory.max</b>", 0, 9, 0.0)
    page = device_body(_device("cam-1", ended, restarts=2), None, [])
    assert (
        "last termination <b>OOMKilled</b> (signal 9) at 1970-01-01T00:00:00Z, replica det-r-0: "
        "&lt;b&gt;memory.max&lt;/b&gt;; 2 restarts"
    ) in page
    assert "last termination" not in device_body(_device("cam-2", None), None, [])


# -- a real hub over real gRPC --------------------------------------------------------------------


@async_test
async def test_a_hostile_termination_is_refused_and_an_honest_one_is_one_event(
    tmp_path: Path,
) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        creds = await enrolled_device(hub, tmp_path, "cam-1")
        hello = device_pb2.DeviceMessage(
            hello=device_pb2.Hello(edged_version=installed_version(), device_name="cam-1")
        )

        def oom_events() -> list[dict[str, object]]:
            return [e for e in hub.ctx.cache.events if e.get("reason") == "OOMKilled"]

        async with grpc.aio.secure_channel(f"127.0.0.1:{hub.port}", creds) as ch:
            stub = device_pb2_grpc.DeviceServiceStub(ch)
            for hostile, named in (
                (_ended(reason="OOMKilled\nforged event line"), f"{AT}.reason"),
                (_ended(message="m" * 100_000), f"{AT}.message"),
                (_ended(signal=2**32 - 1), f"{AT}.signal"),
            ):
                call = stub.Sync()
                await call.write(hello)
                await call.read()
                await call.write(device_pb2.DeviceMessage(status=_status(hostile)))
                assert await call.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert (await call.details() or "").startswith(named)
                assert hub.ctx.cache.devices["cam-1"].workloads == {}  # nothing of it kept
            assert oom_events() == []

            # an honest device: the termination kept, one event for it however often reported
            call = stub.Sync()
            await call.write(hello)
            await call.read()
            for restarts in (1, 1, 2):
                status = _status(_ended(message="memory.max"), restart_count=restarts)
                await call.write(device_pb2.DeviceMessage(status=status))

            def kept() -> WorkloadReport | None:
                return hub.ctx.cache.devices["cam-1"].workloads.get("det")

            await eventually(lambda: (w := kept()) is not None and w.restart_count == 2, within=10)
            report = kept()
            assert report is not None and report.last_termination == Termination(
                "det-r-0", "OOMKilled", "memory.max", 0, 9, float(NOW)
            )
            (event,) = oom_events()
            assert event["type"] == "Warning"
            assert event["object"] == {"kind": "ModelDeployment", "name": "det"}
            assert (
                event["message"] == "device cam-1: replica det-r-0 OOMKilled (signal 9): memory.max"
            )
            await call.done_writing()
            await call.code()
