"""The committed gRPC stubs: importable as ``edgefleet.v1``, and scripts/check-proto notices
when they no longer match proto/ (run for real, with grpcio-tools, on a copy of the tree)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from edgefleet.v1 import admin_pb2, device_pb2, device_pb2_grpc, enrollment_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


def _copy_tree(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    for script in ("gen-proto", "check-proto"):
        shutil.copy2(ROOT / "scripts" / script, copy / "scripts" / script)
    shutil.copytree(ROOT / "proto", copy / "proto")
    shutil.copytree(ROOT / "edgefleet", copy / "edgefleet")
    return copy


def _check(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(repo / "scripts" / "check-proto")],
        capture_output=True,
        text=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        check=False,
    )


def test_stubs_import_and_describe_the_services() -> None:
    sync = device_pb2.DESCRIPTOR.services_by_name["DeviceService"].methods_by_name["Sync"]
    assert sync.client_streaming and sync.server_streaming
    assert hasattr(device_pb2_grpc, "add_DeviceServiceServicer_to_server")
    assert hasattr(enrollment_pb2_grpc, "EnrollmentServiceStub")
    message = device_pb2.DeviceMessage(hello=device_pb2.Hello(device_name="d1"))
    assert message.WhichOneof("message") == "hello"
    assert admin_pb2.ApplyResult.Outcome.Name(admin_pb2.ApplyResult.UNCHANGED) == "UNCHANGED"


def test_committed_stubs_are_fresh(tmp_path: Path) -> None:
    result = _check(_copy_tree(tmp_path))
    assert result.returncode == 0, result.stderr


def test_a_changed_proto_makes_the_stubs_stale(tmp_path: Path) -> None:
    repo = _copy_tree(tmp_path)
    proto = repo / "proto" / "edgefleet" / "v1" / "device.proto"
    proto.write_text(proto.read_text() + "\nmessage Extra { string x = 1; }\n")
    result = _check(repo)
    assert result.returncode == 1
    assert "stale or missing: edgefleet/v1/device_pb2.py" in result.stderr


def test_a_leftover_stub_is_reported(tmp_path: Path) -> None:
    repo = _copy_tree(tmp_path)
    (repo / "edgefleet" / "v1" / "gone_pb2.py").write_text("")
    result = _check(repo)
    assert result.returncode == 1
    assert "no longer generated: edgefleet/v1/gone_pb2.py" in result.stderr
