"""Sockets taken back from the descriptor store (edged/serving/sockets.py): only a listening
Unix stream socket bound to the configured path is served; anything else is closed and the
path bound anew."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from edged.serving.sockets import inherited_listener


def _listening(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen()
    return s


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_a_listening_socket_on_the_path_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    s = _listening(path)
    sock, why = inherited_listener(s.detach(), path)
    assert why == "" and sock is not None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(path))  # it is the one listening there
    sock.close()


def test_anything_else_is_refused_and_closed(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    other = _listening(tmp_path / "other.sock")
    fd = other.detach()
    sock, why = inherited_listener(fd, path)
    assert sock is None and "not" in why and _closed(fd)

    unbound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unbound.bind(str(path))  # bound, never listening
    fd = unbound.detach()
    sock, why = inherited_listener(fd, path)
    assert sock is None and why == "not listening" and _closed(fd)

    r, w = os.pipe()
    sock, why = inherited_listener(r, path)
    assert sock is None and "not a socket" in why
    os.close(w)

    udp = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    fd = udp.detach()
    sock, why = inherited_listener(fd, path)
    assert sock is None and why == "not a Unix stream socket" and _closed(fd)


def test_a_socket_whose_file_was_removed_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    s = _listening(path)
    path.unlink()
    fd = s.detach()
    sock, why = inherited_listener(fd, path)
    assert sock is None and "cannot check" in why and _closed(fd)


def test_a_stored_tcp_listener_on_the_configured_address_is_taken() -> None:
    from edged.config import TcpAddress
    from edged.serving.ingress import inherited_tcp_listener

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    sock, why = inherited_tcp_listener(s.detach(), TcpAddress("127.0.0.1", port))
    assert why == "" and sock is not None
    sock.close()

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    fd = s.detach()
    sock, why = inherited_tcp_listener(fd, TcpAddress("127.0.0.1", 1))
    assert sock is None and "not 127.0.0.1:1" in why and _closed(fd)

    u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = u.detach()
    sock, why = inherited_tcp_listener(fd, TcpAddress("127.0.0.1", 0))
    assert sock is None and why == "not a TCP socket" and _closed(fd)
