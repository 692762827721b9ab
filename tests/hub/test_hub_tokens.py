"""Bootstrap tokens on both stores (real SQLite file and in-memory), on a fake clock."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from asynctesting import async_test
from hubtesting import FakeClock, MakeStore

from edgefleet.errors import TokenError, TokenRefusal
from hub.state import tokens


@async_test
async def test_a_token_validates_and_is_stored_hashed(
    make_store: MakeStore, clock: FakeClock
) -> None:
    store = await make_store()
    try:
        token, record = await tokens.create_token(
            store, now=clock(), ttl=3600, description="line 3", labels={"site": "a"}
        )
        assert tokens.TOKEN_PATTERN.fullmatch(token)
        secret = token.split(".")[1]
        raw = (await store.get(tokens.PREFIX + record.id)).value  # type: ignore[union-attr]
        assert secret.encode() not in raw
        assert hashlib.sha256(secret.encode()).hexdigest().encode() in raw
        assert await tokens.validate(store, token, now=clock()) == record
        assert await tokens.consume(store, token, now=clock()) == record  # reusable
        assert await tokens.consume(store, token, now=clock()) == record
        (listed,) = await tokens.list_tokens(store)
        assert listed.description == "line 3" and listed.labels == {"site": "a"}
        assert await tokens.delete_token(store, record.id)
        assert not await tokens.delete_token(store, record.id)
    finally:
        await store.close()


@async_test
async def test_every_refusal_has_its_reason(make_store: MakeStore, clock: FakeClock) -> None:
    store = await make_store()
    try:
        token, record = await tokens.create_token(store, now=clock(), ttl=60)
        cases = {
            "nonsense": TokenRefusal.MALFORMED,
            token.upper(): TokenRefusal.MALFORMED,
            "zzzzzz.0123456789abcdef": TokenRefusal.UNKNOWN,
            f"{record.id}.0123456789abcdef": TokenRefusal.WRONG_SECRET,
        }
        for bad, reason in cases.items():
            with pytest.raises(TokenError) as info:
                await tokens.validate(store, bad, now=clock())
            assert info.value.reason is reason
            assert token.split(".")[1] not in str(info.value)
        clock.advance(60)
        with pytest.raises(TokenError, match="expired") as info:
            await tokens.validate(store, token, now=clock())
        assert info.value.reason is TokenRefusal.EXPIRED
    finally:
        await store.close()


@async_test
async def test_a_single_use_token_serves_exactly_one_of_many_concurrent_enrollments(
    make_store: MakeStore, clock: FakeClock
) -> None:
    store = await make_store()
    try:
        token, _ = await tokens.create_token(store, now=clock(), ttl=60, single_use=True)
        results = await asyncio.gather(
            *(tokens.consume(store, token, now=clock()) for _ in range(10)),
            return_exceptions=True,
        )
        winners = [r for r in results if isinstance(r, tokens.TokenRecord)]
        assert len(winners) == 1 and winners[0].used == clock()
        losers = [r for r in results if isinstance(r, TokenError)]
        assert len(losers) == 9
        assert {r.reason for r in losers} == {TokenRefusal.ALREADY_USED}
        with pytest.raises(TokenError, match="has been used"):
            await tokens.validate(store, token, now=clock())
    finally:
        await store.close()
