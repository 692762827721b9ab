"""What an ``Apply`` means, decided before anything is written: pure functions.

:func:`parse_documents` turns the JSON documents of one request into canonical objects or
raises :class:`~edgefleet.errors.ValidationError` with *every* problem, each path starting with
``documents[i]`` (the document's index in the request). :func:`outcome_of` compares a
canonical object with what is stored. The servicer (:mod:`hub.api.admin`) does the I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from edgefleet.api import SUPPORTED_KINDS, Secret, parse_manifest
from edgefleet.api.quantities import describe
from edgefleet.api.validating import Problems
from edgefleet.errors import ValidationError
from hub.decide import regionslice
from hub.decide.presentation import KIND_REGION, REGION_MANAGED

OBJECT_KINDS: tuple[str, ...] = SUPPORTED_KINDS
"""The kinds an operator applies (stored under ``/objects/KIND/NAME``)."""

MAX_DOCUMENT_BYTES = 1 << 20
MAX_DOCUMENTS = 500


class Outcome(StrEnum):
    CREATED = "created"
    CONFIGURED = "configured"
    UNCHANGED = "unchanged"


@dataclass(frozen=True, slots=True)
class ParsedObject:
    kind: str
    name: str
    manifest: Mapping[str, Any]  # canonical (to_dict() of the typed object; a Secret redacted)
    secret: Secret | None = None  # a Secret's values: sealed before anything is stored


class _DuplicateKey(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(f"duplicate key {key!r}")
        result[key] = value
    return result


def _decode(data: bytes) -> object:
    """The JSON value of ``data``; ValueError saying what is wrong."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"is not UTF-8 text (byte {exc.start})") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except _DuplicateKey as exc:
        raise ValueError(f"invalid JSON: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise ValueError("is nested too deeply") from None


def parse_object(doc: object) -> ParsedObject:
    """One document as a canonical object of a kind in :data:`OBJECT_KINDS`.

    Raises ValidationError (paths relative to the document)."""
    kind = doc.get("kind") if isinstance(doc, Mapping) else None
    if isinstance(doc, Mapping) and kind not in OBJECT_KINDS:
        problems = Problems()
        if kind == KIND_REGION:  # shown by the hub, never applied
            problems.add("kind", f"{KIND_REGION} objects are not applied: {REGION_MANAGED}")
        else:
            problems.add("kind", f"must be one of {', '.join(OBJECT_KINDS)}, got {describe(kind)}")
        problems.raise_if_any(ValidationError)
    manifest = parse_manifest(doc)
    if isinstance(manifest, Secret):
        return ParsedObject(manifest.kind, manifest.name, manifest.redacted(), manifest)
    return ParsedObject(manifest.kind, manifest.name, manifest.to_dict())


def parse_documents(documents: Sequence[bytes]) -> list[ParsedObject]:
    """Every document of one Apply, canonical; ValidationError with every problem otherwise.

    Problems: a document that is not JSON or not a valid object of a known kind, one larger
    than :data:`MAX_DOCUMENT_BYTES`, two documents with the same kind and name, more than
    :data:`MAX_DOCUMENTS` documents, none at all.
    """
    problems = Problems()
    if not documents:
        problems.add("documents", "no documents: nothing to apply")
    if len(documents) > MAX_DOCUMENTS:
        problems.add(
            "documents", f"at most {MAX_DOCUMENTS} documents per apply, got {len(documents)}"
        )
        problems.raise_if_any(ValidationError)
    parsed: list[ParsedObject] = []
    first_of: dict[tuple[str, str], int] = {}
    for i, data in enumerate(documents):
        prefix = f"documents[{i}]"
        if len(data) > MAX_DOCUMENT_BYTES:
            problems.add(
                prefix,
                f"is larger than {MAX_DOCUMENT_BYTES} bytes ({len(data)}), the most accepted",
            )
            continue
        try:
            doc = _decode(data)
        except ValueError as exc:
            problems.add(prefix, str(exc))
            continue
        if not isinstance(doc, dict):
            problems.add(prefix, f"must be a JSON object, got {describe(doc)}")
            continue
        try:
            obj = parse_object(doc)
        except ValidationError as exc:
            problems.extend(exc.problems, prefix=prefix)
            continue
        for path, reason in regionslice.override_problems(obj.manifest):  # federation overrides
            problems.add(f"{prefix}.{path}", reason)
        key = (obj.kind, obj.name)
        if key in first_of:
            problems.add(
                f"{prefix}.metadata.name",
                f'{obj.kind} "{obj.name}" is already in documents[{first_of[key]}]',
            )
            continue
        first_of[key] = i
        parsed.append(obj)
    problems.raise_if_any(ValidationError)
    return parsed


def resource_versions(documents: Sequence[bytes]) -> list[int]:
    """Each document's ``metadata.resourceVersion`` (what ``edgectl get`` showed: the store
    revision of its last change), for an Apply that checks them. Call after
    :func:`parse_documents` passed; ValidationError naming the document without a usable one."""
    problems = Problems()
    out: list[int] = []
    for i, data in enumerate(documents):
        doc = _decode(data)
        meta = doc.get("metadata", {}) if isinstance(doc, Mapping) else None
        value = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
        if not text.isdigit() or int(text) <= 0:
            problems.add(
                f"documents[{i}].metadata.resourceVersion",
                f"required to check for a concurrent change, got {describe(value)}",
            )
            continue
        out.append(int(text))
    problems.raise_if_any(ValidationError)
    return out


def outcome_of(new: Mapping[str, Any], stored: Mapping[str, Any] | None) -> Outcome:
    """CREATED when nothing is stored, UNCHANGED when the canonical documents are equal."""
    if stored is None:
        return Outcome.CREATED
    return Outcome.UNCHANGED if dict(new) == dict(stored) else Outcome.CONFIGURED


def check_publisher_keys(documents: Sequence[bytes], known: frozenset[str]) -> None:
    """Every publisher key a SecurityBaseline of the request names (``spec.publishers[].keys``)
    is one this hub knows: an artifacts key of its trust root or a key of a TUF delegation
    (``known``). ValidationError naming ``documents[i].spec.publishers[j].keys[k]`` otherwise.
    Call after :func:`parse_documents` passed (the documents parse)."""
    from edgefleet.api import SecurityBaseline
    from edgefleet.trust.publishers import known_key_problems

    problems = Problems()
    for i, data in enumerate(documents):
        doc = _decode(data)
        if not isinstance(doc, Mapping) or doc.get("kind") != SecurityBaseline.KIND:
            continue
        baseline = parse_manifest(doc)
        assert isinstance(baseline, SecurityBaseline)
        for path, message in known_key_problems(baseline, known, prefix=f"documents[{i}]."):
            problems.add(path, message)
    problems.raise_if_any(ValidationError)
