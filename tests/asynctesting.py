"""Helpers for async tests (pytest-asyncio is not used): a fresh loop per test, a timeout,
a failure on leaked tasks; and, from :mod:`polltesting`, polling with a deadline instead of
sleeps."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from polltesting import eventually  # noqa: F401 - re-exported: the one polling helper

LEAK_GRACE = 2.0  # a task still pending this long after the test is a leak
TEST_TIMEOUT = (
    30.0  # a guard against hangs, not a timed assertion: CLI subprocesses on a busy machine
)


def async_test(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test in a fresh loop, with a timeout, failing on leaked tasks."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        async def main() -> None:
            await asyncio.wait_for(fn(*args, **kwargs), TEST_TIMEOUT)
            leaked = asyncio.all_tasks() - {asyncio.current_task()}
            if leaked:  # grpc's server ends a just-refused call's tasks a tick after stop()
                _, leaked = await asyncio.wait(leaked, timeout=LEAK_GRACE)
            assert not leaked, f"leaked tasks: {leaked}"

        asyncio.run(main())

    return wrapper
