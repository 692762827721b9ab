"""The HTTP server, for real: an HttpServer on a Unix socket in a temporary directory, in a
fresh asyncio loop per test, spoken to by a raw asyncio client that writes bytes and reads
the responses back. Only the request handlers are in-test stand-ins (answering at once, or
holding a Response to answer later). Tests fail on leaked tasks.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory path: a Unix socket path must fit in 108 bytes."""
    with tempfile.TemporaryDirectory(prefix="ef-http-") as d:
        yield Path(d)
