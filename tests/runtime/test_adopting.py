"""The records of kept workers and the checks before adoption (edged/runtime/adopting.py):
pure checks, and the record files as an attacker could leave them."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from edged.runtime.adopting import (
    ProcIdentity,
    WorkerRecord,
    WorkerRecords,
    check_desired,
    check_identity,
    identify,
    parse_cgroup,
    parse_start_time,
)
from edged.runtime.launching import LaunchSpec, LimitsSpec

SHA = "a" * 64


def _spec(**kw: object) -> LaunchSpec:
    base = dict(
        replica_id="mlp-abc-0",
        workload="mlp",
        model_name="mlp",
        model_version="1",
        artifact_path="/d/artifacts/sha256/" + SHA,
        artifact_sha256=SHA,
        providers=("CPUExecutionProvider",),
        intra_op_threads=1,
        max_batch_size=8,
        max_queue_delay_s=0.0,
        limits=LimitsSpec(),
        attach_name="edgefleet-worker/1/00",
        orphan_timeout_s=300.0,
        supervisor_uid=0,
    )
    base.update(kw)
    return LaunchSpec(**base)  # type: ignore[arg-type]


def _record(spec: LaunchSpec | None = None, **kw: object) -> WorkerRecord:
    spec = spec or _spec()
    argv = (
        "/usr/bin/python3",
        "-m",
        "edged.runtime.worker",
        "3",
        orjson.dumps(spec.to_json()).decode(),
    )
    base = dict(
        replica_id=spec.replica_id,
        workload=spec.workload,
        revision="abc",
        slot=0,
        pid=4242,
        start_time=1000,
        boot_id="boot-1",
        exe="/usr/bin/python3.11",
        argv=argv,
        uid=61200,
        cgroup="/sys/fs/cgroup/edged.service/workloads/mlp-abc-0",
    )
    base.update(kw)
    return WorkerRecord(**base)  # type: ignore[arg-type]


def _seen(record: WorkerRecord, **kw: object) -> ProcIdentity:
    base = dict(
        start_time=record.start_time,
        exe=record.exe,
        argv=record.argv,
        uid=record.uid,
        cgroup=record.cgroup,
    )
    base.update(kw)
    return ProcIdentity(**base)  # type: ignore[arg-type]


def test_the_worker_it_describes_passes() -> None:
    record = _record()
    assert check_identity(record, _seen(record), boot="boot-1") == ""


@pytest.mark.parametrize(
    ("seen", "boot", "why"),
    [
        (None, "boot-1", "is gone"),
        ({}, "boot-2", "another boot"),
        ({"start_time": 1001}, "boot-1", "another process has its pid"),
        ({"exe": "/tmp/evil"}, "boot-1", "runs /tmp/evil"),
        ({"argv": ("python", "-c", "pass")}, "boot-1", "argv is not the worker's"),
        ({"uid": 0}, "boot-1", "runs as uid 0"),
        ({"cgroup": "/sys/fs/cgroup/user.slice"}, "boot-1", "is in the cgroup"),
    ],
)
def test_a_process_that_is_not_the_worker_is_refused(
    seen: dict[str, object] | None, boot: str, why: str
) -> None:
    record = _record()
    identity = None if seen is None else _seen(record, **seen)
    assert why in check_identity(record, identity, boot=boot)


def test_an_interpreter_replaced_on_disk_still_runs_the_worker() -> None:
    record = _record()
    seen = _seen(record, exe=record.exe + " (deleted)")
    assert check_identity(record, seen, boot="boot-1") == ""
    other = _seen(record, exe="/usr/bin/python3.12 (deleted)")
    assert "runs /usr/bin/python3.12" in check_identity(record, other, boot="boot-1")


def test_a_worker_on_a_uid_of_its_own_is_proven_without_its_exe() -> None:
    """edged under the shipped unit (root without CAP_SYS_PTRACE) cannot read /proc/PID/exe of
    a worker on another uid (identify gives ""): the rest of the identity proves it, whatever
    exe the record holds (read at the start, before the uid switch, or "" at a stop)."""
    for recorded in ("/usr/bin/python3.11", ""):
        record = _record(exe=recorded)
        assert check_identity(record, _seen(record, exe=""), boot="boot-1") == ""
        assert "another process" in check_identity(
            record, _seen(record, exe="", start_time=7), boot="boot-1"
        )
    # an exe edged can read is still compared
    assert "runs /tmp/evil" in check_identity(
        _record(exe=""), _seen(_record(), exe="/tmp/evil"), boot="boot-1"
    )


def test_a_record_whose_argv_is_no_worker_is_refused() -> None:
    record = replace(_record(), argv=("/bin/sleep", "60", orjson.dumps(_spec().to_json()).decode()))
    assert "not an inference worker" in check_identity(record, _seen(record), boot="boot-1")


def test_desired_digests() -> None:
    record = _record()
    assert check_desired(record, {"mlp": frozenset({SHA})}) == ""
    assert "no longer desired" in check_desired(record, {"other": frozenset({SHA})})
    assert "no longer names" in check_desired(record, {"mlp": frozenset({"b" * 64})})


def test_start_time_and_cgroup_parsing() -> None:
    # a command with spaces and parentheses: the last ")" ends it
    stat = "4242 (py (x) y) S 1 4242 4242 0 -1 4194560 " + " ".join(["0"] * 12) + " 98765 rest"
    assert parse_start_time(stat) == 98765
    assert parse_cgroup("0::/edged.service/workloads/r\n", "/sys/fs/cgroup") == (
        "/sys/fs/cgroup/edged.service/workloads/r"
    )
    assert parse_cgroup("1:name=systemd:/x\n", "/sys/fs/cgroup") == ""


def test_identify_reads_this_process() -> None:
    me = identify(os.getpid())
    assert me.uid == os.getuid()
    assert me.exe == os.readlink("/proc/self/exe")
    with pytest.raises(OSError):
        identify(2**22 + 12345)


def test_records_round_trip_and_bad_ones_are_dropped(tmp_path: Path) -> None:
    records = WorkerRecords(tmp_path / "workers")
    good = _record()
    records.write(good)
    assert list(records.load()) == [good]
    d = tmp_path / "workers"
    (d / "junk.json").write_bytes(b"{not json")
    (d / "big.json").write_bytes(b" " * ((1 << 20) + 1))
    doc = good.to_json()
    (d / "other-0.json").write_bytes(orjson.dumps(doc))  # names another replica than its file
    lie = dict(doc, pid=1)
    (d / "pid1-0.json").write_bytes(orjson.dumps(dict(lie, replica_id="pid1-0")))
    spec_of_another = _spec(replica_id="x-1-0")
    mixed = _record(spec_of_another, replica_id="mixed-0").to_json()
    (d / "mixed-0.json").write_bytes(orjson.dumps(mixed))  # argv's spec is another replica's
    not_kept = _record(_spec(replica_id="nk-0", attach_name=""), replica_id="nk-0").to_json()
    (d / "nk-0.json").write_bytes(orjson.dumps(not_kept))
    assert list(records.load()) == [good]
    assert sorted(p.name for p in d.iterdir()) == [f"{good.replica_id}.json"]
    records.remove(good.replica_id)
    assert list(records.load()) == []


def test_record_paths_are_replica_ids_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="replica id"):
        WorkerRecords(tmp_path).path("../../etc/passwd")
