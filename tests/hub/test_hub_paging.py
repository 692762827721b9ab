"""The decisions of a paged List (hub.decide.paging), as tables: no hub, no store."""

from __future__ import annotations

import base64

import orjson
import pytest

from hub.decide.paging import (
    MAX_PAGE_BYTES,
    MAX_PAGE_ITEMS,
    MAX_TOKEN_CHARS,
    BadPage,
    ContinueToken,
    Source,
    after,
    decode_token,
    fits,
    oversize_message,
    page_limit,
    revision_problem,
    snapshot,
)

KIND = "ModelDeployment"
TOKEN = ContinueToken(KIND, "team=risk", 42, "/objects/ModelDeployment/b")


def _raw(doc: object) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(doc)).decode().rstrip("=")


def _fields(**changes: object) -> dict[str, object]:
    return {"v": 1, "k": KIND, "s": "team=risk", "r": 42, "a": "/x", **changes}


def test_a_token_decodes_to_what_was_encoded() -> None:
    text = TOKEN.encode()
    assert set(text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert decode_token(text, kind=KIND, selector="team=risk") == TOKEN
    unicode = ContinueToken("Device", "", 1, "/devices/caméra-\U0001f600")
    assert decode_token(unicode.encode(), kind="Device", selector="") == unicode


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("!!!", "not base64 of JSON"),
        ("not-a-token", "not base64 of JSON"),
        (base64.urlsafe_b64encode(b"\xff\xfe").decode(), "not base64 of JSON"),
        (_raw([1, 2]), "not the fields of a token"),
        (_raw({"v": 1}), "not the fields of a token"),
        (_raw({**_fields(), "extra": 1}), "not the fields of a token"),
        (_raw(_fields(v=2)), "version 2, this hub reads 1"),
        (_raw(_fields(r=0)), "revision 0"),
        (_raw(_fields(r=-5)), "revision -5"),
        (_raw(_fields(r="42")), "revision '42'"),
        (_raw(_fields(r=True)), "revision True"),
        (_raw(_fields(r=1.5)), "revision 1.5"),
        (_raw(_fields(a="")), "no key to start after"),
        (_raw(_fields(a=7)), "no key to start after"),
        (_raw(_fields(a="/x\x00")), "no key to start after"),
        ("A" * (MAX_TOKEN_CHARS + 1), f"{MAX_TOKEN_CHARS + 1} characters"),
    ],
)
def test_a_garbled_or_forged_token_is_refused_naming_the_field(text: str, why: str) -> None:
    with pytest.raises(BadPage) as info:
        decode_token(text, kind=KIND, selector="team=risk")
    assert str(info.value).startswith("continue_token: not a token of this hub")
    assert why in str(info.value)


@pytest.mark.parametrize(("kind", "selector"), [("Device", "team=risk"), (KIND, ""), (KIND, "x")])
def test_a_token_of_another_list_is_refused(kind: str, selector: str) -> None:
    with pytest.raises(BadPage, match="continue_token: a token of the list of 'ModelDeployment'"):
        decode_token(TOKEN.encode(), kind=kind, selector=selector)


@pytest.mark.parametrize(
    ("limit", "served"),
    [(0, 0), (1, 1), (500, 500), (MAX_PAGE_ITEMS, MAX_PAGE_ITEMS), (10**12, MAX_PAGE_ITEMS)],
)
def test_page_limit(limit: int, served: int) -> None:
    assert page_limit(limit) == served


@pytest.mark.parametrize("limit", [-1, -(2**63)])
def test_a_negative_limit_is_refused(limit: int) -> None:
    with pytest.raises(BadPage, match=f"limit: must be 0 \\(all\\) or more, got {limit}"):
        page_limit(limit)


def test_a_revision_after_the_stores_is_refused() -> None:
    assert revision_problem(42, 42) is None and revision_problem(1, 42) is None
    assert "continue_token: revision 43 is after the store's (42)" in (
        revision_problem(43, 42) or ""
    )


@pytest.mark.parametrize(
    ("count", "total", "size", "limit", "joins"),
    [
        (0, 0, MAX_PAGE_BYTES, 0, True),  # the first item always: a list moves on
        (0, 0, 10, 1, True),
        (1, 10, 10, 1, False),  # the count limit
        (1, 10, 10, 0, True),  # 0: no count limit
        (5, MAX_PAGE_BYTES - 100, 100, 0, True),  # exactly the byte budget
        (5, MAX_PAGE_BYTES - 100, 101, 0, False),  # one byte over
        (5, MAX_PAGE_BYTES - 100, 101, 500, False),
    ],
)
def test_fits(count: int, total: int, size: int, limit: int, joins: bool) -> None:
    assert fits(count, total, size, limit) is joins


def test_six_large_objects_take_two_pages_and_none_passes_the_budget() -> None:
    """The issue's six ~840 KB deployments: at most four in a response."""
    sizes, pages, page, total = [860_000] * 6, [], [], 0
    for size in sizes:
        if not fits(len(page), total, size, 500):
            pages.append(page)
            page, total = [], 0
        page.append(size)
        total += size
    pages.append(page)
    assert [len(p) for p in pages] == [4, 2]
    assert all(sum(p) <= MAX_PAGE_BYTES < 4 * 1024 * 1024 for p in pages)


def test_oversize_message_names_the_object() -> None:
    assert oversize_message(KIND, "big", MAX_PAGE_BYTES) is None
    message = oversize_message(KIND, "big", 5 * 2**20) or ""
    assert "ModelDeployment 'big' is shown as 5.0 MiB" in message


@pytest.mark.parametrize(
    ("current", "now", "at", "listed"),
    [
        # nothing changed since the revision: what is shown now
        (["a", "b"], {"a": 1, "b": 2}, {"a": 1, "b": 2}, [("a", "CURRENT"), ("b", "CURRENT")]),
        # created since: not in the snapshot
        (["a", "c"], {"a": 1, "c": 9}, {"a": 1}, [("a", "CURRENT")]),
        # changed since: as it was then
        (["a"], {"a": 9}, {"a": 1}, [("a", "AT")]),
        # deleted since: as it was then
        ([], {}, {"a": 1}, [("a", "AT")]),
        # deleted and created again since: as it was then
        (["a"], {"a": 9}, {"a": 1}, [("a", "AT")]),
        # stored, unchanged, but not shown (not an object of the list): not listed
        ([], {"a": 1}, {"a": 1}, []),
        # shown, never stored (a region's device at a root): as now
        (["/regions/r/x"], {}, {}, [("/regions/r/x", "CURRENT")]),
    ],
)
def test_snapshot(
    current: list[str], now: dict[str, int], at: dict[str, int], listed: list[tuple[str, str]]
) -> None:
    assert [(k, s.name) for k, s in snapshot(current, now, at)] == listed
    assert all(isinstance(s, Source) for _, s in snapshot(current, now, at))


@pytest.mark.parametrize(
    ("cached", "now", "at", "listed"),
    [
        # the cache in step with the store: as shown now
        (
            {"a": 1, "b": 2},
            {"a": 1, "b": 2},
            {"a": 1, "b": 2},
            [("a", "CURRENT"), ("b", "CURRENT")],
        ),
        # the cache behind a change: as stored (docs/soak.md, seed 62's stale read)
        ({"a": 1}, {"a": 5}, {"a": 5}, [("a", "AT")]),
        # created at the leader, not in the cache yet: as stored
        ({}, {"a": 5}, {"a": 5}, [("a", "AT")]),
        # deleted at the leader, still in the cache: not listed
        ({"a": 1}, {}, {}, []),
        # a list's later page: changed since its revision, as then, whatever the cache
        ({"a": 9}, {"a": 9}, {"a": 1}, [("a", "AT")]),
    ],
)
def test_snapshot_takes_the_store_where_the_cache_lags_it(
    cached: dict[str, int], now: dict[str, int], at: dict[str, int], listed: list[tuple[str, str]]
) -> None:
    got = snapshot([*cached, "built-in"], now, at, cached=cached)
    assert [(k, s.name) for k, s in got] == sorted([*listed, ("built-in", "CURRENT")])


def test_after_starts_past_the_tokens_key_even_when_it_is_gone() -> None:
    keys = ["/d/a", "/d/b", "/d/d"]
    assert after(keys, None) == 0
    assert after(keys, ContinueToken(KIND, "", 1, "/d/b")) == 2
    assert after(keys, ContinueToken(KIND, "", 1, "/d/c")) == 2  # deleted since: no skip
    assert after(keys, ContinueToken(KIND, "", 1, "/d/z")) == 3
    assert after(keys, ContinueToken(KIND, "", 1, "/")) == 0
