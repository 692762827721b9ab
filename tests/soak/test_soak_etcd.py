"""etcd's own figures in the soak report (soakrun.etcd_figures, soakreport._etcd_lives): read
from a real etcd's /metrics, and judged over the life the member's growth is judged on."""

from __future__ import annotations

import asyncio
from pathlib import Path

from etcdtesting import running_etcd
from soakreport import _etcd_lives, _etcd_ready, _growth
from soakrun import etcd_figures

from hub.state.store import EtcdStore


def test_a_members_figures_come_from_its_metrics_and_count_what_it_wrote(tmp_path: Path) -> None:
    with running_etcd(tmp_path / "etcd") as server:
        before = etcd_figures(server.endpoint)
        assert set(before) == {"entries", "wal_bytes", "snapshots", "heap_bytes"}, before

        async def write() -> None:
            store = await EtcdStore.open([server.endpoint], namespace="/soak-test")
            try:
                for i in range(20):
                    await store.put(f"/k{i}", b"x" * 10_000)
            finally:
                await store.close()

        asyncio.run(write())
        after = etcd_figures(server.endpoint)
        assert after["entries"] - before["entries"] >= 20
        assert after["wal_bytes"] - before["wal_bytes"] >= 200_000
        assert after["heap_bytes"] > 0


def test_the_figures_are_those_of_the_life_judged() -> None:
    samples = {
        "etcd-0": [
            {
                "t": 10.0,
                "pid": 1,
                "entries": 100,
                "wal_bytes": 0,
                "snapshots": 0,
                "heap_bytes": 50 * 2**20,
            },
            {
                "t": 50.0,
                "pid": 2,
                "entries": 10,
                "wal_bytes": 1_000_000,
                "snapshots": 0,
                "heap_bytes": 60 * 2**20,
            },
            {
                "t": 950.0,
                "pid": 2,
                "entries": 4_010,
                "wal_bytes": 41_000_000,
                "snapshots": 1,
                "heap_bytes": 90 * 2**20,
            },
        ],
        "etcd-1": [{"t": 10.0, "pid": 7, "entries": 1, "wal_bytes": 1, "snapshots": 0}],
    }
    growth = {"etcd-0": {"pid": 2}, "etcd-1": {"pid": 7}}
    assert _etcd_lives(samples, growth) == {
        "etcd-0": {"seconds": 900.0, "entries": 4_000, "wal_mb": 40.0, "snapshots": 1,
                   "heap_mib": [60.0, 90.0]},
    }  # fmt: skip


def test_an_etcd_members_growth_counts_from_when_it_answered() -> None:
    """Seed 62's run E: etcd-2, its data on the slow disk, took 94 s to load its snapshot
    and WAL after a restart; its growth counted the load (18 -> 280 MiB) rather than what it
    grew once serving (242 -> 280 MiB)."""
    mib = 2**20
    resources = {
        "etcd-2": [(t, 9, (18 if t < 100 else 242 + (t - 100) // 25) * mib, 30)
                   for t in range(0, 1100, 10)],
    }  # fmt: skip
    loading = _growth(resources)["etcd-2"]
    assert loading["rss_growth_mib"] > 200
    ready = _growth(resources, _etcd_ready({"etcd-2": [{"t": 100.0, "pid": 9}]}))["etcd-2"]
    assert ready["rss_mib"][0] == 242.0 and ready["rss_growth_mib"] < 50
