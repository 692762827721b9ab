"""CA pins and the chain a server presents (edgefleet.pinning): a real TLS server on
localhost presenting a hub's leaf and CA, read without verification, and matched to a pin."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from edgefleet.pinning import fetch_presented_chain, find_pinned, parse_pin, spki_pin
from hub import pki


@pytest.fixture(scope="module")
def ca() -> pki.CertifiedKey:
    return pki.create_ca("eu")


@pytest.fixture
def tls_port(ca: pki.CertifiedKey, tmp_path: Path) -> Iterator[int]:
    """A TLS server presenting leaf + CA, answering handshakes until the test ends."""
    leaf = pki.issue_serving_certificate(
        ca, pki.Identity(pki.Role.HUB, "hub", "eu"), ["localhost", "127.0.0.1"]
    )
    chain = tmp_path / "chain.pem"
    chain.write_bytes(pki.certificate_pem(leaf.certificate) + pki.certificate_pem(ca.certificate))
    key = tmp_path / "key.pem"
    key.write_bytes(pki.private_key_pem(leaf.key))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(chain, key)
    ctx.set_alpn_protocols(["h2"])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                try:
                    with ctx.wrap_socket(conn, server_side=True) as tls:
                        tls.recv(1)
                except (OSError, ssl.SSLError):
                    pass  # the client hangs up after the handshake: that is all it reads

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(5)
    listener.close()


def test_the_presented_chain_is_read_without_verifying_it(
    ca: pki.CertifiedKey, tls_port: int
) -> None:
    chain = fetch_presented_chain("127.0.0.1", tls_port)
    assert len(chain) == 2
    ca_der = ca.certificate.public_bytes(Encoding.DER)
    assert chain[1] == ca_der


def test_the_pinned_ca_is_found_in_the_chain(ca: pki.CertifiedKey, tls_port: int) -> None:
    chain = fetch_presented_chain("localhost", tls_port)
    ca_der = ca.certificate.public_bytes(Encoding.DER)
    found = find_pinned(chain, parse_pin(spki_pin(ca_der)))
    assert found == ssl.DER_cert_to_PEM_cert(ca_der).encode()


def test_no_certificate_matches_another_pin(tls_port: int) -> None:
    chain = fetch_presented_chain("127.0.0.1", tls_port)
    other = pki.create_ca("us").certificate.public_bytes(Encoding.DER)
    assert find_pinned(chain, spki_pin(other)) is None


def test_a_closed_port_is_an_os_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    with pytest.raises(OSError):
        fetch_presented_chain("127.0.0.1", port, timeout=2)
