"""Memory-aware batching as tables: the rows a batch may merge from the memory available."""

from __future__ import annotations

import pytest

from edged.reconcile.batchsizing import effective_batch, row_bytes, shape_row_bytes

KI = 1024


@pytest.mark.parametrize(
    ("declared", "available", "reserve", "sharing", "per_row", "rows"),
    [
        (8, 1000 * KI, 0, 1, 10 * KI, 8),  # room for 100 rows: the declared 8
        (8, 1000 * KI, 950 * KI, 1, 10 * KI, 4),  # 50 KiB: 5 rows -> the power of two below
        (8, 1000 * KI, 950 * KI, 2, 10 * KI, 2),  # shared by two replicas: 2 rows each
        (8, 1000 * KI, 995 * KI, 1, 10 * KI, 1),  # not one row: still 1 (requests are served)
        (8, 900 * KI, 950 * KI, 1, 10 * KI, 1),  # under the floor: 1
        (6, 1000 * KI, 940 * KI, 1, 10 * KI, 6),  # 6 fit: the declared 6, not a power of two
        (6, 1000 * KI, 950 * KI, 1, 10 * KI, 4),
        (1, 10**12, 0, 1, 1, 1),  # declared 1 stays 1
    ],
)
def test_effective_batch(
    declared: int, available: int, reserve: int, sharing: int, per_row: int, rows: int
) -> None:
    assert (
        effective_batch(
            declared, available=available, reserve=reserve, sharing=sharing, per_row=per_row
        )
        == rows
    )


def test_small_moves_of_memory_do_not_change_the_size() -> None:
    sizes = {
        effective_batch(64, available=a * KI, reserve=0, sharing=1, per_row=KI)
        for a in range(40, 63)
    }
    assert sizes == {32}


def test_row_bytes_from_shapes_and_observed_growth() -> None:
    inputs = [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    outputs = [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    estimate = shape_row_bytes(inputs, outputs)
    assert estimate == 64 * (48 + 32 + 4) + 10 * (4 + 24)
    assert row_bytes(estimate, 0, 8) == estimate  # nothing observed yet
    assert row_bytes(estimate, 8 * 100 * KI, 8) == 100 * KI  # a full batch grew it by 800 KiB
    # unknown dims count as one value; an image input counts every pixel
    image = [{"name": "x", "datatype": "UINT8", "shape": [-1, 3, 224, 224]}]
    assert shape_row_bytes(image, []) == 3 * 224 * 224 * (48 + 32 + 1)
    assert shape_row_bytes([{"name": "x", "datatype": "FP32", "shape": [-1, -1]}], []) == 84
