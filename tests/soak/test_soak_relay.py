"""The soak harness's relays (``soaknet.Relay``: a device's or eu-r1's network namespace to the
host's loopback and back) close what they carry: a connection that ended, from either side,
leaves no descriptor and no thread in the harness. The relays once kept both sockets of every
connection ever carried, and the 1-hour run's harness ran out of descriptors (docs/soak.md).
The run also samples the harness's own descriptors and threads: a leak fails it, not aborts it."""

from __future__ import annotations

import os
import resource
import socket
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import psutil
import pytest
from polltesting import wait_for
from soaknet import Relay, _listen, _to
from soakreport import _thread_growth
from soakrun import Recorder, Sampler

CONNECTIONS = 150


@pytest.fixture
def upstream() -> Iterator[int]:
    """A server on the loopback: echoes until the client ends, or answers ``bye`` and ends."""
    ls = _listen(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)
                if data == b"bye":
                    return

    def accept() -> None:
        while True:
            try:
                conn, _ = ls.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield ls.getsockname()[1]
    ls.shutdown(socket.SHUT_RDWR)
    ls.close()


def settled(relay: Relay, fds: int, threads: int) -> bool:
    me = psutil.Process()
    return not relay.live and me.num_fds() <= fds and me.num_threads() <= threads


def test_a_relay_closes_every_connection_it_carried(upstream: int) -> None:
    relay = Relay(_listen(("127.0.0.1", 0)), _to("127.0.0.1", upstream)).start()
    port = relay.listener.getsockname()[1]
    me = psutil.Process()
    fds, threads = me.num_fds(), me.num_threads()
    for i in range(CONNECTIONS):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            # half end at the client, half at the server (the relay sees the upstream end)
            word = b"ping" if i % 2 else b"bye"
            c.sendall(word)
            assert c.recv(16) == word
            if word == b"bye":
                assert c.recv(16) == b""
    wait_for(
        lambda: settled(relay, fds, threads),
        30,
        "the relay to close every connection it carried",
        detail=lambda: (
            f"{len(relay.live)} sockets live, {me.num_fds()} fds (were {fds}), "
            f"{me.num_threads()} threads (were {threads})"
        ),
    )
    assert relay.carried == CONNECTIONS
    relay.close()


def test_closing_a_relay_ends_the_connections_it_carries(upstream: int) -> None:
    me = psutil.Process()
    fds, threads = me.num_fds(), me.num_threads()
    relay = Relay(_listen(("127.0.0.1", 0)), _to("127.0.0.1", upstream)).start()
    port = relay.listener.getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(5)]
    for c in clients:  # each carried, both ways
        c.sendall(b"ping")
        assert c.recv(16) == b"ping"
    assert len(relay.live) == 10
    relay.close()
    for c in clients:
        assert c.recv(16) == b""  # the relay ended it
        c.close()
    wait_for(
        lambda: settled(relay, fds, threads),
        30,
        "a closed relay to let go of everything",
        detail=lambda: f"{len(relay.live)} sockets live, {me.num_fds()} fds (were {fds})",
    )


def test_the_harness_samples_itself_and_stops_short_of_its_descriptor_limit() -> None:
    """Past half its descriptor limit the sampler says so (the run then ends its chaos and
    fails with the figures); below it, it only records RSS, descriptors and threads."""
    rec = Recorder()
    sampler = Sampler(SimpleNamespace(replicas=[], sim_devices=0), rec, None)  # type: ignore[arg-type]
    sampler._harness(1.0)
    assert sampler.harness_exhausted is None
    [(_, pid, rss, fds)] = sampler.resources["harness"]
    assert pid == os.getpid() and rss > 0 and fds == psutil.Process().num_fds()
    assert sampler.harness_threads == [(1.0, psutil.Process().num_threads())]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (2 * fds - 2, hard))  # fds is now over half
    try:
        sampler._harness(2.0)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert sampler.harness_exhausted is not None and "descriptors open" in sampler.harness_exhausted
    assert [e["kind"] for e in rec.events] == ["violation"]
    assert _thread_growth([(0.0, 9), (6.0, 10), (7.0, 10), (8.0, 10), (60.0, 40), (61.0, 41)]) == {
        "threads": [10, 40],
        "thread_growth": 30,
    }
