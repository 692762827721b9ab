"""The artifact chunk streamer (edgefleet.artifacts.streaming): a real file read from an
offset in chunks, resumed, ended early, and refused before the first chunk."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from asynctesting import async_test

from edgefleet.artifacts.streaming import CHUNK, OffsetPastEnd, read_chunks


async def collect(path: Path, offset: int = 0, chunk: int = CHUNK) -> list[tuple[int, bytes]]:
    return [pair async for pair in read_chunks(path, offset, chunk=chunk)]


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(2 * CHUNK + 1000))
    return path


@pytest.mark.parametrize(
    ("offset", "chunk", "offsets"),
    [
        (0, CHUNK, [0, CHUNK, 2 * CHUNK]),
        (CHUNK + 5, CHUNK, [CHUNK + 5, 2 * CHUNK + 5]),
        (2 * CHUNK + 1000, CHUNK, []),  # at the end: nothing left to send
        (0, 1000 * CHUNK, [0]),
        (2 * CHUNK + 990, 4, [2 * CHUNK + 990 + i for i in (0, 4, 8)]),
    ],
)
def test_the_chunks_cover_the_file_from_the_offset(
    artifact: Path, offset: int, chunk: int, offsets: list[int]
) -> None:
    got = asyncio.run(collect(artifact, offset, chunk))
    assert [at for at, _ in got] == offsets
    assert b"".join(data for _, data in got) == artifact.read_bytes()[offset:]
    assert all(0 < len(data) <= chunk for _, data in got)


@async_test
async def test_a_consumer_that_stops_early_closes_the_file(artifact: Path) -> None:
    fds = len(os.listdir("/proc/self/fd"))
    stream = read_chunks(artifact)
    at, data = await anext(stream)
    assert (at, len(data)) == (0, CHUNK)
    assert len(os.listdir("/proc/self/fd")) == fds + 1
    await stream.aclose()
    assert len(os.listdir("/proc/self/fd")) == fds


def test_an_offset_past_the_end_is_refused_before_any_chunk(artifact: Path) -> None:
    size = artifact.stat().st_size
    with pytest.raises(OffsetPastEnd, match=f"offset {size + 1} is past the end") as info:
        asyncio.run(collect(artifact, size + 1))
    assert (info.value.size, info.value.reason) == (size, "OffsetPastEnd")


def test_an_absent_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        asyncio.run(collect(tmp_path / "absent"))


@pytest.mark.parametrize(("offset", "chunk"), [(-1, CHUNK), (0, 0)])
def test_a_negative_offset_or_empty_chunk_is_refused(
    artifact: Path, offset: int, chunk: int
) -> None:
    with pytest.raises(ValueError):
        asyncio.run(collect(artifact, offset, chunk))
