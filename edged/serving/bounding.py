"""How large an inference request body may be (pure: data in, a limit and its reason out).

A request can never need more bytes than its tensors can hold: the model's inputs, at most
``maxBatchSize`` rows of them, written as JSON (the binary tensor extension is smaller), plus
the JSON around them. The control process checks that limit against ``Content-Length``
before it reads a byte of the body, and against the bytes as they arrive, so a worker never
receives a request it cannot afford. A model whose inputs have a free dimension beyond the
batch one has no such bound: the configured ceiling applies. Either way the limit is also
held under a share of the replica's memory limit, since decoding a JSON body costs the
worker up to about 30 times its size in Python objects before it becomes a tensor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# The longest a JSON number of a tensor can reasonably take, with its separator and some
# indentation: "-1.1754943508222875e-38, " is 25 bytes; pretty-printers add a newline and
# indentation per value.
JSON_BYTES_PER_VALUE = 48
# Request id, names, datatypes, shapes, parameters, requested outputs.
FRAMING_BYTES = 64 * 1024
# A body may take at most this share of the replica's memory limit.
MEMORY_SHARE = 64


def request_body_limit(
    inputs: Iterable[Mapping[str, Any]],
    *,
    max_batch: int,
    batchable: bool,
    memory_bytes: int | None,
    ceiling: int,
) -> tuple[int, str]:
    """The largest body an infer request to this model may have, and why (for the 413).

    ``inputs`` are the model's inputs as its worker reports them (``name``, ``datatype``,
    ``shape`` with -1 for a free dimension)."""
    values = 0
    free: str | None = None
    for spec in inputs:
        shape = [int(d) for d in spec.get("shape", [])]
        count = 1
        for i, dim in enumerate(shape):
            if dim >= 0:
                count *= dim
            elif i == 0 and batchable:
                count *= max(1, max_batch)
            else:
                free = str(spec.get("name", "?"))
                break
        values += count
    limit, why = ceiling, "inference.maxRequestBytes"
    if free is None:
        derived = values * JSON_BYTES_PER_VALUE + FRAMING_BYTES
        if derived < limit:
            rows = f"{max_batch} rows of " if batchable else ""
            limit, why = derived, f"the most {rows}this model's inputs can take"
    elif limit == ceiling:
        why = f"inference.maxRequestBytes: input {free!r} has a free dimension"
    if memory_bytes is not None and memory_bytes // MEMORY_SHARE < limit:
        limit = memory_bytes // MEMORY_SHARE
        why = f"1/{MEMORY_SHARE} of the replica's memory limit"
    return limit, why


# Open files edged keeps for itself beyond its sockets' connections: worker socket pairs and
# pipes, the store, the hub link, inotify, udev, logs.
RESERVED_FDS = 256
STATUS_CONNECTIONS = 64


def connection_caps(open_files: int, wanted: int) -> tuple[int, int, str]:
    """The inference and status sockets' connection caps under an open-files limit, and a
    warning when the inference cap had to be lowered ("" when not).

    The status socket keeps its own share and the reserve stays free, so status and replica
    restarts keep working when the inference socket is full."""
    room = open_files - RESERVED_FDS - STATUS_CONNECTIONS
    if wanted <= room:
        return wanted, STATUS_CONNECTIONS, ""
    cap = max(1, room)
    return (
        cap,
        STATUS_CONNECTIONS,
        f"inference.maxConnections lowered from {wanted} to {cap}: the open-files limit is "
        f"{open_files} (raise LimitNOFILE)",
    )
