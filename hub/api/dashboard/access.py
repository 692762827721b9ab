"""Who may look at the dashboard: the holder of an admin certificate of this hub, shown either
in the TLS handshake (the dashboard asks for a client certificate, optionally) or through a
short-lived **dashboard token** that ``edgectl dashboard`` obtains over the admin API
(``CreateDashboardToken``).

A token is ``v1.<payload>.<mac>`` (base64url): the payload names the admin (name, certificate
serial) and when it expires; the MAC is HMAC-SHA256 with a key the hub makes at start and
keeps in memory only. So tokens are never stored, a restarted hub refuses older ones, and one
is refused after it expires or once the certificate it was made for is revoked. Tokens are
minutes long (default 5, at most 15) and never logged.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from edgefleet.errors import EdgefleetError

DEFAULT_TTL_S = 5 * 60.0
MIN_TTL_S = 10.0
MAX_TTL_S = 15 * 60.0
MAX_TOKEN_CHARS = 512
PREFIX = "v1"


class AccessRefused(EdgefleetError):
    """A request the dashboard does not serve: no certificate or token, or a bad one."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who looks: an admin, by name and certificate serial (hex)."""

    name: str
    serial: str
    via: str  # "certificate" or "token"
    expires: float | None = None  # a token's
    # what the viewer's CSRF token is bound to (csrf_token): the token's MAC, or the
    # certificate's serial; never shown
    session: str = field(default="", repr=False)


@dataclass(slots=True)
class DashboardAccess:
    """The token key (random, per hub process) and the dashboard's bound port (0: none)."""

    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    port: int = 0

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self.key, payload, hashlib.sha256).digest()

    def issue(self, name: str, serial: str, *, now: float, ttl: float) -> tuple[str, float]:
        """A token for admin ``name`` (certificate ``serial``) and when it expires."""
        if not MIN_TTL_S <= ttl <= MAX_TTL_S:
            raise ValueError(f"ttl: must be from {MIN_TTL_S:g}s to {MAX_TTL_S:g}s, got {ttl:g}s")
        expires = now + ttl
        payload = orjson.dumps(
            {"sub": name, "ser": serial, "exp": expires, "n": secrets.token_hex(8)},
            option=orjson.OPT_SORT_KEYS,
        )
        return f"{PREFIX}.{_b64(payload)}.{_b64(self._mac(payload))}", expires

    def verify(self, token: str, *, now: float, revoked: Mapping[str, str]) -> Viewer:
        """The viewer a token speaks for; raises :class:`AccessRefused` saying why not (the
        reason never repeats the token)."""
        if len(token) > MAX_TOKEN_CHARS:
            raise AccessRefused("the token is too long")
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != PREFIX:
            raise AccessRefused("not a dashboard token")
        try:
            payload, mac = _unb64(parts[1]), _unb64(parts[2])
        except (binascii.Error, ValueError):
            raise AccessRefused("not a dashboard token") from None
        if not hmac.compare_digest(mac, self._mac(payload)):
            raise AccessRefused("the token was not issued by this hub (or it restarted since)")
        try:
            doc = orjson.loads(payload)
            name, serial, expires = str(doc["sub"]), str(doc["ser"]), float(doc["exp"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise AccessRefused("not a dashboard token") from None
        if now >= expires:
            raise AccessRefused("the token has expired: run edgectl dashboard again")
        if serial in revoked:
            raise AccessRefused(f"the certificate of admin {name} has been revoked")
        return Viewer(name, serial, "token", expires, session=f"token:{parts[2]}")

    def csrf_token(self, session: str) -> str:
        """The CSRF token of a viewer's ``session`` (:attr:`Viewer.session`): an HMAC with
        this hub process's key, so it is per session, unguessable without the key, and dies
        with the session (a token's expiry, a hub restart)."""
        return _b64(hmac.new(self.key, b"csrf\0" + session.encode(), hashlib.sha256).digest())

    def csrf_ok(self, session: str, presented: str) -> bool:
        """Whether ``presented`` is ``session``'s CSRF token (compared in constant time)."""
        if not session or not presented or len(presented) > 128:
            return False
        return hmac.compare_digest(
            presented.encode("utf-8", "replace"), self.csrf_token(session).encode()
        )
