"""The frame codec between edged and its workers: any split of the byte stream decodes the same."""

from __future__ import annotations

import pytest

from edged.runtime.framing import (
    HEADER,
    HEADER_SIZE,
    MAX_FRAME,
    FrameError,
    FrameReader,
    FrameType,
    encode_frame,
)

Frame = tuple[int, int, bytes]

FRAMES: list[Frame] = [
    (FrameType.INFER, 1, b"\x00\x00\x00\x05hello"),
    (FrameType.PING, 2, b""),
    (FrameType.RESULT, 1, b"x" * 300),
    (FrameType.DRAIN, 0xFFFFFFFF, b""),
    (FrameType.READY, 0, b'{"inputs": []}'),
]
STREAM = b"".join(encode_frame(*f) for f in FRAMES)


def reader() -> tuple[FrameReader, list[Frame]]:
    got: list[Frame] = []
    return FrameReader(lambda t, r, p: got.append((t, r, bytes(p)))), got


def test_encode_frame_layout() -> None:
    data = encode_frame(FrameType.PONG, 7, b"abc")
    assert data == HEADER.pack(3, FrameType.PONG, 7) + b"abc"
    assert len(data) == HEADER_SIZE + 3


def test_one_frame_per_chunk() -> None:
    r, got = reader()
    for frame in FRAMES:
        r.feed(encode_frame(*frame))
    assert got == FRAMES


def test_all_frames_in_one_chunk() -> None:
    r, got = reader()
    r.feed(STREAM)
    assert got == FRAMES


def test_stream_split_at_every_byte() -> None:
    for cut in range(1, len(STREAM)):
        r, got = reader()
        r.feed(STREAM[:cut])
        r.feed(STREAM[cut:])
        assert got == FRAMES, f"split at byte {cut}"


def test_stream_split_in_three_anywhere_in_the_first_frames() -> None:
    head = _frame_ends()[1] + HEADER_SIZE + 1  # into the third frame
    for a in range(1, head):
        for b in range(a, head + 1):
            r, got = reader()
            for piece in (STREAM[:a], STREAM[a:b], STREAM[b:]):
                r.feed(piece)
            assert got == FRAMES, f"split at bytes {a} and {b}"


def test_stream_fed_one_byte_at_a_time() -> None:
    r, got = reader()
    for i in range(len(STREAM)):
        r.feed(STREAM[i : i + 1])
        done = sum(1 for end in _frame_ends() if end <= i + 1)
        assert len(got) == done  # a frame is delivered as soon as its last byte arrives
    assert got == FRAMES


def test_empty_feed_is_harmless() -> None:
    r, got = reader()
    r.feed(b"")
    r.feed(STREAM[:5])
    r.feed(b"")
    r.feed(STREAM[5:])
    assert got == FRAMES


def test_oversized_frame_is_refused() -> None:
    r, got = reader()
    r.feed(encode_frame(FrameType.PING, 1))
    with pytest.raises(FrameError, match="exceeds the limit"):
        r.feed(HEADER.pack(MAX_FRAME + 1, FrameType.INFER, 2) + b"x" * 10)
    assert got == [(FrameType.PING, 1, b"")]


def test_oversized_frame_is_refused_when_its_header_arrives_in_pieces() -> None:
    r, _ = reader()
    header = HEADER.pack(MAX_FRAME + 1, FrameType.INFER, 2)
    r.feed(header[:4])
    with pytest.raises(FrameError):
        r.feed(header[4:])


def _frame_ends() -> list[int]:
    ends, pos = [], 0
    for _, _, payload in FRAMES:
        pos += HEADER_SIZE + len(payload)
        ends.append(pos)
    return ends


def test_views_hand_payloads_over_without_a_copy() -> None:
    """The worker's reader: whole frames in one read are views of that read's bytes; a frame
    split over reads is copied once; any split decodes the same."""
    got: list[tuple[int, int, object]] = []
    r = FrameReader(lambda t, i, p: got.append((t, i, p)), views=True)
    r.feed(STREAM)
    assert [(t, i, bytes(p)) for t, i, p in got] == FRAMES  # type: ignore[call-overload]
    assert all(isinstance(p, memoryview) and p.readonly for _, _, p in got)
    got.clear()
    for cut in range(0, len(STREAM), 7):
        r.feed(STREAM[cut : cut + 7])
    assert [(t, i, bytes(p)) for t, i, p in got] == FRAMES  # type: ignore[call-overload]


def test_views_gather_a_big_payload_once_into_its_own_buffer() -> None:
    """A 224x224x3 float32 frame arriving in 64 KiB reads is gathered into one buffer of its
    size as the reads come (one copy), and handed over as that buffer."""
    payload = bytes(range(256)) * (224 * 224 * 3 * 4 // 256)
    stream = encode_frame(FrameType.INFER, 9, payload) + encode_frame(FrameType.PING, 10)
    got: list[tuple[int, int, object]] = []
    r = FrameReader(lambda t, i, p: got.append((t, i, p)), views=True)
    for cut in range(0, len(stream), 65536):
        r.feed(stream[cut : cut + 65536])
    (ftype, req_id, big), ping = got
    assert (ftype, req_id) == (FrameType.INFER, 9)
    assert type(big) is bytearray and big == payload
    assert ping[:2] == (FrameType.PING, 10) and bytes(ping[2]) == b""  # type: ignore[call-overload]


@pytest.mark.parametrize("cut", [3, HEADER_SIZE, HEADER_SIZE + 1])
def test_views_refuse_an_oversized_frame_however_it_is_split(cut: int) -> None:
    data = HEADER.pack(MAX_FRAME + 1, FrameType.INFER, 1) + b"x"
    r = FrameReader(lambda t, i, p: None, views=True)
    with pytest.raises(FrameError):
        r.feed(data[:cut])
        r.feed(data[cut:])


def test_views_decode_every_two_way_split_the_same() -> None:
    got: list[tuple[int, int, bytes]] = []
    for cut in range(len(STREAM) + 1):
        got.clear()
        r = FrameReader(lambda t, i, p: got.append((t, i, bytes(p))), views=True)
        r.feed(STREAM[:cut])
        r.feed(STREAM[cut:])
        assert got == FRAMES, cut
