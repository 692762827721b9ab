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
        return certificate_dates(self.certificate.read_bytes())[1]

    def certificate_validity(self) -> tuple[float, float]:
        """(start, end) of the certificate's life as this device sees it. The start is when
        the device received it (the file's time) unless ``notBefore`` is later: the hub
        backdates ``notBefore`` a little for clock skew, which must not count as life used."""
        not_before, not_after = certificate_dates(self.certificate.read_bytes())
        received = self.certificate.stat().st_mtime
        start = max(not_before, min(received, time.time()))
        return start, not_after


# -- the certificate's dates, without cryptography ------------------------------------------
# An idle enrolled edged reads only its certificate's validity (to schedule the renewal):
# importing cryptography for that costs about 8 MiB RSS (docs/edged.md, "Footprint"), so the
# two dates are read from the DER with the standard library. Certificate ::= SEQUENCE {
# tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer,
# validity SEQUENCE { notBefore Time, notAfter Time }, ... }, ... } (RFC 5280 4.1).

MAX_CERTIFICATE_BYTES = 1 << 20


def certificate_dates(pem: bytes) -> tuple[float, float]:
    """(notBefore, notAfter) of the first certificate in ``pem``, as POSIX times. ValueError
    when it is not a PEM certificate or its DER is malformed."""
    import base64
    import binascii

    if len(pem) > MAX_CERTIFICATE_BYTES:
        raise ValueError(f"certificate larger than {MAX_CERTIFICATE_BYTES} bytes")
    begin, end = b"-----BEGIN CERTIFICATE-----", b"-----END CERTIFICATE-----"
    start = pem.find(begin)
    stop = pem.find(end, start + len(begin))
    if start < 0 or stop < 0:
        raise ValueError("no PEM certificate")
    try:
        der = base64.b64decode(b"".join(pem[start + len(begin) : stop].split()), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"certificate: bad base64: {exc}") from None
    cert, _ = _tlv(der, 0, 0x30)
    tbs, _ = _tlv(der, cert, 0x30)
    pos = tbs
    if pos < len(der) and der[pos] == 0xA0:  # [0] EXPLICIT version
        pos = _skip(der, pos)
    for _ in range(3):  # serialNumber, signature, issuer
        pos = _skip(der, pos)
    validity, _ = _tlv(der, pos, 0x30)
    not_before, after = _time(der, validity)
    not_after, _ = _time(der, after)
    return not_before, not_after


def _header(der: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of contents, end of contents) of the TLV at ``pos``; ValueError when cut."""
    if pos + 2 > len(der):
        raise ValueError("certificate: truncated DER")
    tag, length = der[pos], der[pos + 1]
    pos += 2
    if length & 0x80:
        n = length & 0x7F
        if not 1 <= n <= 4 or pos + n > len(der):
            raise ValueError("certificate: bad DER length")
        length = int.from_bytes(der[pos : pos + n], "big")
        pos += n
    if pos + length > len(der):
        raise ValueError("certificate: truncated DER")
    return tag, pos, pos + length


def _tlv(der: bytes, pos: int, tag: int) -> tuple[int, int]:
    """(start of contents, end) of the TLV at ``pos``, which must have ``tag``."""
    got, start, end = _header(der, pos)
    if got != tag:
        raise ValueError(f"certificate: DER tag {got:#x} where {tag:#x} was expected")
    return start, end


def _skip(der: bytes, pos: int) -> int:
    return _header(der, pos)[2]


def _time(der: bytes, pos: int) -> tuple[float, int]:
    """A UTCTime (YYMMDDHHMMSSZ) or GeneralizedTime (YYYYMMDDHHMMSSZ) at ``pos``: (POSIX
    time, position after it)."""
    import calendar

    tag, start, end = _header(der, pos)
    text = der[start:end].decode("ascii", "replace")
    if tag == 0x17 and len(text) == 13 and text.endswith("Z") and text[:12].isdigit():
        year = int(text[:2])
        year += 2000 if year < 50 else 1900  # RFC 5280 4.1.2.5.1
        rest = text[2:12]
    elif tag == 0x18 and len(text) == 15 and text.endswith("Z") and text[:14].isdigit():
        year, rest = int(text[:4]), text[4:14]
    else:
        raise ValueError(f"certificate: bad validity time {text!r}")
    month, day, hour, minute, second = (int(rest[i : i + 2]) for i in range(0, 10, 2))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        raise ValueError(f"certificate: bad validity time {text!r}")
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))), end
