"""Federation scenarios' shared pieces: deadlines, whether a device serves, forging objects into a
regional hub's store, and the TUF files a region serves."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fleet import HubProcess
from harness import Edged

from edgefleet.demo import TINY_MLP, build_mlp

FORGED = {
    "apiVersion": "edgefleet.io/v1",
    "kind": "ModelDeployment",
    "metadata": {"name": "forged"},
    "spec": {
        "model": {"name": "forged", "version": "1.0.0"},
        "runtime": {"executionProviders": ["CPUExecutionProvider"]},
        "replicas": {"perDevice": 1},
    },
}


SLACK = 90.0  # deadlines for a loaded machine, not timed assertions


def serving(e: Edged, name: str = "det", version: str | None = None) -> bool:
    if e.proc is None or e.proc.poll() is not None:
        return False
    try:
        w = e.workload(name)
    except (KeyError, StopIteration, OSError):
        return False
    if version is not None and w.get("model", {}).get("version") != version:
        return False
    return any(r.get("ready") for r in w.get("replicas", []))


def forge_into_region(data: Path, tmp_path: Path) -> None:
    """What a compromised regional hub could do: put an artifact and metadata signed by a key
    of its own, and a deployment using it, into its store (the hub is stopped)."""
    from edgefleet.api import parse_manifest
    from edgefleet.artifacts.storing import ArtifactStore
    from edgefleet.trust import signing
    from hub.state import storekeys
    from hub.state.store import Put, open_hub_store

    model = tmp_path / "forged.onnx"
    build_mlp(model, TINY_MLP, seed=7)
    signing.generate_key_pair(tmp_path / "attacker")
    _, envelope = signing.sign_artifact(
        model, name="forged", version="1.0.0", keys=[tmp_path / "attacker.key"]
    )
    sha256 = ArtifactStore(data / "blobs").ingest_file(
        model, name="forged", version="1.0.0", verifiers=[]
    )
    record = storekeys.ModelRecord(
        name="forged",
        version="1.0.0",
        sha256=sha256,
        length=model.stat().st_size,
        envelope=envelope.to_bytes(),
        pushed_at=0.0,
    )
    manifest = parse_manifest(dict(FORGED)).to_dict()

    async def write() -> None:
        store = await open_hub_store(None, data_dir=data)
        try:
            await store.txn(
                [],
                [
                    Put(storekeys.model_key("forged", "1.0.0"), storekeys.dumps(record.to_json())),
                    Put(
                        storekeys.object_key("ModelDeployment", "forged"),
                        storekeys.object_value(manifest, 0.0),
                    ),
                ],
            )
        finally:
            await store.close()

    asyncio.run(write())


def served_files(region: HubProcess) -> dict[str, bytes]:
    d = region.data / "tuf-relay" / "current" / "files"
    return {p.name: p.read_bytes() for p in d.iterdir()} if d.is_dir() else {}
