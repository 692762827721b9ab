"""DesiredState: generations, atomic persistence, reload after a restart, corrupt files."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import orjson
import pytest

from edged.state.desired import FORMAT, DesiredState
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import API_VERSION, parse_manifest
from edgefleet.errors import StateError
from edgefleet.persisting import read_json, write_atomic, write_json_atomic


def manifest(name: str = "mnist", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": name, "labels": {"team": "vision"}},
        "spec": {
            "model": {"name": name, "version": "1.0", "path": f"{name}.onnx"},
            "resources": {"cpu": "500m", "memory": "256Mi"},
            **spec,
        },
    }


def workload(name: str = "mnist", sha: str = "a" * 64, **spec: Any) -> DesiredWorkload:
    return DesiredWorkload(parse_manifest(manifest(name, **spec)), sha, f"{name}.yaml")


def workloads(*items: DesiredWorkload) -> dict[WorkloadName, DesiredWorkload]:
    return {w.name: w for w in items}


def test_nothing_persisted_yet(tmp_path: Path) -> None:
    state = DesiredState(tmp_path / "state" / "desired.json")
    state.load()
    assert (state.generation, state.workloads) == (0, {})


def test_replace_persists_and_bumps_the_generation(tmp_path: Path) -> None:
    path = tmp_path / "state" / "desired.json"
    state = DesiredState(path)
    assert state.replace(workloads(workload("mnist"), workload("resnet"))) == {"mnist", "resnet"}
    assert state.generation == 1
    doc = orjson.loads(path.read_bytes())
    assert (doc["format"], doc["generation"]) == (FORMAT, 1)
    assert [w["manifest"]["metadata"]["name"] for w in doc["workloads"]] == ["mnist", "resnet"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    snapshot = state.snapshot()
    assert (snapshot.generation, set(snapshot.workloads)) == (1, {"mnist", "resnet"})


def test_same_content_is_not_a_change(tmp_path: Path) -> None:
    path = tmp_path / "desired.json"
    state = DesiredState(path)
    state.replace(workloads(workload("mnist")))
    before = path.stat()
    assert state.replace(workloads(workload("mnist"))) == set()  # equal, not the same objects
    assert state.generation == 1
    assert path.stat().st_ino == before.st_ino  # not even rewritten


CHANGES = {
    "artifact digest": (workload(sha="b" * 64), {"mnist"}),
    "spec field": (workload(replicas={"perDevice": 3}), {"mnist"}),
    "source": (DesiredWorkload(workload().deployment, "a" * 64, "other.yaml"), {"mnist"}),
}


@pytest.mark.parametrize(("changed", "names"), CHANGES.values(), ids=CHANGES.keys())
def test_a_change_bumps_the_generation(
    tmp_path: Path, changed: DesiredWorkload, names: set[str]
) -> None:
    state = DesiredState(tmp_path / "desired.json")
    state.replace(workloads(workload("mnist"), workload("resnet")))
    assert state.replace(workloads(changed, workload("resnet"))) == names
    assert state.generation == 2
    assert state.get(WorkloadName("mnist")) == changed


def test_removal_is_a_change(tmp_path: Path) -> None:
    state = DesiredState(tmp_path / "desired.json")
    state.replace(workloads(workload("mnist"), workload("resnet")))
    assert state.replace(workloads(workload("resnet"))) == {"mnist"}
    assert state.get(WorkloadName("mnist")) is None
    assert state.replace({}) == {"resnet"}
    assert (state.generation, state.workloads) == (3, {})


def test_load_after_replace_gives_an_equal_state(tmp_path: Path) -> None:
    path = tmp_path / "desired.json"
    state = DesiredState(path)
    state.replace(workloads(workload("mnist")))
    state.replace(workloads(workload("mnist", runtime={"maxBatchSize": 8}), workload("resnet")))

    restarted = DesiredState(path)
    restarted.load()
    assert restarted.generation == state.generation == 2
    assert restarted.workloads == state.workloads
    assert {n: w.revision for n, w in restarted.workloads.items()} == {
        n: w.revision for n, w in state.workloads.items()
    }
    assert restarted.replace(dict(state.workloads)) == set()


def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state directory should be")
    state = DesiredState(blocker / "desired.json")
    with pytest.raises(OSError):
        state.replace(workloads(workload()))
    assert (state.generation, state.workloads) == (0, {})


VALID = {
    "format": FORMAT,
    "generation": 4,
    "workloads": [{"manifest": manifest(), "sha256": "a" * 64, "source": "mnist.yaml"}],
}
CORRUPT: dict[str, bytes] = {
    "truncated": orjson.dumps(VALID)[:40],
    "empty": b"",
    "not UTF-8": b"\xff\xfe{}",
    "a list": b"[]",
    "unknown format": orjson.dumps({**VALID, "format": 99}),
    "no generation": orjson.dumps({k: v for k, v in VALID.items() if k != "generation"}),
    "generation not a number": orjson.dumps({**VALID, "generation": "four"}),
    "workloads not a list": orjson.dumps({**VALID, "workloads": 3}),
    "workload without digest": orjson.dumps({**VALID, "workloads": [{"manifest": manifest()}]}),
    "invalid manifest": orjson.dumps(
        {**VALID, "workloads": [{"manifest": manifest(replicas={"perDevice": -1}), "sha256": "a"}]}
    ),
}


@pytest.mark.parametrize("data", CORRUPT.values(), ids=CORRUPT.keys())
def test_corrupt_file_is_a_state_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "desired.json"
    path.write_bytes(data)
    state = DesiredState(path)
    with pytest.raises(StateError, match=str(path)):
        state.load()
    assert (state.generation, state.workloads) == (0, {})


def test_valid_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "desired.json"
    path.write_bytes(orjson.dumps(VALID))
    state = DesiredState(path)
    state.load()
    assert state.generation == 4
    assert state.workloads == workloads(workload())


# -- persisting --------------------------------------------------------------------------------


def test_write_atomic_replaces_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "file.bin"
    write_atomic(path, b"one")
    write_atomic(path, b"two" * 100_000)
    assert path.read_bytes() == b"two" * 100_000
    assert [p.name for p in path.parent.iterdir()] == ["file.bin"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_write_atomic_failure_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "file.bin"
    write_atomic(path, b"old")
    with pytest.raises(TypeError):
        write_atomic(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]


def test_json_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    assert read_json(path) is None
    write_json_atomic(path, {"b": [1, 2], "a": "x"})
    assert read_json(path) == {"a": "x", "b": [1, 2]}
    assert path.read_bytes().startswith(b'{\n  "a"')  # sorted, indented: diffable


def test_unreadable_json_is_a_state_error(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_bytes(b"{nope")
    with pytest.raises(StateError, match="is not valid JSON"):
        read_json(path)
    with pytest.raises(StateError, match="cannot read"):
        read_json(tmp_path)  # a directory
