"""Accepting the merge of the sources into a real DesiredState file, and collecting the
artifacts nobody uses any more from a real store (only while no source is syncing)."""

from __future__ import annotations

import io
from pathlib import Path

from edged.state.accepting import Acceptor
from edged.state.collecting import ArtifactCollector, artifacts_in_use
from edged.state.desired import DesiredState
from edged.state.merging import HUB_SOURCE, MergedState, SourceState
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import API_VERSION, ModelDeployment, parse_manifest
from edgefleet.artifacts.storing import ArtifactStore


def workload(name: str, source: str, sha256: str = "a" * 64) -> DesiredWorkload:
    dep = parse_manifest(
        {
            "apiVersion": API_VERSION,
            "kind": "ModelDeployment",
            "metadata": {"name": name},
            "spec": {"model": {"name": name, "version": "1.0"}},
        }
    )
    assert isinstance(dep, ModelDeployment)
    return DesiredWorkload(dep, sha256, source)


CAMERA, SHELF = workload("camera", "camera.yaml"), workload("shelf", HUB_SOURCE)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[MergedState, set[WorkloadName]]] = []

    def __call__(self, merged: MergedState, changed: set[WorkloadName]) -> None:
        self.calls.append((merged, changed))


def test_a_restart_keeps_the_static_workloads_until_the_directory_is_read(tmp_path: Path) -> None:
    path = tmp_path / "desired.json"
    before = DesiredState(path)
    before.replace({CAMERA.name: CAMERA, SHELF.name: SHELF})
    desired = DesiredState(path)
    desired.load()
    hub = SourceState({SHELF.name: SHELF})
    accepted = Recorder()
    acceptor = Acceptor(desired, static_read=False, hub=lambda: hub, on_accepted=accepted)

    acceptor.accept()  # the hub's state, before the static source has read anything
    assert desired.workloads == {CAMERA.name: CAMERA, SHELF.name: SHELF}
    assert (desired.generation, accepted.calls[-1][1]) == (1, set())

    acceptor.static_read({}, ())  # the manifest file is gone
    assert desired.workloads == {SHELF.name: SHELF}
    assert (desired.generation, accepted.calls[-1][1]) == (2, {"camera"})
    reloaded = DesiredState(path)
    reloaded.load()
    assert reloaded.workloads == desired.workloads  # persisted before it is handed on


def test_without_a_static_source_only_the_hub_counts(tmp_path: Path) -> None:
    desired = DesiredState(tmp_path / "desired.json")
    desired.replace({CAMERA.name: CAMERA})
    accepted = Recorder()
    hub = SourceState({SHELF.name: SHELF})
    Acceptor(desired, static_read=True, hub=lambda: hub, on_accepted=accepted).accept()
    assert desired.workloads == {SHELF.name: SHELF}
    assert accepted.calls[-1][1] == {"camera", "shelf"}


def test_garbage_is_collected_only_when_no_source_syncs(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    shas = [
        store.ingest_stream(io.BytesIO(data), origin="test", name="m", version="1", verifiers=[])
        for data in (b"kept", b"dropped")
    ]
    collector = ArtifactCollector(store, in_use=lambda: {shas[0]})
    with collector.syncing():
        collector.collect()
        assert store.digests() == set(shas)
    collector.collect()
    assert store.digests() == {shas[0]}


def test_what_the_collector_keeps() -> None:
    a, b, c, d, e = (ch * 64 for ch in "abcde")
    with_extras = DesiredWorkload(
        workload("shelf", HUB_SOURCE, b).deployment, b, HUB_SOURCE, extras={"labels": c}
    )
    desired = {CAMERA.name: CAMERA, with_extras.name: with_extras}
    cases = [
        # (desired, held by a source, running, kept)
        ({}, (), (), set()),
        (desired, (), (), {a, b, c}),  # models and their extras
        ({}, (d,), (), {d}),  # the hub's previous version: going back needs no download
        ({}, (), (e, e), {e}),  # an old revision still draining
        (desired, (d,), (e,), {a, b, c, d, e}),
    ]
    for workloads, held, running, kept in cases:
        assert artifacts_in_use(workloads, held=held, running=running) == kept
