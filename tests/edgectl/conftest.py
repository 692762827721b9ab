"""edgectl tests. Real: the ``edgectl`` console script in subprocesses, a hub AdminService
(grpc.aio, mutual TLS with the certificates of ``hub init``, SQLite) on its own event loop in a
thread of the test process, seeded with two devices (cam-1 ready at site=retail, cam-2 at
site=depot). Faked: nothing; the devices are records written as a Sync stream would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from edgectltesting import seed
from hubserving import ThreadedHub, make_hub_dir


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedHub]:
    import asyncio

    paths = asyncio.run(make_hub_dir(tmp_path_factory.mktemp("edgectl") / "hub"))
    with ThreadedHub(paths) as threaded:
        assert threaded.hub is not None
        threaded.run(seed(threaded.hub))
        yield threaded


@pytest.fixture(scope="module")
def config(hub: ThreadedHub) -> Path:
    return hub.paths.admin_config
