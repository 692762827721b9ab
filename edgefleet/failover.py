"""Failing over between the addresses of one service's replicas: the shared rule.

A client that knows several addresses of the same service (edged's hub link to its hub's
replicas, a regional hub's link to its root's replicas) keeps them as an ordered list:

* :func:`address_list` reads them (``HOST:PORT`` each, in order, each once, at most
  :data:`MAX_ADDRESSES`), :func:`split_addresses` from a comma-separated option;
* the client sticks to the address that works and, when a session there fails, dials the
  next one (:meth:`Rotation.advance`, round-robin: nothing else is preferred);
* the reconnect backoff grows once per **round** of every address (:func:`round_delay`): a
  replica that dies costs a delay of at most the backoff's base, jittered, before the next
  address is dialled, and a whole service down backs off as a single address would.

Pure: no I/O, no clock; the caller owns the randomness it passes in.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from edgefleet.backoff import Backoff

MAX_ADDRESSES = 16


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too); ValueError saying what is wrong."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be HOST:PORT, got {text!r}")
    return host, int(port)


def address_list(*groups: object, what: str = "hub") -> list[str]:
    """Addresses from ``groups`` (lists of HOST:PORT), in order, each once, at most
    :data:`MAX_ADDRESSES`; ValueError naming a bad one."""
    result: list[str] = []
    for group in groups:
        if not isinstance(group, list | tuple):
            raise ValueError(f"{what} addresses must be a list, got {type(group).__name__}")
        for text in group:
            if not isinstance(text, str):
                raise ValueError(f"a {what} address must be a string, got {text!r}")
            parse_address(text)
            if text not in result:
                result.append(text)
    if len(result) > MAX_ADDRESSES:
        raise ValueError(f"at most {MAX_ADDRESSES} {what} addresses, got {len(result)}")
    return result


def split_addresses(text: str, *, what: str = "hub") -> list[str]:
    """``A,B,...`` (an option's value): at least one address, each HOST:PORT; ValueError
    naming what is wrong."""
    parts = [a.strip() for a in text.split(",")]
    if not text.strip() or any(not a for a in parts):
        raise ValueError(f"must be HOST:PORT[,HOST:PORT...], got {text!r}")
    return address_list(parts, what=what)


def round_delay(
    backoff: Backoff, failures: int, addresses: int, rng: random.Random | None = None
) -> float:
    """The delay before the next dial after ``failures`` consecutive failed sessions over
    ``addresses`` addresses: the backoff grows once per round of every address."""
    return backoff.delay(failures // max(addresses, 1), rng)


@dataclass(slots=True)
class Rotation:
    """Which of ``addresses`` a client dials: the one that last worked, the next after a
    failure."""

    addresses: tuple[str, ...]
    index: int = 0

    def __post_init__(self) -> None:
        if not self.addresses:
            raise ValueError("at least one address")

    @property
    def current(self) -> str:
        return self.addresses[self.index % len(self.addresses)]

    def advance(self) -> str:
        """Move on to the next address (after a failure); the new one."""
        self.index = (self.index + 1) % len(self.addresses)
        return self.current

    def replace(self, addresses: tuple[str, ...]) -> None:
        """A new list (changed by an operator): keep dialling the current address when the
        new list still has it, else start from the new list's first."""
        if not addresses:
            raise ValueError("at least one address")
        current = self.current
        self.addresses = addresses
        self.index = addresses.index(current) if current in addresses else 0
