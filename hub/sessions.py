"""The streams of connected devices: one :class:`Session` per device, found by name.

A session holds the newest desired state not yet sent (older ones are dropped: a device only
needs the latest), the attestation challenges to send, and a close flag with its reason.
"""

from __future__ import annotations

import asyncio

from hub.desired import DesiredContent


class Session:
    """One connected device's stream: the newest unsent desired state, challenges, a close flag."""

    __slots__ = (
        "_wake",
        "challenges",
        "close_reason",
        "closed",
        "desired",
        "device",
        "sent_any",
        "serial",
    )

    def __init__(self, device: str, serial: str) -> None:
        self.device = device
        self.serial = serial
        self.desired: DesiredContent | None = None
        self.sent_any = False  # set by the stream once a desired state went out
        self.challenges: list[bytes] = []
        self.closed = False
        self.close_reason = ""
        self._wake = asyncio.Event()

    def offer(self, content: DesiredContent) -> None:
        self.desired = content
        self._wake.set()

    def challenge(self, nonce: bytes) -> None:
        self.challenges.append(nonce)
        self._wake.set()

    def close(self, reason: str) -> None:
        self.closed = True
        self.close_reason = reason
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
