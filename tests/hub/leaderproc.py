"""A replica for the leader election tests, as its own process (kill -9, SIGSTOP):
``python leaderproc.py ENDPOINT NAMESPACE NAME TTL``. It campaigns with an :class:`Elector` and,
while it leads, a controller writes ``/ticks/NAME`` (a counter) through a :class:`FencedStore`
every 50 ms. It prints one line per fact the test reads: "leading TERM", "refused ERROR",
"stepped down"."""

from __future__ import annotations

import asyncio
import signal
import sys

from edgefleet.errors import StoreError
from edgefleet.supervising import supervise, wait_for_stop
from hub.state.store.electing import Elector, FencedStore, LeaderOnly
from hub.state.store.etcd import EtcdStore


class Ticker:
    name = "ticker"

    def __init__(self, store: FencedStore, key: str) -> None:
        self.store = store
        self.key = key
        self.count = 0

    async def run(self, stop: asyncio.Event) -> None:
        print(f"leading {self.store.elector.term}", flush=True)
        while not await wait_for_stop(stop, 0.05):
            self.count += 1
            try:
                await self.store.put(self.key, str(self.count).encode())
            except StoreError as exc:
                print(f"refused {exc}", flush=True)
                raise
        print("stepped down", flush=True)


async def main(endpoint: str, namespace: str, name: str, ttl: float) -> None:
    store = await EtcdStore.open([endpoint], namespace=namespace, timeout=2)
    elector = Elector(store, identity=name, ttl=ttl)
    ticker = LeaderOnly(Ticker(FencedStore(store, elector), f"/ticks/{name}"), elector)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("started", flush=True)
    try:
        await supervise([elector, ticker], stop, restart_base=0.1, restart_max=0.5)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
