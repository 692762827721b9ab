"""A revision's accuracy on the validation set its artifact ships (run in the worker).

The evaluation itself is :mod:`edgefleet.validationsets` (edgectl's ``models variants``
reports the accuracy change of a precision variant with the same code).
"""

from __future__ import annotations

from edgefleet.validationsets import (
    CHUNK,
    FILE_NAME,
    MAX_SAMPLES,
    MAX_UNPACKED_BYTES,
    ValidationInvalid,
    evaluate,
)

__all__ = [
    "CHUNK",
    "FILE_NAME",
    "MAX_SAMPLES",
    "MAX_UNPACKED_BYTES",
    "ValidationInvalid",
    "evaluate",
]
