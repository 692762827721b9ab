"""The hub's store layer against raw baselines, same run (see /work/shared/BENCHMARKS.md).

Writes/s: ``N`` puts of a 200-byte value to distinct keys, ``C`` at a time (``--concurrency``):

* SQLite: ``SqliteStore.put`` (one fsynced transaction each: WAL, synchronous=FULL, the key's
  row, its history row and the revision) against a raw ``sqlite3`` loop making the same
  durable upsert, one transaction each, same pragmas, on the same disk;
* etcd: ``EtcdStore.put`` (an etcd Txn) against the raw etcd client (aetcd's ``Client.put``) on
  the same etcd (one member on loopback, started here; Debian's etcd-server).

Watch events/s: a watcher on the prefix while ``N`` puts are made; events/s = ``N`` / the time
from the first put until the watcher has every event. SQLite: against the raw sqlite3 write
loop (a watch cannot deliver faster than the writes it reports); etcd: against aetcd's own
``watch_prefix`` with aetcd's puts, same setup.

Each figure is the median of ``--repeat`` runs; ratios are layer / raw (target >= 0.5).
Usage: ``python bench/store.py [--writes 1000] [--concurrency 1] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for path in (REPO, REPO / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import aetcd  # noqa: E402
from etcdtesting import EtcdServer  # noqa: E402  (tests/etcdtesting.py: etcd on loopback)

from hub.state.store import EtcdStore, SqliteStore  # noqa: E402

VALUE = b"x" * 200


async def _in_waves(n: int, concurrency: int, put: Callable[[int], Awaitable[object]]) -> float:
    started = time.perf_counter()
    for first in range(0, n, concurrency):
        await asyncio.gather(*(put(i) for i in range(first, min(n, first + concurrency))))
    return n / (time.perf_counter() - started)


def raw_sqlite_writes(path: Path, n: int) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
    started = time.perf_counter()
    for i in range(n):
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (f"/devices/d{i:06d}", VALUE))
        db.execute("COMMIT")
    rate = n / (time.perf_counter() - started)
    db.close()
    return rate


async def layer_sqlite_writes(path: Path, n: int, concurrency: int) -> float:
    store = await SqliteStore.open(path)
    try:
        return await _in_waves(n, concurrency, lambda i: store.put(f"/devices/d{i:06d}", VALUE))
    finally:
        await store.close()


async def _watched(
    n: int,
    watch: Callable[[], Awaitable[object]],
    write_all: Callable[[], Awaitable[object]],
) -> float:
    """``watch()`` returns once it has seen ``n`` events; events/s from the first write on."""
    watcher = asyncio.ensure_future(watch())
    await asyncio.sleep(0.2)  # the watch is set up before the first write
    started = time.perf_counter()
    await write_all()
    await watcher
    return n / (time.perf_counter() - started)


async def layer_watch(store: SqliteStore | EtcdStore, n: int, concurrency: int) -> float:
    prefix = f"/w{time.monotonic_ns()}/"

    async def watch() -> None:
        seen = 0
        async for _ in store.watch(prefix):
            seen += 1
            if seen == n:
                return

    async def write_all() -> None:
        await _in_waves(n, concurrency, lambda i: store.put(f"{prefix}{i:06d}", VALUE))

    return await _watched(n, watch, write_all)


async def raw_etcd_writes(client: aetcd.Client, n: int, concurrency: int) -> float:
    prefix = f"/raw{time.monotonic_ns()}/".encode()
    return await _in_waves(n, concurrency, lambda i: client.put(prefix + b"%06d" % i, VALUE))


async def layer_etcd_writes(store: EtcdStore, n: int, concurrency: int) -> float:
    prefix = f"/layer{time.monotonic_ns()}/"
    return await _in_waves(n, concurrency, lambda i: store.put(f"{prefix}{i:06d}", VALUE))


async def raw_etcd_watch(client: aetcd.Client, n: int, concurrency: int) -> float:
    prefix = f"/raww{time.monotonic_ns()}/".encode()
    watch = await client.watch_prefix(prefix)

    async def consume() -> None:
        seen = 0
        async for _ in watch:
            seen += 1
            if seen == n:
                await watch.cancel()
                return

    async def write_all() -> None:
        await _in_waves(n, concurrency, lambda i: client.put(prefix + b"%06d" % i, VALUE))

    return await _watched(n, consume, write_all)


def _line(what: str, layer: list[float], raw: list[float]) -> str:
    ratios = [a / b for a, b in zip(layer, raw, strict=True)]
    return (
        f"{what:28} layer {statistics.median(layer):9.0f}/s   raw {statistics.median(raw):9.0f}/s"
        f"   ratio {statistics.median(ratios):.2f}  (runs: {', '.join(f'{r:.2f}' for r in ratios)})"
    )


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--writes", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    n, c = args.writes, args.concurrency
    results: dict[str, tuple[list[float], list[float]]] = {}

    def note(what: str, layer: float, raw: float) -> None:
        results.setdefault(what, ([], []))
        results[what][0].append(layer)
        results[what][1].append(raw)

    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        d = Path(tmp)
        etcd = EtcdServer(d / "etcd").start()
        try:
            host, port = etcd.endpoint.split(":")
            client = aetcd.Client(host=host, port=int(port))
            await client.connect()
            store = await EtcdStore.open([etcd.endpoint])
            for run in range(args.repeat):
                raw = await asyncio.to_thread(raw_sqlite_writes, d / f"raw{run}.db", n)
                layer = await layer_sqlite_writes(d / f"layer{run}.db", n, c)
                note("sqlite writes", layer, raw)
                sq = await SqliteStore.open(d / f"watch{run}.db")
                try:
                    note("sqlite watch events", await layer_watch(sq, n, c), raw)
                finally:
                    await sq.close()
                note(
                    "etcd writes",
                    await layer_etcd_writes(store, n, c),
                    await raw_etcd_writes(client, n, c),
                )
                note(
                    "etcd watch events",
                    await layer_watch(store, n, c),
                    await raw_etcd_watch(client, n, c),
                )
            await store.close()
            await client.close()
        finally:
            etcd.stop()
    print(f"store layer vs raw, {n} writes of {len(VALUE)} B, concurrency {c}, median of "
          f"{args.repeat} runs (target ratio >= 0.5)")  # fmt: skip
    for what, (layer, raw) in results.items():
        print(_line(what, layer, raw))


if __name__ == "__main__":
    asyncio.run(main())
