"""The runner thread of an inference worker (edged/runtime/worker.py): ONNX Runtime runs a
model slower than :data:`edged.runtime.workerprotocol.INLINE_BELOW_S` there, while the
worker's event loop reads and decodes the next requests and encodes the last batch's answers;
and :class:`OverlapCounts`, the totals of that overlapped work, sent to edged in each PONG
(docs/edged.md, "Inference workers")."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any


class OverlapCounts:
    """Running totals of the work the event loop did while ONNX Runtime ran a batch in the
    runner thread: requests decoded, answers encoded, and batches handed over before the one
    running ended (they started with no hop through the loop)."""

    __slots__ = ("decoded", "encoded", "staged")

    def __init__(self) -> None:
        self.decoded = 0
        self.encoded = 0
        self.staged = 0

    def to_pong(self) -> dict[str, int]:
        return {"decoded": self.decoded, "encoded": self.encoded, "staged": self.staged}


class Runner:
    """The thread ONNX Runtime runs in, for models slower than
    :data:`edged.runtime.workerprotocol.INLINE_BELOW_S`.

    Batches are handed over in order (at most two at once: the one running and the next one,
    ready); each result is posted back to the event loop. ONNX Runtime releases the GIL while
    it runs, so meanwhile the loop reads and decodes the next requests and encodes the
    previous batch's answers, and a batch handed over early starts with no hop through the
    loop."""

    def __init__(self, session: Any, loop: asyncio.AbstractEventLoop, on_ran: Any) -> None:
        self._session = session
        self._loop = loop
        self._on_ran = on_ran
        self._jobs: queue.SimpleQueue[tuple[list[Any], dict[str, Any], Any] | None]
        self._jobs = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, batch: list[Any], feeds: dict[str, Any], outputs: Any) -> None:
        if self._thread is None:  # started with the first batch, inside the sandbox
            # not a daemon: a worker that stops lets the batch in ONNX Runtime end (a thread
            # ended inside it at exit could abort the process); ``close``, always called when
            # serving ends, lets the thread end after the batches handed over
            self._thread = threading.Thread(target=self._serve, name="ort")
            self._thread.start()
        self._jobs.put((batch, feeds, outputs))

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)  # after the batches already handed over

    def _serve(self) -> None:
        session, post = self._session, self._loop.call_soon_threadsafe
        while (job := self._jobs.get()) is not None:
            batch, feeds, outputs = job
            del job
            result: list[Any] | None = None
            error: BaseException | None = None
            started = time.monotonic()
            try:
                result = session.run(list(outputs), feeds)
            except Exception as exc:  # posted with the batch: each request answered 500 with it
                error = exc
            ended = time.monotonic()
            del feeds
            try:
                post(self._on_ran, batch, result, error, started, ended)
            except RuntimeError:  # the loop is closed: nobody is left to answer
                return
