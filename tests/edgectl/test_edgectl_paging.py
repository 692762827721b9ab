"""``edgectl get`` of a list larger than one gRPC message (issue 29, item 7): the real edgectl
console script against a real hub (``hubserving.ThreadedHub``: mutual TLS, SQLite, gRPC's 4 MiB
message limit) holding six deployments of about 840 KB each, applied one by one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import orjson
import pytest
from edgectltesting import edgectl
from hubserving import AdminHub, ThreadedHub, make_hub_dir

from edgefleet.v1 import admin_pb2

NAMES = [f"big-{i}" for i in range(6)]


def _big(name: str) -> bytes:
    return orjson.dumps(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": name, "annotations": {"note": "x" * 840_000}},
            "spec": {
                "model": {"name": name, "version": "2.4.1"},  # one deployment per model
                "replicas": {"total": 1},
            },
        }
    )


async def _apply_each(hub: AdminHub) -> None:
    async with hub.channel() as channel:
        for name in NAMES:  # each accepted on its own, as in the issue
            await hub.stub(channel).Apply(admin_pb2.ApplyRequest(documents=[_big(name)]))


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedHub]:
    paths = asyncio.run(make_hub_dir(tmp_path_factory.mktemp("paging") / "hub"))
    with ThreadedHub(paths) as threaded:
        assert threaded.hub is not None
        threaded.run(_apply_each(threaded.hub))
        yield threaded


def test_get_deployments_lists_six_large_deployments(large: ThreadedHub) -> None:
    """Failed with RESOURCE_EXHAUSTED "Sent message larger than max" before paging."""
    config = large.paths.admin_config
    out = edgectl(config, "get", "deployments")
    assert out.returncode == 0, out.stderr
    assert [line.split()[0] for line in out.stdout.splitlines()[1:]] == NAMES
    out = edgectl(config, "get", "deployments", "-o", "name", "--chunk-size", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f"modeldeployment/{n}" for n in NAMES]
    out = edgectl(config, "get", "deployments", "-o", "json")
    assert out.returncode == 0, out.stderr
    assert [d["metadata"]["name"] for d in orjson.loads(out.stdout)["items"]] == NAMES


def test_chunk_size_is_checked_and_zero_asks_for_one_response(large: ThreadedHub) -> None:
    config = large.paths.admin_config
    out = edgectl(config, "get", "deployments", "--chunk-size", "0")
    assert out.returncode == 1
    assert "RESOURCE_EXHAUSTED" in out.stderr and "--chunk-size" in out.stderr
    assert "Traceback" not in out.stderr
    for bad in ("-1", "ten"):
        out = edgectl(config, "get", "deployments", "--chunk-size", bad)
        assert out.returncode == 2 and "--chunk-size" in out.stderr, out.stderr
    out = edgectl(config, "get", "deployments", "big-0", "--chunk-size", "5")
    assert out.returncode == 2 and "--chunk-size applies to lists" in out.stderr
