"""StaticManifests.sync over a directory: accepted workloads, problems, and what is kept."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from edged.sources.static import SourceProblem, StaticManifests, SyncResult
from edged.trust.admitting import ArtifactGate
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import API_VERSION
from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.demo import build_mlp


def doc(name: str, model: str | None = None, **model_fields: Any) -> dict[str, Any]:
    model_fields.setdefault("path", f"{model or name}.onnx")
    return {
        "apiVersion": API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": model or name, "version": "1.0", **model_fields},
            "replicas": {"perDevice": 1},
        },
    }


class Dir:
    """A manifests directory, a store, and the source under test; ``sync`` feeds back."""

    def __init__(self, root: Path, models: tuple[bytes, bytes], max_bytes: int = 1 << 20) -> None:
        self.path = root / "manifests"
        self.path.mkdir()
        self.models = models
        self.store = ArtifactStore(root / "artifacts")
        # Not about trust (tests/trust is): unsigned artifacts allowed, no trust root.
        gate = ArtifactGate(root / "data", root_file=None, allow_unsigned=True)
        self.source = StaticManifests(
            self.path, self.store, max_artifact_bytes=max_bytes, gate=gate
        )
        self.current: dict[WorkloadName, DesiredWorkload] = {}

    def model(self, name: str, which: int = 0) -> str:
        (self.path / f"{name}.onnx").write_bytes(self.models[which])
        return hashlib.sha256(self.models[which]).hexdigest()

    def write(self, fname: str, *docs: Any) -> None:
        if fname.endswith(".json"):
            text = orjson.dumps(docs[0] if len(docs) == 1 else list(docs)).decode()
        else:
            text = yaml.safe_dump_all(docs)
        (self.path / fname).write_text(text)

    def sync(self) -> SyncResult:
        """Sync, and accept the result as the daemon does."""
        result = self.source.sync(self.current)
        self.current = dict(result.workloads)
        return result


@pytest.fixture
def d(tmp_path: Path, models: tuple[bytes, bytes]) -> Dir:
    return Dir(tmp_path, models)


def only_problem(result: SyncResult) -> SourceProblem:
    (problem,) = result.problems
    return problem


def test_valid_file_gives_a_workload_with_its_digest(d: Dir) -> None:
    sha = d.model("mnist")
    d.write("mnist.yaml", doc("mnist"))
    result = d.sync()
    assert result.problems == () and not result.retryable
    assert result.files == ("mnist.yaml",)
    w = result.workloads[WorkloadName("mnist")]
    assert (w.name, w.sha256, w.source) == ("mnist", sha, "mnist.yaml")
    assert d.store.has(sha)
    assert d.store.path_for(sha).read_bytes() == d.models[0]


def test_several_documents_and_formats(d: Dir) -> None:
    shas = {name: d.model(name, i % 2) for i, name in enumerate(["a", "b", "c"])}
    d.write("ab.yaml", doc("a"), doc("b"))
    d.write("c.json", doc("c"))
    result = d.sync()
    assert result.problems == ()
    assert {n: w.sha256 for n, w in result.workloads.items()} == shas
    assert {w.source for w in result.workloads.values()} == {"ab.yaml", "c.json"}


def test_absolute_model_path(d: Dir, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.onnx"
    elsewhere.write_bytes(d.models[1])
    d.write("m.yaml", doc("m", path=str(elsewhere)))
    assert d.sync().workloads[WorkloadName("m")].sha256 == hashlib.sha256(d.models[1]).hexdigest()


def test_only_manifest_files_are_read(d: Dir) -> None:
    d.model("mnist")
    d.write("mnist.yml", doc("mnist"))
    d.write(".hidden.yaml", doc("hidden"))
    (d.path / "notes.txt").write_text("not a manifest")
    (d.path / "sub.yaml").mkdir()
    (d.path / "sub.yaml" / "inner.yaml").write_text(yaml.safe_dump(doc("inner")))
    result = d.sync()
    assert (result.files, list(result.workloads), result.problems) == (
        ("mnist.yml",),
        ["mnist"],
        (),
    )


def test_missing_directory_is_empty(tmp_path: Path, models: tuple[bytes, bytes]) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    gate = ArtifactGate(tmp_path / "data", root_file=None, allow_unsigned=True)
    result = StaticManifests(
        tmp_path / "absent", store, max_artifact_bytes=1 << 20, gate=gate
    ).sync({})
    assert (result.workloads, result.problems, result.files) == ({}, (), ())


def test_invalid_file_keeps_what_it_defined_before(d: Dir) -> None:
    d.model("mnist")
    d.model("other")
    d.write("mnist.yaml", doc("mnist"), doc("other"))
    before = d.sync().workloads

    broken = doc("mnist")
    broken["spec"]["replicas"] = {"perDevice": -1}
    d.write("mnist.yaml", broken, doc("other"))
    for _ in range(2):  # and again: still kept while the file stays invalid
        result = d.sync()
        assert result.workloads == before
        problem = only_problem(result)
        assert (problem.file, problem.workload, problem.reason) == (
            "mnist.yaml",
            "",
            "InvalidManifest",
        )
        assert "mnist.yaml" in problem.message
        assert "documents[0].spec.replicas.perDevice" in problem.message
        assert not result.retryable


def test_invalid_new_file_gives_nothing(d: Dir) -> None:
    d.write("bad.yaml", {"apiVersion": API_VERSION, "kind": "ModelDeployment"})
    result = d.sync()
    assert result.workloads == {}
    problem = only_problem(result)
    assert (problem.file, problem.reason) == ("bad.yaml", "InvalidManifest")
    assert "metadata: required field is missing" in problem.message


def test_missing_model_file_keeps_the_previous_version(d: Dir) -> None:
    d.model("mnist")
    d.write("mnist.yaml", doc("mnist"))
    before = d.sync().workloads[WorkloadName("mnist")]

    v2 = doc("mnist", path="mnist-v2.onnx")
    v2["spec"]["model"]["version"] = "2.0"
    d.write("mnist.yaml", v2)
    result = d.sync()
    assert result.workloads == {"mnist": before}
    problem = only_problem(result)
    assert (problem.file, problem.workload, problem.reason) == (
        "mnist.yaml",
        "mnist",
        "ArtifactNotFound",
    )
    assert "spec.model.path" in problem.message and "mnist-v2.onnx" in problem.message
    assert result.retryable

    sha2 = d.model("mnist-v2", 1)  # the file appears: the next sync takes it
    result = d.sync()
    assert result.problems == () and not result.retryable
    w = result.workloads[WorkloadName("mnist")]
    assert (w.sha256, w.deployment.spec.model.version) == (sha2, "2.0")


def test_missing_model_file_of_a_new_workload(d: Dir) -> None:
    d.write("new.yaml", doc("new"))
    result = d.sync()
    assert result.workloads == {}
    assert only_problem(result).reason == "ArtifactNotFound"
    assert result.retryable


@pytest.mark.parametrize(
    ("model_fields", "reason", "message"),
    [
        ({"sha256": "0" * 64}, "DigestMismatch", "the manifest pins " + "0" * 64),
        ({"path": None}, "ModelPathMissing", "spec.model.path: required for a static manifest"),
        ({"path": "notes.onnx"}, "NotAnOnnxModel", "is not an ONNX model file"),
    ],
    ids=["pinned digest differs", "no model path", "not an onnx file"],
)
def test_artifact_refused_is_not_retryable(
    d: Dir, model_fields: dict[str, Any], reason: str, message: str
) -> None:
    d.model("mnist")
    (d.path / "notes.onnx").write_text("plain text")
    manifest = doc("mnist", **model_fields)
    if model_fields.get("path", "") is None:
        del manifest["spec"]["model"]["path"]
    d.write("mnist.yaml", manifest)
    result = d.sync()
    assert result.workloads == {}
    problem = only_problem(result)
    assert (problem.workload, problem.reason) == ("mnist", reason)
    assert message in problem.message
    assert not result.retryable
    assert d.store.digests() == set()


def test_pinned_digest_that_matches(d: Dir) -> None:
    sha = d.model("mnist")
    d.write("mnist.yaml", doc("mnist", sha256=sha.upper()))
    assert d.sync().workloads[WorkloadName("mnist")].sha256 == sha


def test_changed_model_file_is_ingested_again(d: Dir) -> None:
    first = d.model("mnist", 0)
    d.write("mnist.yaml", doc("mnist"))
    assert d.sync().workloads[WorkloadName("mnist")].sha256 == first
    second = d.model("mnist", 1)
    assert d.sync().workloads[WorkloadName("mnist")].sha256 == second


def test_model_ingested_again_when_its_blob_is_gone(d: Dir) -> None:
    sha = d.model("mnist")
    d.write("mnist.yaml", doc("mnist"))
    d.sync()
    d.store.collect_garbage(set())
    assert d.sync().workloads[WorkloadName("mnist")].sha256 == sha
    assert d.store.has(sha)


def test_deleting_a_file_removes_its_workloads(d: Dir) -> None:
    d.model("a")
    d.model("b")
    d.write("a.yaml", doc("a"))
    d.write("b.yaml", doc("b"))
    assert set(d.sync().workloads) == {"a", "b"}
    (d.path / "a.yaml").unlink()
    result = d.sync()
    assert (set(result.workloads), result.files) == ({"b"}, ("b.yaml",))


def test_deleting_an_invalid_file_removes_what_it_kept(d: Dir) -> None:
    d.model("a")
    d.write("a.yaml", doc("a"))
    d.sync()
    (d.path / "a.yaml").write_text("spec: [")
    assert set(d.sync().workloads) == {"a"}
    (d.path / "a.yaml").unlink()
    assert d.sync().workloads == {}


def test_duplicate_names_across_files(d: Dir) -> None:
    d.model("mnist")
    d.model("other", 1)
    d.write("a.yaml", doc("mnist"))
    d.write("b.yaml", doc("mnist", model="other"))
    result = d.sync()
    assert result.workloads[WorkloadName("mnist")].source == "a.yaml"
    problem = only_problem(result)
    assert (problem.file, problem.workload, problem.reason) == ("b.yaml", "mnist", "DuplicateName")
    assert problem.message == "metadata.name: 'mnist' is already defined in a.yaml"


def test_duplicate_model_names(d: Dir) -> None:
    d.model("shared")
    d.write("one.yaml", doc("one", model="shared"))
    d.write("two.yaml", doc("two", model="shared"))
    result = d.sync()
    assert list(result.workloads) == ["one"]
    problem = only_problem(result)
    assert (problem.file, problem.workload, problem.reason) == (
        "two.yaml",
        "two",
        "DuplicateModelName",
    )
    assert problem.message == "spec.model.name: 'shared' is already served by 'one'"
    assert problem.to_json()["reason"] == "DuplicateModelName"


LOADER_CHOKES = {
    "an integer of 5001 digits": "spec:\n  replicas: {perDevice: " + "9" * 5001 + "}\n",
    "the same in JSON": '{"spec": {"replicas": {"perDevice": ' + "9" * 5001 + "}}}",
    "a python tag": "metadata: !!python/object/apply:os.system ['true']\n",
    "an unknown tag": "metadata: !secret {name: x}\n",
    "a date out of range": "metadata: {name: 2026-02-30}\n",
    "an unhashable key": "? [a, b]\n: c\n",
    "laughing anchors": "a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10))
    + "metadata: {name: *a9}\n",
}  # fmt: skip


@pytest.mark.parametrize("text", LOADER_CHOKES.values(), ids=LOADER_CHOKES.keys())
def test_a_file_the_loader_chokes_on_blocks_no_other_file(d: Dir, text: str) -> None:
    d.model("mnist")
    d.model("other")
    d.write("mnist.yaml", doc("mnist"))
    d.write("other.yaml", doc("other"))
    before = d.sync().workloads
    (d.path / "mnist.yaml").write_text(
        "apiVersion: edgefleet.io/v1\nkind: ModelDeployment\n" + text
    )
    changed = doc("other")
    changed["spec"]["replicas"] = {"perDevice": 2}
    d.write("other.yaml", changed)  # the other file's update goes through
    for _ in range(2):
        result = d.sync()
        problem = only_problem(result)
        assert (problem.file, problem.workload, problem.reason) == (
            "mnist.yaml",
            "",
            "InvalidManifest",
        )
        assert "mnist.yaml" in problem.message
        assert result.workloads[WorkloadName("mnist")] == before[WorkloadName("mnist")]
        other = result.workloads[WorkloadName("other")]
        assert other.deployment.spec.replicas.per_device == 2


def test_a_model_that_cannot_be_stored_is_that_workloads_problem(
    d: Dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    d.model("mnist")
    d.model("other", 1)
    d.write("mnist.yaml", doc("mnist"))
    d.write("other.yaml", doc("other"))
    real = d.store.ingest_stream

    def failing_disk(stream: Any, **kw: Any) -> str:
        if "mnist" in kw["origin"]:
            raise OSError(5, "Input/output error")
        return real(stream, **kw)

    monkeypatch.setattr(d.store, "ingest_stream", failing_disk)
    result = d.sync()
    problem = only_problem(result)
    assert (problem.file, problem.workload, problem.reason) == (
        "mnist.yaml",
        "mnist",
        "IngestFailed",
    )
    assert "Input/output error" in problem.message
    assert result.retryable
    assert list(result.workloads) == ["other"]


def test_a_model_larger_than_the_free_disk_is_refused_and_leaves_nothing(
    small_disk: Path, tmp_path: Path, models: tuple[bytes, bytes]
) -> None:
    d = Dir(small_disk, models, max_bytes=1 << 30)  # manifests, store, gate on the small disk
    d.model("mnist")
    d.write("mnist.yaml", doc("mnist"))
    big = tmp_path / "big.onnx"  # on the big disk: only the store's copy goes to the small one
    build_mlp(big, (1024, 2048, 2048, 8), seed=3)  # ~25 MB
    d.write("big.yaml", doc("big", path=str(big)))
    result = d.sync()
    problem = only_problem(result)
    assert (problem.file, problem.workload, problem.reason) == (
        "big.yaml",
        "big",
        "InsufficientDisk",
    )
    size = big.stat().st_size
    assert (
        f"needs {size} bytes on the device's disk (0 to download, {size} for the store's copy)"
        in problem.message
    )
    assert "bytes are free" in problem.message
    assert list(result.workloads) == ["mnist"]  # the other file is applied
    assert list((small_disk / "artifacts" / "staging").iterdir()) == []


def baseline(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "SecurityBaseline",
        "metadata": {"name": "fleet"},
        "spec": spec,
    }


def test_a_static_baselines_hub_only_fields_are_reported_not_ignored(d: Dir) -> None:
    d.model("a")
    d.write("a.yaml", doc("a"), baseline(requireTpm=True, requireSandbox=True))
    result = d.sync()
    assert set(result.workloads) == {"a"}  # the file's other documents apply
    problem = only_problem(result)
    assert (problem.file, problem.reason) == ("a.yaml", "NotSupported")
    assert "spec.requireTpm not supported in a device's static manifests" in problem.message
    assert "requireSandbox" not in problem.message  # edged enforces that one itself
    d.write("a.yaml", doc("a"), baseline(requireSandbox=True))
    assert d.sync().problems == ()


def test_a_static_baselines_publishers_are_reported_not_ignored(d: Dir) -> None:
    d.model("a")
    d.write("a.yaml", doc("a"), baseline(publishers=[]))
    problem = only_problem(d.sync())
    assert (
        problem.reason == "NotSupported" and "spec.publishers is not supported" in problem.message
    )
