"""The soak harness's linearizability checker (tests/soak/soakhistory.py): known histories,
then random small histories against a brute-force search over every order."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest
from soakhistory import Op, check, check_key, describe, prepare


def w(i: int, value: str | None, start: float, end: float, outcome: str = "ok") -> Op:
    return Op(i, "k", "write", value, start, end, outcome)  # type: ignore[arg-type]


def r(i: int, value: str | None, start: float, end: float, outcome: str = "ok") -> Op:
    return Op(i, "k", "read", value, start, end, outcome)  # type: ignore[arg-type]


def test_sequential_reads_see_the_last_write() -> None:
    assert check([w(1, "a", 0, 1), r(2, "a", 2, 3), w(3, "b", 4, 5), r(4, "b", 6, 7)]).ok


def test_a_stale_read_after_an_acknowledged_write_is_caught() -> None:
    result = check([w(1, "a", 0, 1), w(2, "b", 2, 3), r(3, "a", 4, 5)])
    assert not result.ok
    failure = result.failures[0]
    assert failure.stuck_at is not None and failure.stuck_at.id == 3
    assert "NOT linearizable" in describe(failure) and "#3 read('a')" in describe(failure)


def test_a_lost_acknowledged_write_is_caught() -> None:
    # the final read sees the absent register: the acknowledged write was lost
    assert not check([w(1, "a", 0, 1), r(2, None, 5, 6)]).ok
    # a delete acknowledged in between explains it
    assert check([w(1, "a", 0, 1), w(2, None, 2, 3), r(3, None, 5, 6)]).ok


def test_concurrent_operations_may_take_either_order() -> None:
    assert check([w(1, "a", 0, 10), r(2, "a", 1, 2), r(3, None, 0.5, 0.6)]).ok
    # but once one read saw the new value a later read cannot see the old one
    assert not check([w(1, "a", 0, 10), r(2, "a", 1, 2), r(3, None, 3, 4)]).ok


def test_a_tie_counts_as_concurrent() -> None:
    assert check([w(1, "a", 0, 1), r(2, None, 1, 2)]).ok


def test_an_unknown_write_may_take_effect_at_any_time_after_its_call_or_never() -> None:
    assert check([w(1, "a", 0, 1, "unknown"), r(2, None, 2, 3), r(3, "a", 100, 101)]).ok
    assert check([w(1, "a", 0, 1, "unknown"), r(2, None, 200, 201)]).ok
    # never before it was called
    assert not check([r(2, "a", 0, 1), w(1, "a", 2, 3, "unknown")]).ok
    # and not undone: once seen, it stays until another write
    assert not check([w(1, "a", 0, 1, "unknown"), r(2, "a", 2, 3), r(3, None, 4, 5)]).ok


def test_a_failed_write_had_no_effect() -> None:
    assert not check([w(1, "a", 0, 1, "fail"), r(2, "a", 2, 3)]).ok
    assert check([w(1, "a", 0, 1, "fail"), r(2, None, 2, 3)]).ok


def test_keys_are_checked_apart() -> None:
    ops = [
        Op(1, "x", "write", "a", 0, 1),
        Op(2, "y", "write", "b", 0, 1),
        Op(3, "x", "read", "a", 2, 3),
        Op(4, "y", "read", "a", 2, 3),
    ]
    result = check(ops)
    assert not result.ok and [f.key for f in result.failures] == ["y"]


def test_an_initial_value() -> None:
    assert check([r(1, "v0", 0, 1)], {"k": "v0"}).ok
    assert not check([r(1, "v0", 0, 1)]).ok


def test_a_return_before_its_call_is_refused() -> None:
    with pytest.raises(ValueError, match="returns before it is called"):
        prepare([w(1, "a", 2, 1)])


def brute_force(ops: list[Op]) -> bool:
    """Some order of the operations respects real time and the register."""
    ops = prepare(ops)
    for order in itertools.permutations(ops):
        position = {op.id: i for i, op in enumerate(order)}
        if any(
            position[a.id] > position[b.id] for a in ops for b in ops if a.end < b.start
        ):  # a returned before b was called: a comes first
            continue
        state: str | None = None
        for op in order:
            if op.kind == "write":
                state = op.value
            elif op.value != state:
                break
        else:
            return True
    return False


def random_history(rng: random.Random, n: int) -> list[Op]:
    ops = []
    values: list[str | None] = [None]
    for i in range(n):
        start = rng.uniform(0, 10)
        end = start + rng.uniform(0, 3)
        outcome = rng.choice(["ok", "ok", "ok", "unknown", "fail"])
        if rng.random() < 0.5:
            value = None if rng.random() < 0.2 else f"v{i}"
            values.append(value)
            ops.append(Op(i, "k", "write", value, start, end, outcome))  # type: ignore[arg-type]
        else:
            ops.append(Op(i, "k", "read", rng.choice(values), start, end, outcome))  # type: ignore[arg-type]
    return ops


def test_agrees_with_a_brute_force_search_on_random_histories() -> None:
    rng = random.Random(35)
    seen = {True: 0, False: 0}
    for _ in range(600):
        ops = random_history(rng, rng.randint(1, 6))
        expected = brute_force(ops)
        got = check_key("k", prepare(ops)).ok
        assert got == expected, ops
        seen[expected] += 1
    assert seen[True] > 50 and seen[False] > 50, seen  # both kinds were exercised


def test_a_long_linearizable_history_is_checked_quickly() -> None:
    # 400 operations, many concurrent: the memoisation keeps this fast
    ops = []
    t = 0.0
    current: str | None = None
    for i in range(400):
        if i % 3 == 0:
            current = f"v{i}"
            ops.append(w(i, current, t, t + 0.5))
        else:
            ops.append(r(i, current, t + 0.6, t + 0.9))
        t += 0.3 if i % 3 else 1.0
    assert check(ops).ok
    assert math.isinf(prepare([w(1, "a", 0, 1, "unknown")])[0].end)


def test_the_run_s_charts_are_pngs(tmp_path: Path) -> None:
    """tests/soak/soakplots.py: a PNG per chart, its size, a legend per series; a restarted
    process (another pid) breaks its line."""
    import struct
    import zlib

    from soakplots import HEIGHT, WIDTH, plot_run

    resources = {
        "hub": [(0.0, 1, 50 * 2**20, 20), (5.0, 1, 60 * 2**20, 21), (6.0, 2, 40 * 2**20, 9)]
    }
    windows = [{"begin": 5.5, "end": 6.0}, {"begin": 8.0, "end": None}]
    legends = plot_run(tmp_path, resources, {"dev-0": [1.0, 2.0]}, windows, 10.0)
    assert [p["file"] for p in legends] == ["rss.png", "fds.png", "inference-errors.png"]
    assert legends[0]["y"] == [40.0, 60.0] and set(legends[0]["series"]) == {"hub"}
    for legend in legends:
        data = (tmp_path / legend["file"]).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert (width, height) == (WIDTH, HEIGHT)
        idat = data.index(b"IDAT")
        (length,) = struct.unpack(">I", data[idat - 4 : idat])
        assert len(zlib.decompress(data[idat + 4 : idat + 4 + length])) == (3 * WIDTH + 1) * HEIGHT
