"""What a worker reports it answered on the connections edged handed it (``ANSWERED``),
held to bounds before it counts (tables, hostile reports among them); and edged's end of the
hand-off socket holding what a worker says of its connections to what it was handed."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import struct

import pytest

from edged.runtime.directstats import ANSWER, more_than_batched, parse
from edged.runtime.framing import CONN_ID
from edged.runtime.handoff import HandoffLink


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
    "more than a batch": (_frame(*[(200, 0.001)] * 9), 8, 10.0, None, "9 answers in one report"),
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
    got, reason = parse(payload, max_batch=batch, age_s=age)
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
        link = HandoffLink(ours, returned.append)
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
