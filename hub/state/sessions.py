"""The streams of connected devices: one :class:`Session` per device, found by name.

A session holds the newest desired state not yet sent (older ones are dropped: a device only
needs the latest), the attestation challenges and log requests to send (a log request's
answer resolves its future), and a close flag with its reason.
"""

from __future__ import annotations

import asyncio
import itertools

from hub.decide.desired import DesiredContent

MAX_LOG_REQUESTS = 4
"""Log requests waiting for one device's answer at once; more are refused (busy)."""
_request_ids = itertools.count(1)


class Session:
    """One connected device's stream: the newest unsent desired state, challenges, a close flag."""

    __slots__ = (
        "_wake",
        "challenges",
        "close_reason",
        "closed",
        "desired",
        "device",
        "log_answers",
        "log_requests",
        "sent_any",
        "serial",
    )

    def __init__(self, device: str, serial: str) -> None:
        self.device = device
        self.serial = serial
        self.desired: DesiredContent | None = None
        self.sent_any = False  # set by the stream once a desired state went out
        self.challenges: list[bytes] = []
        # (request id, workload, tail) to send; the futures their answers resolve, by id
        self.log_requests: list[tuple[int, str, int]] = []
        self.log_answers: dict[int, asyncio.Future[list[str]]] = {}
        self.closed = False
        self.close_reason = ""
        self._wake = asyncio.Event()

    def offer(self, content: DesiredContent) -> None:
        self.desired = content
        self._wake.set()

    def challenge(self, nonce: bytes) -> None:
        self.challenges.append(nonce)
        self._wake.set()

    def request_logs(self, workload: str, tail: int) -> asyncio.Future[list[str]]:
        """Ask the device for its recent log lines; the future gets them (or is cancelled
        when the stream ends). RuntimeError when too many are waiting already."""
        if len(self.log_answers) >= MAX_LOG_REQUESTS:
            raise RuntimeError(f"{len(self.log_answers)} log requests are waiting already")
        request_id = next(_request_ids)
        answer: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self.log_answers[request_id] = answer
        answer.add_done_callback(lambda _: self.log_answers.pop(request_id, None))
        self.log_requests.append((request_id, workload, tail))
        self._wake.set()
        return answer

    def answer_logs(self, request_id: int, lines: list[str]) -> None:
        """The device answered; an answer nobody waits for (any more) is dropped."""
        answer = self.log_answers.get(request_id)
        if answer is not None and not answer.done():
            answer.set_result(lines)

    def close(self, reason: str) -> None:
        self.closed = True
        self.close_reason = reason
        for answer in list(self.log_answers.values()):
            answer.cancel()
        self._wake.set()

    async def wait(self) -> None:
        await self._wake.wait()
        self._wake.clear()


class Sessions:
    """The open session of each connected device; a newer stream from a device replaces its
    session (the old one is closed)."""

    def __init__(self) -> None:
        self._by_device: dict[str, Session] = {}

    def open(self, device: str, serial: str) -> Session:
        old = self._by_device.get(device)
        if old is not None:
            old.close("replaced by a newer stream from the same device")
        session = Session(device, serial)
        self._by_device[device] = session
        return session

    def release(self, session: Session) -> None:
        if self._by_device.get(session.device) is session:
            del self._by_device[session.device]

    def get(self, device: str) -> Session | None:
        return self._by_device.get(device)

    def __len__(self) -> int:
        return len(self._by_device)

    def names(self) -> list[str]:
        return list(self._by_device)
