"""Where an enrolled device keeps its hub link (``D/hub/``), and reading it back.

D/hub/link.json     {"hub": "HOST:PORT", "hubs": ["HOST:PORT", ...], "deviceName": ...,
                    "enrolledAt": ...}; ``hubs``: every replica of the hub (the link fails
                    over between them), ``hub`` the first; absent: ``hub`` only
D/hub/ca.crt        the hub CA (pinned at enrollment): the only CA trusted for the hub
D/hub/device.crt    this device's certificate (renewed before expiry)
D/identity/key.pem  the identity key (edged.trust.identity), the TLS client key
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from edgefleet.errors import StateError
from edgefleet.failover import MAX_ADDRESSES as MAX_HUB_ADDRESSES
from edgefleet.failover import address_list as hub_addresses
from edgefleet.failover import parse_address

__all__ = ["MAX_HUB_ADDRESSES", "Link", "LinkFiles", "hub_addresses", "parse_address"]


@dataclass(frozen=True, slots=True)
class Link:
    hub: str
    device_name: str
    hubs: tuple[str, ...] = ()
    """Every replica's address, ``hub`` first (empty: ``hub`` alone)."""

    @property
    def addresses(self) -> tuple[str, ...]:
        return self.hubs or (self.hub,)


class LinkFiles:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.dir = data_dir / "hub"
        self.link = self.dir / "link.json"
        self.ca = self.dir / "ca.crt"
        self.certificate = self.dir / "device.crt"
        self.key = data_dir / "identity" / "key.pem"

    def enrolled(self) -> bool:
        return self.link.exists()

    def load(self) -> Link:
        try:
            doc = orjson.loads(self.link.read_bytes())
            hub = str(doc["hub"])
            parse_address(hub)
            hubs = tuple(hub_addresses([hub], doc.get("hubs", [])))
            link = Link(hub, str(doc["deviceName"]), hubs if len(hubs) > 1 else ())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StateError(f"{self.link}: not a hub link: {exc}") from None
        return link

    def certificate_not_after(self) -> float:
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(self.certificate.read_bytes())
        return cert.not_valid_after_utc.timestamp()

    def certificate_validity(self) -> tuple[float, float]:
        """(start, end) of the certificate's life as this device sees it. The start is when
        the device received it (the file's time) unless ``notBefore`` is later: the hub
        backdates ``notBefore`` a little for clock skew, which must not count as life used."""
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(self.certificate.read_bytes())
        received = self.certificate.stat().st_mtime
        start = max(cert.not_valid_before_utc.timestamp(), min(received, time.time()))
        return start, cert.not_valid_after_utc.timestamp()
