"""Paged List, Kubernetes style (``limit`` and ``continue``): the decisions, pure.

A list is read in pages. The first page fixes the list's **revision** (the store revision it
was read at); every later page is read at that same revision, so the pages together are one
snapshot: an object created after the first page is not listed, one changed or deleted since
is listed as it was, and none is listed twice (pages go in key order, each after the last key
of the one before).

The **continue token** says where the next page starts: the revision, the last key given, and
the kind and label selector of the list (a token is refused for any other list). It is opaque
to clients (URL-safe base64 of a small JSON object) and not a secret: it only positions a read
the caller may make anyway. Everything in it is checked (:func:`decode_token`); whatever does
not hold is refused naming ``continue_token``.

Each page is bounded twice: at most :data:`MAX_PAGE_ITEMS` items whatever the limit asks, and
at most :data:`MAX_PAGE_BYTES` of items, so that no response reaches gRPC's message limit
(4 MiB, ``hub.server.MAX_MESSAGE_BYTES``) however large the objects. One object is never
larger than that (Apply takes documents of at most 1 MiB); one that is shown larger is refused
by name rather than sent (:func:`oversize_message`).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from edgefleet.errors import EdgefleetError

MAX_PAGE_ITEMS = 1000
"""The most items one page holds, whatever ``limit`` asks (fewer is always allowed)."""

MAX_PAGE_BYTES = 4 * 1024 * 1024 - 256 * 1024
"""The most bytes of items in one response: gRPC's 4 MiB, less room for the rest of it."""

MAX_TOKEN_CHARS = 4096
TOKEN_VERSION = 1


class BadPage(EdgefleetError):
    """A paging field of a ListRequest that cannot be served; the message names the field."""


@dataclass(frozen=True, slots=True)
class ContinueToken:
    """Where the next page of a list starts."""

    kind: str
    selector: str
    revision: int  # the revision of the list's first page
    after: str  # the key of the last item given: the next page starts after it

    def encode(self) -> str:
        doc = {"v": TOKEN_VERSION, "k": self.kind, "s": self.selector, "r": self.revision,
               "a": self.after}  # fmt: skip
        return base64.urlsafe_b64encode(orjson.dumps(doc)).decode().rstrip("=")


def _garbled(why: str) -> BadPage:
    return BadPage(
        f"continue_token: not a token of this hub ({why}); give the continue_token of the "
        "previous page unchanged, or list again without one"
    )


def decode_token(text: str, *, kind: str, selector: str) -> ContinueToken:
    """The token ``text`` (a previous page's ``continue_token``) of a list of ``kind`` with
    ``selector``; :class:`BadPage` naming ``continue_token`` for anything else."""
    if len(text) > MAX_TOKEN_CHARS:
        raise _garbled(f"{len(text)} characters, at most {MAX_TOKEN_CHARS}")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        doc = orjson.loads(raw)
    except (binascii.Error, ValueError, orjson.JSONDecodeError):
        raise _garbled("not base64 of JSON") from None
    if not isinstance(doc, dict) or set(doc) != {"v", "k", "s", "r", "a"}:
        raise _garbled("not the fields of a token")
    if doc["v"] != TOKEN_VERSION:
        raise _garbled(f"version {doc['v']!r}, this hub reads {TOKEN_VERSION}")
    revision, after = doc["r"], doc["a"]
    if not isinstance(revision, int) or isinstance(revision, bool) or revision < 1:
        raise _garbled(f"revision {revision!r}")
    if not isinstance(after, str) or not after or "\x00" in after:
        raise _garbled("no key to start after")
    if doc["k"] != kind or doc["s"] != selector:
        raise BadPage(
            f"continue_token: a token of the list of {doc['k']!r} with label_selector "
            f"{doc['s']!r}, not of this one ({kind!r}, {selector!r}): give the same kind and "
            "label_selector on every page"
        )
    return ContinueToken(kind, selector, revision, after)


def page_limit(limit: int) -> int:
    """How many items a page of ``limit`` holds at most (0: all, bounded by bytes only)."""
    if limit < 0:
        raise BadPage(f"limit: must be 0 (all) or more, got {limit}")
    return min(limit, MAX_PAGE_ITEMS) if limit else 0


def revision_problem(revision: int, current: int) -> str | None:
    """Why a token's revision cannot be read when the store is at ``current``, or None."""
    if revision > current:
        return (
            f"continue_token: revision {revision} is after the store's ({current}): not a "
            "token of this hub's store; list again without one"
        )
    return None


class Source(enum.Enum):
    """Where an item of a page is shown from."""

    CURRENT = "current"  # as the hub shows it now (it has not changed since the revision)
    AT = "at"  # from its stored value at the list's revision (it changed since, or is gone)


def snapshot(
    current: Sequence[str],
    stored_now: Mapping[str, int],
    stored_at: Mapping[str, int],
    *,
    cached: Mapping[str, int] | None = None,
) -> list[tuple[str, Source]]:
    """The keys a list at a revision holds, sorted, and where each is shown from.

    ``current``: the keys of what the hub shows now; ``stored_now`` and ``stored_at``: the
    store's keys under the kind's prefix with their mod revisions, now and at the list's
    revision. A key stored at the revision is listed: as now if unchanged since (and shown
    now), else from its value then. A key stored now but not then was created since: not
    listed. A key shown now but stored neither now nor then (a region's device at a root)
    has no history: listed as now.

    ``cached``: for a kind whose every stored key is an object of the list (operator
    objects), the store revision each shown object was cached at. The store is then the
    truth where the cache lags it (a follower's cache behind the leader's writes, a leader
    paused past its lease): a stored object the cache does not hold yet, or holds at
    another revision, is shown from its stored value; one the cache holds but the store
    no longer does (deleted meanwhile) is not listed. A shown key not in ``cached`` (a
    built-in object, never stored) is listed as now.
    """
    shown = set(current)
    out: dict[str, Source] = {}
    for key, mod in stored_at.items():
        if stored_now.get(key) != mod:
            out[key] = Source.AT
        elif key in shown and (cached is None or cached.get(key) == mod):
            out[key] = Source.CURRENT
        elif cached is not None:  # stored, unchanged, the cache behind it: as stored
            out[key] = Source.AT
    for key in shown:
        if key not in stored_at and key not in stored_now and (cached is None or key not in cached):
            out[key] = Source.CURRENT
    return sorted(out.items())


def after(keys: Sequence[str], token: ContinueToken | None) -> int:
    """The index in sorted ``keys`` where the page after ``token`` starts."""
    return 0 if token is None else bisect.bisect_right(keys, token.after)


def fits(count: int, total: int, size: int, limit: int, budget: int = MAX_PAGE_BYTES) -> bool:
    """Whether the next item (``size`` bytes) joins a page that holds ``count`` items of
    ``total`` bytes: at most ``limit`` items (0: no count limit), at most ``budget`` bytes, and
    always the first (a list moves on; no item is larger, see :func:`oversize_message`)."""
    if limit and count >= limit:
        return False
    return count == 0 or total + size <= budget


def oversize_message(kind: str, name: str, size: int, budget: int = MAX_PAGE_BYTES) -> str | None:
    """Why one object cannot be sent in a response, or None when it can."""
    if size <= budget:
        return None
    return (
        f"{kind} {name!r} is shown as {size / 2**20:.1f} MiB, more than one response carries "
        f"({budget / 2**20:.2f} MiB): it cannot be listed or watched"
    )
