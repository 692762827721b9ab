"""A history of operations on registers (one per key) and a linearizability checker for it.

The soak harness records every operator call it makes: an apply or a delete of a deployment is
a *write* of a register (the deployment's name) with a value that no other write uses (an
annotation naming the write), a ``get`` is a *read* of the value it saw (``None``: absent). Each
operation has the time it was called and the time its answer came back.

The checker is the algorithm of Wing & Gong with the memoisation of Lowe ("Testing for
linearizability", 2017), as porcupine implements it, applied per key (a history of registers
is linearizable iff the history of each register is: P-compositionality):

* the history becomes a list of call and return entries ordered by time (a call before a return
  at the same instant: the two operations are taken as concurrent, never ordered by a tie);
* it linearizes the first call it can (the model accepts it and the pair (linearized set,
  state) was not tried before), lifting the call and its return out of the list; on reaching a
  return whose call is not linearized yet, it backtracks to the last choice;
* the history is linearizable when the list empties, not when the stack of choices does.

What counts as an answer (Jepsen's rule):

* ``ok``: the call's effect is known (an acknowledged write; a read and what it saw);
* ``fail``: the call certainly had no effect (refused before anything was written): dropped;
* ``unknown``: the answer never came or was an error that cannot rule out the effect (timeout,
  the connection lost, a replica gone): a write that may take effect at any time after its call,
  even after the history ends (its return is put at infinity); an unknown read is dropped.

Pure: no clock, no I/O. ``tests/soak/test_soak_history.py`` checks it against a brute-force
search over every order on small random histories.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["write", "read"]
Outcome = Literal["ok", "fail", "unknown"]


@dataclass(frozen=True)
class Op:
    id: int
    key: str
    kind: Kind
    value: str | None  # write: the value written (None: a delete); read: the value seen
    start: float
    end: float  # math.inf for an unknown write
    outcome: Outcome = "ok"
    client: str = ""


@dataclass
class KeyResult:
    key: str
    ok: bool
    ops: int
    # on failure: the operations of the longest linearizable prefix found, in order, and the
    # operation whose return no linearization could reach (the smallest window to look at)
    linearized: list[Op] = field(default_factory=list)
    stuck_at: Op | None = None
    concurrent: list[Op] = field(default_factory=list)  # calls open when ``stuck_at`` returned


@dataclass
class Result:
    ok: bool
    keys: list[KeyResult]

    @property
    def failures(self) -> list[KeyResult]:
        return [k for k in self.keys if not k.ok]


def prepare(ops: Iterable[Op]) -> list[Op]:
    """Drop what cannot have had an effect; put unknown writes' returns at infinity."""
    kept = []
    for given in ops:
        if given.outcome == "fail" or (given.outcome == "unknown" and given.kind == "read"):
            continue
        op = given
        if op.outcome == "unknown":
            op = Op(op.id, op.key, op.kind, op.value, op.start, math.inf, "unknown", op.client)
        if op.end < op.start:
            raise ValueError(f"operation {op.id} returns before it is called")
        kept.append(op)
    return kept


class _Entry:
    __slots__ = ("is_call", "match", "next", "op", "prev")

    def __init__(self, op: Op | None, is_call: bool) -> None:
        self.op = op
        self.is_call = is_call
        self.match: _Entry | None = None
        self.prev: _Entry | None = None
        self.next: _Entry | None = None


def _step(state: str | None, op: Op) -> tuple[bool, str | None]:
    if op.kind == "write":
        return True, op.value
    return op.value == state, state


def check_key(key: str, ops: list[Op], initial: str | None = None) -> KeyResult:
    """Whether one register's history (already :func:`prepare`d) is linearizable."""
    if not ops:
        return KeyResult(key, True, 0)
    index = {op.id: i for i, op in enumerate(ops)}
    events: list[tuple[float, int, Op]] = []
    for op in ops:
        events.append((op.start, 0, op))  # 0: calls first at a tie
        events.append((op.end, 1, op))
    events.sort(key=lambda e: (e[0], e[1], e[2].id))
    head = _Entry(None, False)
    last = head
    calls: dict[int, _Entry] = {}
    for _, kind, op in events:
        entry = _Entry(op, kind == 0)
        if kind == 0:
            calls[op.id] = entry
        else:
            calls[op.id].match = entry
        last.next = entry
        entry.prev = last
        last = entry

    def lift(call: _Entry) -> None:
        for e in (call, call.match):
            assert e is not None and e.prev is not None
            e.prev.next = e.next
            if e.next is not None:
                e.next.prev = e.prev

    def unlift(call: _Entry) -> None:
        for e in (call.match, call):  # reverse order of lift
            assert e is not None and e.prev is not None
            e.prev.next = e
            if e.next is not None:
                e.next.prev = e

    state = initial
    linearized = 0  # bitset of op indices
    cache: set[tuple[int, str | None]] = set()
    stack: list[tuple[_Entry, str | None]] = []
    best: list[Op] = []
    stuck: _Entry | None = None
    entry = head.next
    while head.next is not None:
        assert entry is not None
        op = entry.op
        assert op is not None
        if entry.is_call:
            accepted, new_state = _step(state, op)
            bit = 1 << index[op.id]
            if accepted and (linearized | bit, new_state) not in cache:
                cache.add((linearized | bit, new_state))
                stack.append((entry, state))
                state = new_state
                linearized |= bit
                lift(entry)
                if len(stack) > len(best):
                    best = [e.op for e, _ in stack if e.op is not None]
                    stuck = None
                entry = head.next
            else:
                entry = entry.next
        else:  # a return whose call is not linearized: undo the last choice
            if len(stack) >= len(best) and stuck is None:
                stuck = entry
            if not stack:
                return _failure(key, ops, best, stuck or entry)
            call, state = stack.pop()
            assert call.op is not None
            linearized &= ~(1 << index[call.op.id])
            unlift(call)
            entry = call.next
    return KeyResult(key, True, len(ops))


def _failure(key: str, ops: list[Op], best: list[Op], stuck: _Entry) -> KeyResult:
    blocked = stuck.op
    assert blocked is not None
    done = {op.id for op in best}
    concurrent = [
        op for op in ops if op.id not in done and op.id != blocked.id and op.start <= blocked.end
    ]
    return KeyResult(key, False, len(ops), best, blocked, concurrent)


def check(ops: Iterable[Op], initial: dict[str, str | None] | None = None) -> Result:
    """Every key's history checked on its own."""
    by_key: dict[str, list[Op]] = {}
    for op in prepare(ops):
        by_key.setdefault(op.key, []).append(op)
    results = [
        check_key(key, key_ops, (initial or {}).get(key)) for key, key_ops in sorted(by_key.items())
    ]
    return Result(all(r.ok for r in results), results)


def describe(result: KeyResult) -> str:
    """A failure in words: the order found, then the operation nothing could place."""
    if result.ok:
        return f"{result.key}: linearizable ({result.ops} operations)"
    lines = [f"{result.key}: NOT linearizable ({result.ops} operations)"]
    lines.append("  longest linearizable order found:")
    lines += [f"    {_op_text(op)}" for op in result.linearized[-8:]]
    if result.stuck_at is not None:
        lines.append(f"  no order reaches the return of: {_op_text(result.stuck_at)}")
    if result.concurrent:
        lines.append("  operations still open then:")
        lines += [f"    {_op_text(op)}" for op in result.concurrent[:8]]
    return "\n".join(lines)


def _op_text(op: Op) -> str:
    end = "?" if math.isinf(op.end) else f"{op.end:.3f}"
    what = f"{op.kind}({op.value!r})"
    return f"#{op.id} {what} [{op.start:.3f} .. {end}] {op.outcome} {op.client}".rstrip()
