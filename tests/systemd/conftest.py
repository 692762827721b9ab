"""systemd integration: sd_notify, unit files, the default config.

What is real: AF_UNIX datagram sockets standing in for systemd's notify socket (bound by the
test, read by a thread that stamps each datagram), real ``edged run`` and ``hub serve``
processes, and the machine's ``systemd-analyze verify`` for the unit files. Nothing is faked;
systemd itself is not started.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from systemdtesting import NotifySocket, open_notify_socket


@pytest.fixture
def notify_socket() -> Iterator[NotifySocket]:
    with open_notify_socket() as ns:
        yield ns
