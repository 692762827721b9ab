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


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too); ValueError saying what is wrong."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be HOST:PORT, got {text!r}")
    return host, int(port)


MAX_HUB_ADDRESSES = 16


@dataclass(frozen=True, slots=True)
class Link:
    hub: str
    device_name: str
    hubs: tuple[str, ...] = ()
    """Every replica's address, ``hub`` first (empty: ``hub`` alone)."""

    @property
    def addresses(self) -> tuple[str, ...]:
        return self.hubs or (self.hub,)


def hub_addresses(*groups: object) -> list[str]:
    """Addresses from ``groups`` (lists of HOST:PORT), in order, each once, at most
    :data:`MAX_HUB_ADDRESSES`; ValueError naming a bad one."""
    result: list[str] = []
    for group in groups:
        if not isinstance(group, list | tuple):
            raise ValueError(f"hub addresses must be a list, got {type(group).__name__}")
        for text in group:
            if not isinstance(text, str):
                raise ValueError(f"a hub address must be a string, got {text!r}")
            parse_address(text)
            if text not in result:
                result.append(text)
    if len(result) > MAX_HUB_ADDRESSES:
        raise ValueError(f"at most {MAX_HUB_ADDRESSES} hub addresses, got {len(result)}")
    return result


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
