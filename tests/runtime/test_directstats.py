"""What a worker reports it answered on the connections edged handed it (``ANSWERED``),
held to bounds before it counts (tables, hostile reports among them); and edged's end of the
hand-off socket holding what a worker says of its connections to what it was handed."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from workerprocess import launch_spec

from edged.runtime import processes
from edged.runtime.channel import ReplicaChannel
from edged.runtime.directstats import ANSWER, more_than_batched, parse
from edged.runtime.framing import CONN_ID
from edged.runtime.handoff import HandoffLink
from edged.runtime.launching import SandboxSpec
from edged.workloads import WorkloadName
from edgefleet.api import Probe, Probes


def _frame(*answers: tuple[int, float]) -> bytes:
    return b"".join(ANSWER.pack(s, t) for s, t in answers)


REPORTS: dict[str, tuple[bytes, int, float, list[tuple[int, float]] | None, str]] = {
    "a batch's answers": (
        _frame((200, 0.001), (200, 0.002)),
        8,
        10.0,
        [(200, 0.001), (200, 0.002)],
        "",
    ),
    "a refused request": (_frame((400, 0.0)), 8, 10.0, [(400, 0.0)], ""),
    "empty": (b"", 8, 10.0, None, "an ANSWERED frame of 0 bytes"),
    "a torn entry": (_frame((200, 0.1)) + b"\x00", 8, 10.0, None, "an ANSWERED frame of 7 bytes"),
    "more than a report holds": (
        _frame(*[(200, 0.001)] * 1025),
        8,
        10.0,
        None,
        "1025 answers in one report",
    ),
    "a status no answer has": (_frame((99, 0.001)), 8, 10.0, None, "status 99"),
    "a status past 599": (_frame((600, 0.001)), 8, 10.0, None, "status 600"),
    "negative seconds": (_frame((200, -1.0)), 8, 10.0, None, "-1.0 s held"),
    "NaN seconds": (_frame((200, math.nan)), 8, 10.0, None, "nan s held"),
    "infinite seconds": (_frame((200, math.inf)), 8, 10.0, None, "inf s held"),
    "longer than the process lived": (_frame((200, 60.0)), 8, 10.0, None, "60.0 s held"),
}


@pytest.mark.parametrize(
    ("payload", "batch", "age", "want", "why"), REPORTS.values(), ids=REPORTS.keys()
)
def test_parse(payload: bytes, batch: int, age: float, want: object, why: str) -> None:
    got, reason = parse(payload, age_s=age)
    if want is None:
        assert got is None
    else:
        assert got == [(s, pytest.approx(t)) for s, t in want]  # type: ignore[attr-defined]
    assert reason.startswith(why) and bool(reason) == bool(why)


def test_more_successful_answers_than_batched_requests_is_refused() -> None:
    assert more_than_batched(8, 8) == ""
    assert more_than_batched(9, 8) == "9 successful answers, 8 requests batched"


def test_a_link_holds_a_worker_to_what_it_was_handed() -> None:
    async def run() -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        returned: list[socket.socket] = []
        link = HandoffLink(ours, lambda sock, _keep: returned.append(sock))
        client, server = socket.socketpair()
        conn_id = link.hand(server.fileno(), 1000)
        assert conn_id is not None and link.uid_of(conn_id) == 1000
        server.close()  # edged's copy: the worker's keeps the connection
        msg, fds, _, _ = socket.recv_fds(theirs, 16, 4)
        assert CONN_ID.unpack(msg) == (conn_id,) and len(fds) == 1
        # a worker returning an id it was never handed, or reporting one closed: nothing
        stray_a, stray_b = socket.socketpair()
        socket.send_fds(theirs, [CONN_ID.pack(conn_id + 7)], [stray_a.fileno()])
        stray_a.close()
        await asyncio.sleep(0.05)
        assert returned == [] and link.open == {conn_id: 1000}
        stray_b.settimeout(5)
        assert stray_b.recv(1) == b""  # the stray descriptor was closed, not kept
        assert not link.forget(conn_id + 7)
        # its own connection back: served again (the client still talks to it)
        socket.send_fds(theirs, [CONN_ID.pack(conn_id)], fds)
        os.close(fds[0])
        for _ in range(100):
            if returned:
                break
            await asyncio.sleep(0.01)
        assert len(returned) == 1 and link.open == {}
        returned[0].sendall(b"hello")
        assert client.recv(5) == b"hello"
        # once back, a second return of the same id is refused
        assert not link.forget(conn_id)
        # the worker gone: what it held is counted gone
        again = link.hand(returned[0].fileno(), None)
        assert again is not None
        theirs.close()
        for _ in range(100):
            if not link.alive:
                break
            await asyncio.sleep(0.01)
        assert not link.alive and link.open == {}
        assert link.hand(returned[0].fileno(), None) is None
        for s in (client, stray_b, returned[0]):
            s.close()

    asyncio.run(run())


def test_answer_struct_is_the_frames() -> None:
    from edged.runtime import framing

    assert ANSWER.format == framing.ANSWER.format
    assert struct.calcsize(ANSWER.format) == 6


# -- a replica counting a worker's direct answers --------------------------------------------------


class _Pool(SimpleNamespace):
    def __init__(self) -> None:
        super().__init__(results=[], answers=[])

    def record_result(self, rep: Any, status: int, seconds: float) -> None:
        self.results.append(status)

    def record_answers(self, rep: Any, delta: Any) -> None:
        self.answers.append(delta.count)

    def record_batches(self, rep: Any, delta: Any) -> None:
        pass

    def record_overlap(self, rep: Any, delta: Any) -> None:
        pass

    def notify(self, workload: Any) -> None:
        pass


def test_a_replica_counts_direct_answers_until_they_outnumber_its_batches(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    probes = Probes(
        readiness=Probe(timeout_s=1.0, period_s=5.0, failure_threshold=2),
        liveness=Probe(timeout_s=2.0, period_s=10.0, failure_threshold=3),
    )
    pool = _Pool()
    spec = launch_spec(tmp_path / "m.onnx", "0" * 64, SandboxSpec(mode="off"))
    rep = processes.Replica(pool, spec, WorkloadName("w"), "r1", 0, probes)  # type: ignore[arg-type]
    rep.channel = ReplicaChannel(rep)

    def pong(batches: int, requests: int) -> dict[str, Any]:
        return {"inflight": 0, "busy_s": 0.0, "batches": batches, "requests": requests,
                "compute_s": 0.0}  # fmt: skip

    with caplog.at_level(logging.WARNING, logger=processes.__name__):
        rep.on_direct_answers(_frame((200, 0.001), (200, 0.002), (400, 0.0)))
        rep.on_pong(pong(1, 2))  # two requests batched: the two 200s fit
        rep.on_direct_answers(_frame((200, 0.001)) * 3)
        rep.on_direct_answers(_frame((700, 0.001)))  # malformed: dropped, refused from now
        rep.on_direct_answers(_frame((200, 0.001)))  # not counted any more
        rep.on_pong(pong(1, 2))
    assert pool.results == [200, 200, 400, 200, 200, 200]
    assert pool.answers == [3, 3]
    refused = [r for r in caplog.records if r.msg == "worker direct answers not counted"]
    assert len(refused) == 1  # logged once per process


def test_a_replica_refuses_more_successes_than_batched_requests(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    probes = Probes(
        readiness=Probe(timeout_s=1.0, period_s=5.0, failure_threshold=2),
        liveness=Probe(timeout_s=2.0, period_s=10.0, failure_threshold=3),
    )
    pool = _Pool()
    spec = launch_spec(tmp_path / "m.onnx", "0" * 64, SandboxSpec(mode="off"))
    rep = processes.Replica(pool, spec, WorkloadName("w"), "r1", 0, probes)  # type: ignore[arg-type]
    rep.channel = ReplicaChannel(rep)
    with caplog.at_level(logging.WARNING, logger=processes.__name__):
        rep.on_direct_answers(_frame(*[(200, 0.001)] * 5))
        rep.on_pong({"inflight": 0, "busy_s": 0.0, "batches": 1, "requests": 4, "compute_s": 0.0})
        rep.on_direct_answers(_frame((200, 0.001)))
    assert pool.results == [200] * 5  # the sixth, after the lie was seen, is not counted
    assert [r.msg for r in caplog.records].count("worker direct answers not counted") == 1
