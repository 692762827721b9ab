"""Patches of a JSON document, as ``kubectl patch --type`` takes them. Pure.

* ``merge``: a JSON merge patch (RFC 7386): objects merge key by key, ``null`` removes a key,
  anything else (a list too) replaces.
* ``json``: a JSON patch (RFC 6902): a list of operations ``add``, ``remove``, ``replace``,
  ``move``, ``copy``, ``test`` at JSON pointers (RFC 6901: ``/spec/secrets/0/name``, ``~1``
  for ``/`` and ``~0`` for ``~``; ``-`` appends to a list).
* ``strategic``: a merge patch where a list of named items (every item an object with a
  ``name``, as ``spec.secrets``) merges by name: an item of the patch merges into the item of
  that name, or is added at the end; ``{"name": N, "$patch": "delete"}`` removes it. Every other
  list is replaced. Other ``$`` directives of Kubernetes' strategic merge patch
  (``$retainKeys``, ``$setElementOrder``, ``$deleteFromPrimitiveList``, ...) are refused as not
  supported yet.

Errors are :class:`PatchError`, saying where and why; the document given is never changed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

TYPES = ("strategic", "merge", "json")
MAX_OPERATIONS = 1000


class PatchError(ValueError):
    """A patch that cannot be applied: the message says where and why."""


def apply_patch(doc: Mapping[str, Any], patch: Any, kind: str) -> dict[str, Any]:
    """``doc`` patched by ``patch`` (already decoded from JSON or YAML) of ``kind``."""
    if kind == "json":
        result = json_patch(doc, patch)
    elif kind == "merge":
        result = merge_patch(doc, _object(patch, kind))
    elif kind == "strategic":
        result = strategic_patch(doc, _object(patch, kind))
    else:
        raise PatchError(f"unknown patch type {kind!r} (one of {', '.join(TYPES)})")
    if not isinstance(result, dict):
        raise PatchError(f"the patched document must be an object, got {type(result).__name__}")
    return result


def _object(patch: Any, kind: str) -> Mapping[str, Any]:
    if not isinstance(patch, Mapping):
        raise PatchError(f"a {kind} patch must be an object, got {_what(patch)}")
    return patch


def _what(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null"}.get(
        type(value), type(value).__name__
    )


# -- merge (RFC 7386) -----------------------------------------------------------------------------
def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386's MergePatch(target, patch)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# -- strategic --------------------------------------------------------------------------------
def _named_items(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(i, Mapping) and isinstance(i.get("name"), str) for i in value)
    )


def strategic_patch(target: Any, patch: Any, path: str = "") -> Any:
    """A merge patch where lists of named items merge by name (module doc)."""
    if isinstance(patch, list):
        if _named_items(patch) and (target is None or _named_items(target) or target == []):
            return _merge_named(target or [], patch, path)
        for i, item in enumerate(patch):
            _refuse_directives(item, f"{path}[{i}]")
        return copy.deepcopy(patch)
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    _refuse_directives(patch, path, allow_delete=False)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = strategic_patch(out.get(key), value, f"{path}.{key}" if path else key)
    return out


def _refuse_directives(value: Any, path: str, *, allow_delete: bool = False) -> None:
    if not isinstance(value, Mapping):
        return
    for key in value:
        if isinstance(key, str) and key.startswith("$"):
            if allow_delete and key == "$patch" and value[key] == "delete":
                continue
            where = f"{path}.{key}" if path else key
            raise PatchError(
                f"{where}: not supported yet in a strategic merge patch (only "
                '{"name": ..., "$patch": "delete"} in a list of named items; --type json or '
                "merge for the rest)"
            )


def _merge_named(target: list[Any], patch: list[Any], path: str) -> list[Any]:
    out = [dict(i) for i in target]
    for i, item in enumerate(patch):
        where = f"{path}[{i}]"
        _refuse_directives(item, where, allow_delete=True)
        name = item["name"]
        at = next((n for n, old in enumerate(out) if old.get("name") == name), None)
        if item.get("$patch") == "delete":
            if len(item) != 2:
                raise PatchError(f'{where}: "$patch": "delete" takes the name only')
            if at is not None:
                out.pop(at)
            continue
        if at is None:
            out.append(strategic_patch({}, item, where))
        else:
            out[at] = strategic_patch(out[at], item, where)
    return out


# -- JSON patch (RFC 6902) --------------------------------------------------------------------
def _pointer(text: Any, where: str) -> list[str]:
    if not isinstance(text, str) or (text and not text.startswith("/")):
        raise PatchError(f"{where}: must be a JSON pointer starting with '/', got {text!r}")
    if text == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in text[1:].split("/")]


def _index(container: list[Any], token: str, where: str, *, insert: bool) -> int:
    if insert and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"{where}: {token!r} is not an index of a list")
    index = int(token)
    if index > len(container) or (index == len(container) and not insert):
        raise PatchError(f"{where}: index {index} is out of range (the list has {len(container)})")
    return index


def _parent(doc: Any, tokens: list[str], where: str) -> Any:
    node = doc
    for n, token in enumerate(tokens[:-1]):
        at = "/" + "/".join(tokens[: n + 1])
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"{where}: {at} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, where, insert=False)]
        else:
            raise PatchError(f"{where}: {at} is inside {_what(node)}, not an object or list")
    return node


def _get(doc: Any, tokens: list[str], where: str) -> Any:
    if not tokens:
        return doc
    parent, last = _parent(doc, tokens, where), tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"{where}: /{'/'.join(tokens)} does not exist")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, where, insert=False)]
    raise PatchError(f"{where}: /{'/'.join(tokens)} is inside {_what(parent)}")


def _add(doc: Any, tokens: list[str], value: Any, where: str) -> Any:
    if not tokens:
        return value
    parent, last = _parent(doc, tokens, where), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, where, insert=True), value)
    else:
        raise PatchError(f"{where}: /{'/'.join(tokens)} is inside {_what(parent)}")
    return doc


def _remove(doc: Any, tokens: list[str], where: str) -> Any:
    if not tokens:
        raise PatchError(f"{where}: cannot remove the whole document")
    parent, last = _parent(doc, tokens, where), tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"{where}: /{'/'.join(tokens)} does not exist")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, where, insert=False))
    raise PatchError(f"{where}: /{'/'.join(tokens)} is inside {_what(parent)}")


def json_patch(doc: Mapping[str, Any], operations: Any) -> Any:
    """RFC 6902: ``operations`` applied in order to a copy of ``doc``; any failing operation
    (a ``test`` too) fails the whole patch."""
    if not isinstance(operations, list):
        raise PatchError(f"a json patch must be a list of operations, got {_what(operations)}")
    if len(operations) > MAX_OPERATIONS:
        raise PatchError(f"at most {MAX_OPERATIONS} operations, got {len(operations)}")
    out: Any = copy.deepcopy(dict(doc))
    for i, op in enumerate(operations):
        where = f"[{i}]"
        if not isinstance(op, Mapping):
            raise PatchError(f"{where}: an operation must be an object, got {_what(op)}")
        name = op.get("op")
        path = _pointer(op.get("path"), f"{where}.path")
        if name in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"{where}: {name} needs a value")
        if name == "add":
            out = _add(out, path, copy.deepcopy(op["value"]), where)
        elif name == "remove":
            _remove(out, path, where)
        elif name == "replace":
            _get(out, path, where)  # must exist
            if path:
                _remove(out, path, where)
            out = _add(out, path, copy.deepcopy(op["value"]), where)
        elif name in ("move", "copy"):
            source = _pointer(op.get("from"), f"{where}.from")
            if name == "move" and path[: len(source)] == source and path != source:
                raise PatchError(f"{where}: cannot move {op.get('from')} into itself")
            value = copy.deepcopy(_get(out, source, where))
            if name == "move":
                _remove(out, source, where)
            out = _add(out, path, value, where)
        elif name == "test":
            if _get(out, path, where) != op["value"]:
                raise PatchError(f"{where}: test failed: {op.get('path')} is not {op['value']!r}")
        else:
            raise PatchError(
                f"{where}.op: must be add, remove, replace, move, copy or test, got {name!r}"
            )
    return out
