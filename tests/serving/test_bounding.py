"""The body limit of an infer request and the connection caps: pure, tested as tables."""

from __future__ import annotations

from typing import Any

import pytest

from edged.serving.bounding import (
    FRAMING_BYTES,
    JSON_BYTES_PER_VALUE,
    RESERVED_FDS,
    STATUS_CONNECTIONS,
    connection_caps,
    request_body_limit,
)

MiB = 1 << 20
TINY_8 = (
    8 * 64 * JSON_BYTES_PER_VALUE + FRAMING_BYTES,
    "the most 8 rows of this model's inputs can take",
)
TWO_4 = (
    4 * (12 + 2) * JSON_BYTES_PER_VALUE + FRAMING_BYTES,
    "the most 4 rows of this model's inputs can take",
)
ENOUGH = 1024 + RESERVED_FDS + STATUS_CONNECTIONS
TINY = [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
TWO = [
    {"name": "a", "datatype": "FP32", "shape": [-1, 3, 4]},
    {"name": "b", "datatype": "INT64", "shape": [-1, 2]},
]
FREE = [{"name": "text", "datatype": "INT64", "shape": [-1, -1]}]
FIXED = [{"name": "x", "datatype": "FP32", "shape": [1, 10]}]

CASES: dict[str, tuple[list[dict[str, Any]], int, bool, int | None, int, tuple[int, str]]] = {
    "batch of 8 rows of 64 floats": (
        TINY, 8, True, None, 64 * MiB,
        TINY_8,
    ),
    "two inputs add up": (
        TWO, 4, True, None, 64 * MiB,
        TWO_4,
    ),
    "fixed shape, no batching": (
        FIXED, 1, False, None, 64 * MiB,
        (10 * JSON_BYTES_PER_VALUE + FRAMING_BYTES, "the most this model's inputs can take"),
    ),
    "a free dimension: the ceiling": (
        FREE, 8, True, None, 64 * MiB,
        (64 * MiB, "inference.maxRequestBytes: input 'text' has a free dimension"),
    ),
    "dynamic batch but not batching: the ceiling": (
        TINY, 1, False, None, 64 * MiB,
        (64 * MiB, "inference.maxRequestBytes: input 'input' has a free dimension"),
    ),
    "the ceiling when lower than the derived limit": (
        TINY, 8, True, None, 1000, (1000, "inference.maxRequestBytes"),
    ),
    "memory limit bounds a free dimension": (
        FREE, 8, True, 1024 * MiB, 64 * MiB,
        (16 * MiB, "1/64 of the replica's memory limit"),
    ),
    "memory limit above the derived limit: no effect": (
        TINY, 8, True, 1024 * MiB, 64 * MiB,
        TINY_8,
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("inputs", "max_batch", "batchable", "memory", "ceiling", "expected"),
    CASES.values(),
    ids=CASES.keys(),
)
def test_request_body_limit(
    inputs: list[dict[str, Any]],
    max_batch: int,
    batchable: bool,
    memory: int | None,
    ceiling: int,
    expected: tuple[int, str],
) -> None:
    got = request_body_limit(
        inputs, max_batch=max_batch, batchable=batchable, memory_bytes=memory, ceiling=ceiling
    )
    assert got == expected


def test_the_attack_body_is_far_over_the_limit_of_a_64_float_model() -> None:
    # ~31 million "0," values: what took a worker with a 1 GiB limit down
    limit, _ = request_body_limit(
        TINY, max_batch=8, batchable=True, memory_bytes=1 << 30, ceiling=64 * MiB
    )
    assert limit < 100 * 1024 < 62 * MiB


CAPS = {
    "room for the wanted cap": (65536, 1024, (1024, STATUS_CONNECTIONS, "")),
    "exactly enough": (ENOUGH, 1024, (1024, STATUS_CONNECTIONS, "")),
    "systemd's default 1024: lowered": (
        1024, 1024,
        (1024 - RESERVED_FDS - STATUS_CONNECTIONS, STATUS_CONNECTIONS,
         "inference.maxConnections lowered from 1024 to 704: the open-files limit is 1024 "
         "(raise LimitNOFILE)"),
    ),
    "absurdly low: still one": (
        100, 1024,
        (1, STATUS_CONNECTIONS,
         "inference.maxConnections lowered from 1024 to 1: the open-files limit is 100 "
         "(raise LimitNOFILE)"),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("open_files", "wanted", "expected"), CAPS.values(), ids=CAPS.keys())
def test_connection_caps(open_files: int, wanted: int, expected: tuple[int, int, str]) -> None:
    assert connection_caps(open_files, wanted) == expected
