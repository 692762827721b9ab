"""A device's name from its hostname (pure), shared by ``edged enroll`` and the hub.

A device enrolled without ``--name`` sends its hostname; the hub derives the name from it by
one rule, :func:`name_from_hostname`, and stays the judge of uniqueness
(:func:`with_suffix`): the derived name as it is when no device holds it, else with a random
suffix (``raspberrypi-3f9a1c``). The rule, for a hostname from outside:

- more than :data:`MAX_HOSTNAME` characters (longer than any DNS name) is refused;
- else its first label (up to the first ``.``: ``cam-7.factory.example`` gives ``cam-7``),
  letters folded to ASCII (accents dropped) and lower-cased, every run of other characters
  one ``-``, ``-`` trimmed at both ends, cut to 63 characters (a DNS label);
- nothing left (``...``, ``---``, only non-Latin letters): no name from it, the hub picks
  ``device-XXXXXXXX`` as it does for a device that sent none.
"""

from __future__ import annotations

import re
import unicodedata

MAX_HOSTNAME = 253
"""The longest hostname taken (a DNS name's bound; Linux allows 64)."""

MAX_LABEL = 63
SUFFIX_CHARS = 6
"""Hex characters of the suffix added to a derived name that is taken."""

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_OTHER = re.compile(r"[^a-z0-9]+")


def is_name(name: str) -> bool:
    """Whether ``name`` is a device name as the hub takes it (a DNS label)."""
    return _NAME.fullmatch(name) is not None


def check_hostname(hostname: str) -> str | None:
    """The problem with ``hostname`` as sent (None: none; see the module doc)."""
    if len(hostname) > MAX_HOSTNAME:
        return f"at most {MAX_HOSTNAME} characters (a DNS name), got {len(hostname)}"
    return None


def name_from_hostname(hostname: str) -> str | None:
    """The device name ``hostname`` gives by the module doc's rule; None when nothing usable
    is left. ``hostname`` must pass :func:`check_hostname`."""
    first = hostname.split(".", 1)[0]
    ascii_only = unicodedata.normalize("NFKD", first).encode("ascii", "ignore").decode()
    name = _OTHER.sub("-", ascii_only.lower()).strip("-")[:MAX_LABEL].rstrip("-")
    return name or None


def with_suffix(name: str, suffix: str) -> str:
    """``name`` with ``-SUFFIX``, cut first so the result is a DNS label."""
    keep = MAX_LABEL - len(suffix) - 1
    return f"{name[:keep].rstrip('-')}-{suffix}"
