"""Replica addresses (hub init --replica-address): in the serving certificate's names, in
hub.toml (sent to devices at enrollment) and in admin.toml (edgectl fails over between them);
``hub serve`` refuses a replica address its certificate does not name."""

from __future__ import annotations

from pathlib import Path

import pytest
from asynctesting import async_test
from cryptography import x509

from edgectl.client import load_admin_config
from hub import pki
from hub.config import load_config
from hub.initializing import HubDirError, HubPaths, init_hub
from hub.server import check_replica_names


@async_test
async def test_every_replica_is_named_in_the_certificate_config_and_admin_toml(
    tmp_path: Path,
) -> None:
    data = tmp_path / "hub"
    await init_hub(
        data,
        region="eu",
        hub_address="10.0.0.1:7443",
        replicas=["10.0.0.2:7443", "hub-c.example:7443"],
    )
    paths = HubPaths.of(data)
    certificate = x509.load_pem_x509_certificate(paths.hub_certificate.read_bytes())
    assert pki.uncovered_hosts(certificate, ["10.0.0.1", "10.0.0.2", "hub-c.example"]) == []
    config = load_config(paths.config)
    assert config.replica_addresses == ("10.0.0.1:7443", "10.0.0.2:7443", "hub-c.example:7443")
    assert config.listen == "0.0.0.0:7443"  # copies of the directory serve on other hosts
    admin = load_admin_config(paths.admin_config)
    assert admin.hub == "10.0.0.1:7443"
    assert admin.addresses == config.replica_addresses
    check_replica_names(paths, config.replica_addresses)  # all named: no error

    with pytest.raises(HubDirError) as refused:
        check_replica_names(paths, [*config.replica_addresses, "10.0.0.9:7443"])
    assert "10.0.0.9" in str(refused.value) and "replica-address" in str(refused.value)


def test_uncovered_hosts_reads_dns_ip_and_wildcard_names(tmp_path: Path) -> None:
    from datetime import timedelta

    ca = pki.create_ca("eu")
    served = pki.issue_serving_certificate(
        ca,
        pki.Identity(pki.Role.HUB, "hub", "eu"),
        ["*.hubs.example", "10.0.0.1", "hub.example"],
        lifetime=timedelta(days=1),
    )
    hosts = ["a.hubs.example", "10.0.0.1", "HUB.example", "b.a.hubs.example", "10.0.0.2"]
    assert pki.uncovered_hosts(served.certificate, hosts) == ["b.a.hubs.example", "10.0.0.2"]
