"""Who is at the other end of a loopback TCP connection (the uid that owns the client's
socket), as the shared-memory extension asks it: IPv4, IPv6, and a dual-stack listener's IPv4
client (an IPv4-mapped address); the end-to-end tests are in tests/e2e/test_shared_memory.py."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from edged.serving.sharedmemory import ShmError, names_region, tcp_peer_uid


def _pair(family: int, listen: str, connect: str) -> tuple[socket.socket, socket.socket]:
    server = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET6:
        server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    server.bind((listen, 0))
    server.listen(1)
    port = server.getsockname()[1]
    client = socket.create_connection((connect, port))
    conn, _ = server.accept()
    server.close()
    return client, conn


@pytest.mark.parametrize(
    ("family", "listen", "connect"),
    [
        (socket.AF_INET, "127.0.0.1", "127.0.0.1"),
        (socket.AF_INET6, "::1", "::1"),
        (socket.AF_INET6, "::", "127.0.0.1"),
    ],
)
def test_the_owner_of_the_client_socket(family: int, listen: str, connect: str) -> None:
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        client, conn = _pair(family, listen, connect)
    except OSError as exc:
        pytest.skip(f"cannot listen on {listen}: {exc}")
    with client, conn:
        assert tcp_peer_uid(conn) == os.geteuid()


def test_a_peer_not_in_the_table_is_refused(tmp_path: Path) -> None:
    client, conn = _pair(socket.AF_INET, "127.0.0.1", "127.0.0.1")
    (tmp_path / "tcp").write_text("  sl  local_address rem_address   st\n")
    with client, conn, pytest.raises(ShmError, match="not in edged's network namespace") as err:
        tcp_peer_uid(conn, proc_net=tmp_path)
    assert err.value.status == 403


def test_names_region_finds_the_parameter_and_only_it() -> None:
    mark = b'{"parameters": {"shared_memory_region": "r"}}'
    assert names_region(mark, len(mark))
    assert not names_region(mark, 20)  # past the end given (a binary request's header)
    assert names_region(b"shared_memory_region", 20)
    assert not names_region(b"hared_memory_region", 19)
    assert not names_region(b'{"binary_data_size": 4, "x_y": [1, 2]}', 38)
    # many underscores before it: the rest is searched whole
    many = b'{"a": "' + b"_" * 1000 + b'", "shared_memory_region": 1}'
    assert names_region(many, len(many))
    assert not names_region(b"_" * 1000, 1000)
