"""What only the etcd store has: etcd's own lease expiry, paged ranges, URLs with endpoint
lists and namespaces, TLS with client certificates (a real etcd with --client-cert-auth),
and clear refusals. The Store contract itself runs on etcd in test_hub_store.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from asynctesting import async_test
from etcdtesting import EtcdServer, free_port

from edgefleet.errors import LeaseNotFound, StoreError, StoreUnavailable
from hub import pki
from hub.config import parse_config
from hub.state.store import EtcdStore, EtcdTls, EventType, Put, open_store, parse_store_url
from hub.state.store.etcd import RANGE_PAGE


@async_test
async def test_etcd_expires_leases_itself(etcd_server: EtcdServer, etcd_namespace: str) -> None:
    store = await EtcdStore.open([etcd_server.endpoint], namespace=etcd_namespace)
    try:
        lease = await store.grant(2)
        start = await store.put("/heartbeats/a", b"", lease=lease)
        await store.put("/devices/a", b"kept")
        await store.keepalive(lease)
        assert 0 < await store.time_to_live(lease) <= 2
        assert await store.expire_leases() == []  # etcd's job, not the hub's
        watch = store.watch("/heartbeats/", start_revision=start + 1)
        gone = await asyncio.wait_for(watch.__anext__(), 15)  # TTL 2 s + etcd's checks
        assert gone.type is EventType.DELETE and gone.kv.key == "/heartbeats/a"
        await watch.aclose()
        assert await store.get("/devices/a") is not None
        with pytest.raises(LeaseNotFound):
            await store.keepalive(lease)
        with pytest.raises(LeaseNotFound):
            await store.put("/x", b"", lease=lease)
    finally:
        await store.close()


@async_test
async def test_a_large_range_is_read_in_pages_at_one_revision(
    etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    store = await EtcdStore.open([etcd_server.endpoint], namespace=etcd_namespace)
    other = await EtcdStore.open([etcd_server.endpoint], namespace=etcd_namespace + "x")
    try:
        n = RANGE_PAGE * 2 + 17
        revision = await store.txn([], [Put(f"/d/{i:05d}", b"v") for i in range(n)])
        await other.put("/d/00000", b"another namespace")  # same etcd, not in this store
        result = await store.range("/d/")
        assert [kv.key for kv in result.kvs] == [f"/d/{i:05d}" for i in range(n)]
        assert result.revision == revision + 1
        assert len((await store.range("")).kvs) == n
    finally:
        await store.close()
        await other.close()


def test_etcd_store_urls() -> None:
    location = parse_store_url("etcd://10.0.0.1:2379,etcd-b:2379/edgefleet/eu")
    assert location.endpoints == ("10.0.0.1:2379", "etcd-b:2379")
    assert location.namespace == "/edgefleet/eu"
    assert parse_store_url("etcd://[::1]:2379/").namespace == ""
    for bad, why in (
        ("etcd://", "no endpoint"),
        ("etcd://a", "not HOST:PORT"),
        ("etcd://a:0", "not HOST:PORT"),
        ("etcd://a:99999", "not HOST:PORT"),
        ("etcd://a:2379,,b:2379", "not HOST:PORT"),
        ("etcd://a:2379,a:2379", "appears twice"),
        ("etcd://user:pw@a:2379", "not supported yet"),
        ("etcd://a:2379/x?tls=1", "not supported"),
        ("etcd://a:2379//x", "clean key prefix"),
    ):
        with pytest.raises(StoreError, match=why):
            parse_store_url(bad)


@async_test
async def test_refusals_are_clear(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}"):
        await open_store(f"etcd://127.0.0.1:{port}", data_dir=tmp_path)
    tls = EtcdTls(tmp_path / "ca.pem")
    with pytest.raises(StoreError, match="apply only to an etcd:// store"):
        await open_store(None, data_dir=tmp_path, etcd_tls=tls)
    with pytest.raises(StoreError, match=r"cannot read the CA certificate \(caFile\)"):
        await open_store(f"etcd://127.0.0.1:{port}", data_dir=tmp_path, etcd_tls=tls)
    with pytest.raises(StoreError, match="give both"):
        EtcdTls(tmp_path / "ca.pem", cert_file=tmp_path / "c.pem")


def test_etcd_settings_in_hub_toml() -> None:
    config = parse_config(
        {
            "store": "etcd://127.0.0.1:2379",
            "etcd": {"caFile": "etcd/ca.pem", "certFile": "c.pem", "keyFile": "k.pem"},
        }
    )
    tls = config.etcd.tls(Path("/d"))
    assert tls == EtcdTls(Path("/d/etcd/ca.pem"), Path("/d/c.pem"), Path("/d/k.pem"))
    assert config.etcd.tls(Path("/d"), ca_file=Path("/flag/ca.pem")) == EtcdTls(
        Path("/flag/ca.pem"), Path("/d/c.pem"), Path("/d/k.pem")
    )
    assert parse_config({}).etcd.tls(Path("/d")) is None
    for doc, where in (
        ({"etcd": {"caFile": "ca.pem"}}, "etcd.caFile"),  # not an etcd store
        ({"store": "etcd://a:1", "etcd": {"certFile": "c.pem"}}, "etcd.keyFile"),
        ({"store": "etcd://a:1", "etcd": {"certFile": "c", "keyFile": "k"}}, "etcd.caFile"),
        ({"store": "etcd://a:1", "etcd": {"leaderLease": "1s"}}, "etcd.leaderLease"),
        ({"store": "etcd://a:1", "etcd": {"colour": "red"}}, "etcd.colour"),
    ):
        with pytest.raises(Exception, match=where.replace(".", r"\.")):
            parse_config(doc)


def _tls_files(d: Path) -> tuple[Path, Path, Path, Path, Path]:
    ca = pki.create_ca("etcd")
    server = pki.issue_serving_certificate(
        ca, pki.Identity(pki.Role.HUB, "etcd", "etcd"), ["127.0.0.1"]
    )
    client = pki.issue_client_certificate(ca, pki.Identity(pki.Role.HUB, "hub", "etcd"))
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")]
    pki.write_certificate(paths[0], ca.certificate)
    pki.write_certificate(paths[1], server.certificate)
    pki.write_private_key(paths[2], server.key)
    pki.write_certificate(paths[3], client.certificate)
    pki.write_private_key(paths[4], client.key)
    return paths[0], paths[1], paths[2], paths[3], paths[4]


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EtcdServer, Path]]:
    d = tmp_path_factory.mktemp("tls-etcd")
    ca, cert, key, _, _ = _tls_files(d / "pki")
    server = EtcdServer(
        d / "etcd",
        extra=[
            f"--cert-file={cert}",
            f"--key-file={key}",
            f"--trusted-ca-file={ca}",
            "--client-cert-auth",
        ],
        scheme="https",
    )
    server.start()
    try:
        yield server, d / "pki"
    finally:
        server.stop()


@async_test
async def test_tls_with_a_client_certificate(tls_etcd: tuple[EtcdServer, Path]) -> None:
    server, d = tls_etcd
    url = f"etcd://{server.endpoint}/tls"
    tls = EtcdTls(d / "ca.pem", d / "client.pem", d / "client.key")
    store = await open_store(url, data_dir=d, etcd_tls=tls)
    try:
        revision = await store.put("/k", b"over TLS")
        kv = await store.get("/k")
        assert kv is not None and kv.value == b"over TLS" and kv.mod_revision == revision
    finally:
        await store.close()
    # no client certificate: etcd refuses the handshake; no TLS at all: no answer either
    for no in (EtcdTls(d / "ca.pem"), None):
        with pytest.raises(StoreError):
            bad = await EtcdStore.open([server.endpoint], tls=no, timeout=3)
            await bad.close()


def test_without_aetcd_the_hub_runs_and_etcd_is_refused_saying_why(tmp_path: Path) -> None:
    """aetcd is the ``etcd`` extra (hubs); a device's install without it still imports."""
    code = (
        "import sys, asyncio; sys.modules['aetcd'] = None\n"
        "from hub.state.store import open_store\n"
        "from edgefleet.errors import StoreUnavailable\n"
        "try:\n"
        f"    asyncio.run(open_store('etcd://127.0.0.1:1', data_dir={str(tmp_path)!r}))\n"
        "except StoreUnavailable as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'edgefleet[etcd]'" in out.stdout
