"""Does a file parse as an ONNX model? A check of its protobuf structure, without ``onnx``.

An ONNX file is a serialized ``ModelProto`` (onnx/onnx.proto3). :func:`check_onnx_model`
walks its wire format: every field of the model, of its graph and of each node must be
well-formed (a valid tag and wire type, lengths inside their message), the fields ONNX defines
must have the wire types it gives them, and a model needs ``ir_version``, a ``graph`` and at
least one ``opset_import``. Random bytes, a truncated file, a tarball or a PyTorch checkpoint
fail in the first few bytes, with a message naming what is wrong. It does not check that an
operator exists or that a runtime can load the model (the device's worker does, and reports
``ModelLoadFailed``); it needs neither the ``onnx`` package nor the memory of a full parse
(the file is memory-mapped and walked, nothing is copied).
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import TYPE_CHECKING

from edgefleet.errors import ArtifactError

if TYPE_CHECKING:
    from edgefleet.artifacts.storing import StagedArtifact

VARINT, I64, LEN, I32 = 0, 1, 2, 5
_SGROUP, _EGROUP = 3, 4

# field number -> wire type, for the fields of each message we walk (onnx.proto3)
_MODEL = {1: VARINT, 2: LEN, 3: LEN, 4: LEN, 5: VARINT, 6: LEN, 7: LEN, 8: LEN, 14: LEN}
_GRAPH = {1: LEN, 2: LEN, 5: LEN, 10: LEN, 11: LEN, 12: LEN, 13: LEN, 14: LEN, 15: LEN}
_NODE = {1: LEN, 2: LEN, 3: LEN, 4: LEN, 5: LEN, 6: LEN, 7: LEN}
_OPSET = {1: LEN, 2: VARINT}


class _Malformed(ValueError):
    pass


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end:
            raise _Malformed("a number runs past the end of its message")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise _Malformed("a number longer than 10 bytes")


def _fields(
    buf: memoryview, start: int, end: int, known: dict[int, int], what: str
) -> list[tuple[int, int, int]]:
    """Every field of the message in ``buf[start:end]``: (number, start, end) of each
    length-delimited one, (number, value, -1) of the others."""
    out = []
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise _Malformed(f"{what}: field number 0 at byte {pos}")
        if number in known and known[number] != wire:
            raise _Malformed(f"{what}: field {number} has wire type {wire}, not {known[number]}")
        if wire == VARINT:
            value, pos = _varint(buf, pos, end)
            out.append((number, value, -1))
        elif wire == LEN:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise _Malformed(f"{what}: field {number} runs past the end ({length} bytes)")
            out.append((number, pos, pos + length))
            pos += length
        elif wire in (I64, I32):
            pos += 8 if wire == I64 else 4
            if pos > end:
                raise _Malformed(f"{what}: field {number} runs past the end")
        else:  # groups (3, 4) are not used by ONNX; 6 and 7 do not exist
            raise _Malformed(f"{what}: field {number} has wire type {wire}")
    return out


def _check(buf: memoryview) -> None:
    if not len(buf):
        raise _Malformed("the file is empty")
    model = _fields(buf, 0, len(buf), _MODEL, "model")
    numbers = [f[0] for f in model]
    if 1 not in numbers:
        raise _Malformed("model: no ir_version")
    graphs = [f for f in model if f[0] == 7]
    if len(graphs) != 1:
        raise _Malformed(f"model: {len(graphs)} graphs, expected 1")
    if 8 not in numbers:
        raise _Malformed("model: no opset_import")
    for number, start, end in model:
        if number == 8:
            _fields(buf, start, end, _OPSET, "opset_import")
    _, start, end = graphs[0]
    for number, nstart, nend in _fields(buf, start, end, _GRAPH, "graph"):
        if number == 1:
            node = _fields(buf, nstart, nend, _NODE, "graph.node")
            if not any(f[0] == 4 for f in node):
                raise _Malformed("graph.node: a node without op_type")


def check_onnx_model(path: Path) -> None:
    """Raise :class:`ArtifactError` (reason ``NotAnOnnxModel``) unless ``path`` parses as an
    ONNX ModelProto; OSError when it cannot be read."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise ArtifactError("NotAnOnnxModel", f"{path}: not an ONNX model: the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                _check(view)
            except _Malformed as exc:
                raise ArtifactError("NotAnOnnxModel", f"{path}: not an ONNX model: {exc}") from None
            finally:
                view.release()


class ParsesAsOnnx:
    """A :class:`~edgefleet.artifacts.storing.Verifier`: the staged bytes parse as ONNX."""

    def verify(self, staged: StagedArtifact) -> None:
        try:
            check_onnx_model(staged.path)
        except ArtifactError as exc:
            raise ArtifactError(
                exc.reason, str(exc).replace(str(staged.path), staged.origin, 1)
            ) from None
