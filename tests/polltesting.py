"""Waiting for a condition with a deadline, the one way tests wait instead of sleeping.

* :func:`eventually` (``await``, in async tests): polls a predicate, or an async one, until
  it returns something truthy, and returns that.
* :func:`wait_for`: the same for blocking tests (processes, sockets, browsers); by default it
  also rides over the errors of a thing not up yet (OSError, KeyError, IndexError, ValueError).

Both fail with ``AssertionError("timed out waiting for <what>...")`` after the deadline; the
interval between polls is the caller's (each caller keeps the one it had)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

NOT_UP_YET: tuple[type[BaseException], ...] = (OSError, KeyError, IndexError, ValueError)
"""What :func:`wait_for` takes as "not yet" by default: a socket not listening, a file not
written, a key not present, JSON half written."""


def _failure(what: str, within: float, detail: Callable[[], str] | None, last: object) -> str:
    text = f"timed out waiting for {what} ({within:g} s)"
    if detail is not None:
        text += f": {detail()}"
    if last is not None:
        text += f" (last error: {last})"
    return text


async def eventually(
    predicate: Callable[[], Any],
    within: float = 2.0,
    what: str = "condition",
    *,
    interval: float = 0.001,
    detail: Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns something truthy, and return it;
    AssertionError after ``within`` seconds (``detail()`` is added to the message)."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(_failure(what, within, detail, None))
        await asyncio.sleep(interval)


def wait_for(
    cond: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "condition",
    *,
    interval: float = 0.05,
    tolerate: tuple[type[BaseException], ...] = NOT_UP_YET,
    detail: Callable[[], str] | None = None,
) -> Any:
    """Poll ``cond`` until it returns something truthy, and return it; errors of the kinds in
    ``tolerate`` count as "not yet". AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = cond()
            if value:
                return value
        except tolerate as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(_failure(what, timeout, detail, last))
        time.sleep(interval)
