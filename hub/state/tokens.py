"""Bootstrap tokens: how a device proves it may enroll. kubeadm's shape, ``ID.SECRET`` with a
6-character id and a 16-character secret of ``[a-z0-9]``, made with :mod:`secrets`.

Stored in the Store at ``/bootstraptokens/<id>`` as JSON, **hashed**: the record keeps
SHA-256 of the secret, never the secret. A plain hash is enough (and a slow KDF like scrypt
would only add CPU per enrollment, a denial-of-service lever): the secret is 16 random
characters from 36, about 83 bits of entropy, so guessing it from the hash is as hopeless as
guessing it outright; secrets are random and unique, so no salt is needed. The secret is
compared in constant time. A single-use token is consumed with compare-and-swap on the
record's revision, so of two concurrent enrollments exactly one succeeds.

``now`` is wall-clock seconds (``time.time()``), passed in by the caller.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string
from collections.abc import Callable, Mapping
from dataclasses import replace

from edgefleet.api.meta import label_key, label_value
from edgefleet.errors import CompareFailed, TokenError, TokenRefusal
from hub.decide.records import TokenRecord
from hub.state.store import Compare, Put, Store

__all__ = ["TokenRecord"]  # plain data the deciders read too (hub.decide.records)

PREFIX = "/bootstraptokens/"
_ALPHABET = string.ascii_lowercase + string.digits
_ID_LENGTH = 6
_SECRET_LENGTH = 16
MIN_TTL_S = 1.0
MAX_TTL_S = 366 * 24 * 3600.0
"""A bootstrap token lives at most a year: a longer-lived one is a standing credential."""
MAX_DESCRIPTION = 256
MAX_LABELS = 64
TOKEN_PATTERN = re.compile(rf"([a-z0-9]{{{_ID_LENGTH}}})\.([a-z0-9]{{{_SECRET_LENGTH}}})")


def check_token_request(
    *,
    ttl: float,
    description: str,
    labels: Mapping[str, str],
    device_labels: bool,
    device_label_prefix: str,
    for_region: str = "",
    own_region: str = "",
) -> list[str]:
    """Every problem with what a new token asks for, each naming its field (pure): checked
    before anything is written, by AdminService ``CreateToken`` and ``hub token create``.
    ``for_region``: a regional hub's token (``own_region``: this hub's, which it cannot be)."""
    problems = []
    if for_region:
        from edgefleet.api.meta import dns_label

        try:
            dns_label(for_region)
        except ValueError as exc:
            problems.append(f"for_region: {exc}")
        if for_region == own_region:
            problems.append(f"for_region: {for_region!r} is this hub's own region")
        if labels or not device_labels or device_label_prefix:
            problems.append(
                "for_region: a regional hub's token enrolls no device: not with labels, "
                "no_device_labels or device_label_prefix"
            )
    if not MIN_TTL_S <= ttl <= MAX_TTL_S:
        problems.append(
            f"ttl: must be from 1s to 366 days (a year), got {ttl:g}s ({ttl / 86400:.4g} days)"
        )
    if len(description) > MAX_DESCRIPTION:
        problems.append(f"description: at most {MAX_DESCRIPTION} characters")
    if len(labels) > MAX_LABELS:
        problems.append(f"labels: at most {MAX_LABELS}, got {len(labels)}")
    for key, value in sorted(labels.items())[:MAX_LABELS]:
        for check, what in ((label_key, key), (label_value, value)):
            try:
                check(what)
            except ValueError as exc:
                problems.append(f"labels[{key!r}]: {exc}")
    prefix = device_label_prefix
    if prefix:
        try:
            label_key(prefix.rstrip("/") if prefix.endswith("/") else prefix)
        except ValueError as exc:
            problems.append(f"device_label_prefix: {exc}")
        if not device_labels:
            problems.append("device_label_prefix: makes no sense with no_device_labels")
    return problems


def _random(length: int) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


_UNKNOWN_HASH = hashlib.sha256(b"no such token").hexdigest()


def _key(token_id: str) -> str:
    return PREFIX + token_id


def token_id_of(token: str) -> str:
    """The id part of a well-formed token (TokenError MALFORMED otherwise); safe to log."""
    match = TOKEN_PATTERN.fullmatch(token) if isinstance(token, str) else None
    if match is None:
        raise TokenError(
            TokenRefusal.MALFORMED,
            "a bootstrap token must look like abcdef.0123456789abcdef "
            "(6 and 16 lowercase letters or digits, joined by a dot)",
        )
    return match.group(1)


async def create_token(
    store: Store,
    *,
    now: float,
    ttl: float,
    single_use: bool = False,
    description: str = "",
    labels: Mapping[str, str] | None = None,
    device_labels: bool = True,
    device_label_prefix: str = "",
    event_for: Callable[[str], Put] | None = None,
    for_region: str = "",
    allow_shared_ek: bool = False,
) -> tuple[str, TokenRecord]:
    """A new token (the only time its secret is seen) and the record stored for it.

    ``event_for(token_id)``, if given, is a Put written in the same transaction as the token:
    a token is never stored without its "Created" event, nor the event without the token."""
    if not MIN_TTL_S <= ttl <= MAX_TTL_S:
        raise ValueError(
            f"ttl: must be between {MIN_TTL_S:g}s and {MAX_TTL_S:g}s (one year), got {ttl:g}s"
        )
    while True:
        token_id, secret = _random(_ID_LENGTH), _random(_SECRET_LENGTH)
        record = TokenRecord(
            id=token_id,
            secret_sha256=_hash(secret),
            created=now,
            expires=now + ttl,
            single_use=single_use,
            description=description,
            labels=dict(labels or {}),
            device_labels=device_labels,
            device_label_prefix=device_label_prefix,
            for_region=for_region,
            allow_shared_ek=allow_shared_ek,
        )
        key = _key(token_id)
        try:
            await store.txn(
                [Compare(key, 0)],
                [Put(key, record.to_json()), *([event_for(token_id)] if event_for else [])],
            )
        except CompareFailed:
            continue  # that id exists (1 in 2 billion): draw again
        return f"{token_id}.{secret}", record


async def _check(store: Store, token: str, now: float) -> tuple[TokenRecord, int]:
    token_id = token_id_of(token)
    secret = token.partition(".")[2]
    kv = await store.get(_key(token_id))
    if kv is None:
        # The same work as for a known id, so that timing does not tell which ids exist.
        hmac.compare_digest(_hash(secret), _UNKNOWN_HASH)
        raise TokenError(TokenRefusal.UNKNOWN, f"bootstrap token {token_id} does not exist")
    record = TokenRecord.from_json(kv.value)
    if not hmac.compare_digest(_hash(secret), record.secret_sha256):
        raise TokenError(
            TokenRefusal.WRONG_SECRET, f"bootstrap token {token_id}: the secret is wrong"
        )
    if now >= record.expires:
        raise TokenError(TokenRefusal.EXPIRED, f"bootstrap token {token_id} has expired")
    if record.used is not None:
        raise TokenError(
            TokenRefusal.ALREADY_USED,
            f"bootstrap token {token_id} was for a single use and has been used",
        )
    return record, kv.mod_revision


async def validate(store: Store, token: str, *, now: float) -> TokenRecord:
    """The token's record if it may be used now; TokenError with the reason otherwise."""
    record, _ = await _check(store, token, now)
    return record


async def consume(store: Store, token: str, *, now: float) -> TokenRecord:
    """Validate, and mark a single-use token used, atomically (compare-and-swap)."""
    record, revision = await _check(store, token, now)
    if not record.single_use:
        return record
    used = replace(record, used=now)
    try:
        await store.put(_key(record.id), used.to_json(), expect_mod_revision=revision)
    except CompareFailed:
        await _check(store, token, now)  # raises: used (or deleted) meanwhile
        raise TokenError(
            TokenRefusal.ALREADY_USED, f"bootstrap token {record.id} changed while being used"
        ) from None
    return used


async def list_tokens(store: Store) -> list[TokenRecord]:
    return [TokenRecord.from_json(kv.value) for kv in (await store.range(PREFIX)).kvs]


async def delete_token(store: Store, token_id: str) -> bool:
    """Whether a token with that id existed (and now does not)."""
    return await store.delete(_key(token_id)) is not None
