"""Loading manifest files: YAML (several documents) or JSON, into typed manifests.

Every problem of every document is reported in one :class:`ValidationError`. Duplicate keys
in a mapping are problems (a silently overridden field is worse than an error), and so are two
documents with the same kind and name in one file.

Hostile files are bounded before anything is built from them (the composed YAML node graph is
checked first; a problem is ``FILE:LINE: reason``):

* aliases may not expand the document past :data:`MAX_EXPANDED_NODES` values (a "billion
  laughs" file of a few hundred bytes is refused at once instead of growing to gigabytes), nor
  refer to themselves;
* only plain data: strings, integers, finite floats, booleans, null, lists and mappings
  (``!!binary``, ``!!set``, ``!!omap``, custom tags are refused; an unquoted date stays a
  string, as in Kubernetes);
* integers fit in 64 bits (manifests travel as JSON to the hub; a 5,000-digit integer is a
  problem, not a traceback); ``.nan`` and ``.inf`` are refused (JSON has neither).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from edgefleet.api.manifests import Manifest, parse_manifest
from edgefleet.api.quantities import describe
from edgefleet.api.validating import Problems, join_paths
from edgefleet.errors import Problem, ValidationError

MAX_FILE_BYTES = 1 << 20  # 1 MiB
MAX_EXPANDED_NODES = 100_000
"""Values (scalars, lists, mappings) in one file once aliases are expanded."""
MAX_INT_DIGITS = 40
INT_MIN, INT_MAX = -(2**63), 2**63 - 1

if TYPE_CHECKING:
    _BaseLoader = yaml.SafeLoader
else:
    _BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_MERGE_TAG = "tag:yaml.org,2002:merge"
_TAG = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _TIMESTAMP = _TAG + "str", _TAG + "int", _TAG + "float", _TAG + "timestamp"
_PLAIN_TAGS = frozenset(
    _TAG + t for t in ("str", "int", "float", "bool", "null", "map", "seq", "merge")
)


class _BoundError(yaml.YAMLError):
    """A document exceeds a bound or uses a refused feature, at ``line`` (1-based)."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(reason)
        self.line = line
        self.reason = reason


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


class _UniqueKeyLoader(_BaseLoader):
    """The safe loader (libyaml's when available) that rejects duplicate mapping keys and
    checks the bounds of the module doc before constructing anything."""

    def construct_document(self, node: yaml.Node) -> Any:
        self._check_tree(node)
        return super().construct_document(node)

    def _check_tree(self, root: yaml.Node) -> None:
        """Expanded size, self-reference, tags and scalar bounds (iterative: no recursion)."""
        sizes: dict[int, int] = {}
        in_progress: set[int] = set()
        stack: list[tuple[yaml.Node, bool]] = [(root, False)]
        while stack:
            node, done = stack.pop()
            key = id(node)
            if done:
                in_progress.discard(key)
                total = 1 + sum(sizes[id(c)] for c in _children(node))
                if total > MAX_EXPANDED_NODES:
                    raise _BoundError(
                        node.start_mark.line + 1,
                        f"more than {MAX_EXPANDED_NODES} values once aliases are expanded",
                    )
                sizes[key] = total
                continue
            if key in sizes:
                continue
            if key in in_progress:
                raise _BoundError(node.start_mark.line + 1, "an alias refers to itself")
            in_progress.add(key)
            self._check_scalar(node)
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node) if id(c) not in sizes)

    def _check_scalar(self, node: yaml.Node) -> None:
        line = node.start_mark.line + 1
        if node.tag == _TIMESTAMP:
            node.tag = _STR  # an unquoted date stays the text it is
        if node.tag not in _PLAIN_TAGS:
            raise _BoundError(
                line,
                f"the tag {node.tag.replace(_TAG, '!!')} is not allowed (plain data only: "
                "strings, numbers, booleans, null, lists and mappings)",
            )
        if not isinstance(node, yaml.ScalarNode):
            return
        if node.tag == _INT:
            digits = str(node.value).lstrip("+-").replace("_", "")
            value = None
            if len(digits) <= MAX_INT_DIGITS:
                try:
                    value = self.construct_yaml_int(node)
                except ValueError:
                    value = None
            if value is None or not INT_MIN <= value <= INT_MAX:
                raise _BoundError(
                    line,
                    f"the integer {describe(str(node.value)[:24])}"
                    f"{'...' if len(str(node.value)) > 24 else ''} does not fit in 64 bits",
                )
        elif node.tag == _FLOAT and not math.isfinite(self.construct_yaml_float(node)):
            raise _BoundError(
                line, f"{node.value} is not allowed (manifests are JSON: finite numbers only)"
            )

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable: the base constructor reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {describe(key)}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _DuplicateKeyError(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKeyError(f"found duplicate key {describe(key)}")
        result[key] = value
    return result


def _bounded_int(text: str) -> int:
    """JSON integers as the YAML path bounds them (an out-of-bounds one sends the text to the
    YAML path, which reports it with its line)."""
    value = int(text) if len(text) <= MAX_INT_DIGITS else None
    if value is None or not INT_MIN <= value <= INT_MAX:
        raise ValueError("out of bounds")
    return value


def _refused_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        text = f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
        if exc.context and exc.context_mark is not None:
            text += f" ({exc.context} at line {exc.context_mark.line + 1})"
        return text
    return f"invalid YAML: {exc}"


def _decode(text: str | bytes, source: str) -> str:
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_FILE_BYTES:
        raise ValidationError(
            [Problem("", f"is larger than 1 MiB ({MAX_FILE_BYTES} bytes), the most accepted")],
            source=source,
        )
    if isinstance(text, str):
        return text
    try:
        return text.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValidationError(
            [Problem("", f"is not UTF-8 text (byte {exc.start})")], source=source
        ) from exc


def _parse(text: str, source: str) -> list[object]:
    """The documents of ``text``: a JSON object or list of objects, else YAML documents."""
    if text.lstrip().startswith(("{", "[")):
        try:
            parsed = json.loads(
                text,
                object_pairs_hook=_unique_pairs,
                parse_int=_bounded_int,
                parse_constant=_refused_constant,
            )
        except _DuplicateKeyError as exc:
            raise ValidationError([Problem("", f"invalid JSON: {exc}")], source=source) from exc
        except (ValueError, RecursionError):
            pass  # not JSON: perhaps YAML flow style; YAML reports the error if not
        else:
            return parsed if isinstance(parsed, list) else [parsed]
    try:
        return list(yaml.load_all(text, Loader=_UniqueKeyLoader))
    except _BoundError as exc:
        raise ValidationError([Problem("", exc.reason)], source=f"{source}:{exc.line}") from exc
    except yaml.YAMLError as exc:
        raise ValidationError([Problem("", _yaml_problem(exc))], source=source) from exc
    except RecursionError as exc:
        raise ValidationError([Problem("", "is nested too deeply")], source=source) from exc
    except (ValueError, OverflowError, TypeError) as exc:
        # what a YAML constructor raises on a value it cannot build: an integer of more than
        # 4300 digits (Python's limit), a date out of range, an unhashable key...
        raise ValidationError([Problem("", f"invalid YAML: {exc}")], source=source) from exc


def load_documents(text: str | bytes, *, source: str) -> list[dict[str, Any]]:
    """The mappings in ``text`` (YAML documents, or JSON), empty documents skipped.

    Documents are numbered from 0 among the non-empty ones: ``documents[2]: must be a mapping``.
    """
    found = [doc for doc in _parse(_decode(text, source), source) if doc is not None]
    problems = [
        Problem(f"documents[{i}]", f"must be a mapping, got {describe(doc)}")
        for i, doc in enumerate(found)
        if not isinstance(doc, dict)
    ]
    if problems:
        raise ValidationError(problems, source=source)
    return [doc for doc in found if isinstance(doc, dict)]


def parse_documents(docs: list[dict[str, Any]], *, source: str) -> list[Manifest]:
    """Typed manifests of ``docs``, all problems reported together.

    With more than one document, problem paths start with ``documents[i].``. Two documents of
    the same kind and name are a problem.
    """
    problems = Problems()
    manifests: list[Manifest] = []
    first_of: dict[tuple[str, str], int] = {}
    for i, doc in enumerate(docs):
        prefix = f"documents[{i}]" if len(docs) > 1 else ""
        try:
            manifest = parse_manifest(doc, source=f"{source}[{i}]")
        except ValidationError as exc:
            problems.extend(exc.problems, prefix=prefix)
            continue
        key = (manifest.kind, manifest.name)
        if key in first_of:
            problems.add(
                join_paths(prefix, "metadata.name"),
                f'{manifest.kind} "{manifest.name}" is already in documents[{first_of[key]}]',
            )
            continue
        first_of[key] = i
        manifests.append(manifest)
    problems.raise_if_any(ValidationError, source=source)
    return manifests


def load_manifests(text: str | bytes, *, source: str) -> list[Manifest]:
    """Typed manifests from YAML or JSON text (see :func:`load_documents`)."""
    return parse_documents(load_documents(text, source=source), source=source)


def load_manifest_file(path: Path) -> list[Manifest]:
    """Typed manifests from a file; an unreadable file is a :class:`ValidationError` too."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ValidationError([Problem("", f"cannot read: {reason}")], source=str(path)) from exc
    return load_manifests(data, source=str(path))
