"""A blob a worker refused is checked in a real store: quarantined when its bytes changed,
left where it is when intact; either way its workload looks again."""

from __future__ import annotations

import io
from pathlib import Path

from asynctesting import async_test

from edged.state.quarantining import BlobQuarantine
from edged.workloads import WorkloadName
from edgefleet.artifacts.storing import ArtifactStore


def flip_a_bit(blob: Path) -> None:
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[3] ^= 0x01
    blob.write_bytes(bytes(data))
    blob.chmod(0o444)


@async_test
async def test_a_rotten_blob_is_quarantined_and_its_workload_looks_again(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    sha = store.ingest_stream(
        io.BytesIO(b"model bytes"), origin="test", name="m", version="1", verifiers=[]
    )
    enqueued: list[WorkloadName] = []
    blobs = BlobQuarantine(store, enqueue=enqueued.append, clock=lambda: 1000.0)

    await blobs.check(WorkloadName("camera"), sha)  # intact: stays in the store
    assert store.has(sha) and not blobs.holds(sha)
    assert enqueued == ["camera"]

    flip_a_bit(store.path_for(sha))
    await blobs.check(WorkloadName("camera"), sha)
    assert not store.has(sha) and blobs.holds(sha)
    assert (tmp_path / "artifacts" / "quarantine" / f"{sha}.1000").is_file()
    assert enqueued == ["camera", "camera"]  # its next plan finds the artifact missing
