"""The ``ModelConfig`` kind: per-device configuration for a model, with fleet-wide defaults
and overrides by label selector and by device name (docs/model-config.md)::

    apiVersion: edgefleet.io/v1
    kind: ModelConfig
    metadata: {name: detector}
    spec:
      model: detector                  # every deployment of this model gets the config
      data:                            # fleet-wide defaults: any JSON values
        threshold: 0.5
        zones: [[0, 0, 640, 480]]
      files:                           # small text files, by file name
        labels.txt: "person\\ncar\\n"
      overrides:
        - selector: {region: eu}       # devices whose labels match all of these
          data: {threshold: 0.6}
        - selector: {region: eu, site: store-7}
          data: {zones: [[0, 0, 320, 240]]}
        - devices: [cam-1]             # devices by name
          data: {threshold: null}      # null removes a key (back to nothing)

**The merge** (:func:`merge_for_device`, pure), most specific last so that it wins:

1. ``spec.data`` and ``spec.files``, the fleet-wide defaults;
2. the selector overrides the device matches, those with fewer labels first (a selector of
   two labels is more specific than one of one); equally specific ones in the order listed;
3. the device-name overrides that name the device, in the order listed.

Each step merges like a JSON merge patch (RFC 7396): mappings merge key by key, anything else
replaces, ``null`` removes the key. Files are replaced whole (``null`` removes a file).
:class:`MergedConfig` keeps, for every value, the step it came from (``edgectl describe
modelconfig NAME --device DEVICE``).

**Bounds:** depth :data:`MAX_DEPTH`, :data:`MAX_NODES` keys and list items per data section,
:data:`MAX_DATA_BYTES` per data section and for the merged config, :data:`MAX_OVERRIDES`,
:data:`MAX_FILES` files of at most :data:`MAX_FILE_BYTES`, :data:`MAX_DEVICES_PER_OVERRIDE`.

**Credentials:** a key that looks like one (``password``, ``apiKey``, ``auth_token``...:
:func:`credential_word`) is refused with its path; a Secret holds such things. A key that only
looks like one is allowed by naming it in the annotation :data:`ALLOW_KEYS_ANNOTATION`
(comma-separated key names), which is the "force" and stays visible in the object.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from edgefleet.api.meta import ObjectMeta, SpecObject, dns_label, label_key, label_value
from edgefleet.api.quantities import describe
from edgefleet.api.validating import Problems, Reader, field_path, index_path
from edgefleet.errors import Problem

KIND = "ModelConfig"

MAX_DEPTH = 8
"""Nesting of mappings and lists inside one data section (``data`` is depth 1)."""
MAX_NODES = 2000
"""Keys and list items in one data section, all levels together."""
MAX_DATA_BYTES = 64 * 1024
"""One data section, and the merged config (data and files), as compact JSON."""
MAX_STRING = 16 * 1024
MAX_KEY = 128
MAX_OVERRIDES = 64
MAX_DEVICES_PER_OVERRIDE = 256
MAX_SELECTOR_LABELS = 16
MAX_FILES = 16
MAX_FILE_BYTES = 32 * 1024

ALLOW_KEYS_ANNOTATION = "edgefleet.io/allow-credential-like-keys"
"""Comma-separated data keys that look like credentials but are not (the apply's force)."""

_FILE_NAME = re.compile(r"(?!\.)[A-Za-z0-9._-]{1,128}")

# Words that make a key a credential: matched against the words of the key (camelCase,
# snake_case, kebab-case and dots split), alone or as adjacent pairs.
_CREDENTIAL_WORDS = frozenset(
    {"password", "passwd", "passphrase", "pwd", "secret", "token", "apikey", "credential",
     "credentials", "privatekey", "bearer", "authorization", "auth", "cookie", "sessionid"}
)  # fmt: skip
_CREDENTIAL_PAIRS = frozenset(
    {("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"),
     ("client", "secret"), ("session", "id"), ("signing", "key")}
)  # fmt: skip


def _words(key: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def credential_word(key: str) -> str | None:
    """The word that makes ``key`` look like a credential (``"token"`` for ``authToken``),
    or ``None``. ``max_tokens``, ``tokenizer`` and ``keypoints`` are not credentials."""
    words = _words(key)
    for w in words:
        if w in _CREDENTIAL_WORDS:
            return w
    for a, b in itertools.pairwise(words):
        if (a, b) in _CREDENTIAL_PAIRS:
            return f"{a} {b}"
    return None


def canonical_json(value: object) -> bytes:
    """Compact, key-sorted JSON: what digests and sizes are computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigOverride:
    """One entry of ``spec.overrides``: by ``selector`` (labels, all must match) or by
    ``devices`` (names), never both."""

    selector: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)
    files: Mapping[str, str | None] = field(default_factory=dict)

    def matches(self, device: str, labels: Mapping[str, str]) -> bool:
        if self.devices:
            return device in self.devices
        return all(labels.get(k) == v for k, v in self.selector.items())

    def describe(self) -> str:
        if self.devices:
            return "device " + ",".join(self.devices)
        return "selector " + ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.devices:
            out["devices"] = list(self.devices)
        else:
            out["selector"] = dict(sorted(self.selector.items()))
        if self.data:
            out["data"] = dict(self.data)
        if self.files:
            out["files"] = dict(sorted(self.files.items()))
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfigSpec:
    model: str
    data: Mapping[str, Any] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    overrides: tuple[ConfigOverride, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model}
        if self.data:
            out["data"] = dict(self.data)
        if self.files:
            out["files"] = dict(sorted(self.files.items()))
        if self.overrides:
            out["overrides"] = [o.to_dict() for o in self.overrides]
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig(SpecObject):
    KIND: ClassVar[str] = KIND

    metadata: ObjectMeta
    spec: ModelConfigSpec


# -- reading ---------------------------------------------------------------------------------


def _check_value(
    problems: Problems, value: object, path: str, depth: int, count: list[int], *, patch: bool
) -> None:
    """Problems of one JSON value at ``path``: types, depth, node count, string sizes."""
    if count[0] > MAX_NODES:
        return
    if value is None:
        if not patch:
            problems.add(path, "null is only meaningful in an override (it removes the key)")
        return
    if isinstance(value, bool | int | str):
        if isinstance(value, str) and len(value) > MAX_STRING:
            problems.add(path, f"must be at most {MAX_STRING} characters, got {len(value)}")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            problems.add(path, f"must be a finite number, got {describe(value)}")
        return
    if isinstance(value, Mapping | list):
        if depth >= MAX_DEPTH:
            problems.add(path, f"is nested too deeply: at most {MAX_DEPTH} levels")
            return
        if isinstance(value, list):
            for i, item in enumerate(value):
                count[0] += 1
                # a null inside a list is a plain value, not a removal
                _check_value(problems, item, index_path(path, i), depth + 1, count, patch=False)
            return
        for k, v in value.items():
            count[0] += 1
            sub = field_path(path, k)
            if not isinstance(k, str) or not k or len(k) > MAX_KEY or not k.isprintable():
                problems.add(
                    sub, f"invalid key: must be printable text of 1 to {MAX_KEY} characters"
                )
                continue
            _check_value(problems, v, sub, depth + 1, count, patch=patch)
        if count[0] > MAX_NODES:
            problems.add(path, f"has more than {MAX_NODES} keys and list items")
        return
    problems.add(path, f"must be a JSON value, got {describe(value)}")


def _json_mapping(value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a mapping of keys to JSON values, got {describe(value)}")
    return value


def _file_mapping(value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a mapping of file name to text, got {describe(value)}")
    return value


def _read_data(r: Reader, name: str, *, patch: bool) -> dict[str, Any]:
    raw = r.optional(name, _json_mapping, None)  # a problem when it is not a mapping
    if raw is None:
        return {}
    path = r.at(name)
    local = Problems()
    _check_value(local, raw, path, 0, [0], patch=patch)
    found = local.collect()
    if found:
        r.problems.extend(found)
        return {}
    data = json.loads(canonical_json(raw))
    size = len(canonical_json(data))
    if size > MAX_DATA_BYTES:
        r.problems.add(path, f"must be at most {MAX_DATA_BYTES} bytes as JSON, got {size}")
        return {}
    return dict(data)


def _read_files(r: Reader, *, patch: bool) -> dict[str, Any]:
    raw = r.optional("files", _file_mapping, None)  # a problem when it is not a mapping
    if raw is None:
        return {}
    path = r.at("files")
    if len(raw) > MAX_FILES:
        r.problems.add(path, f"at most {MAX_FILES} files, got {len(raw)}")
        return {}
    out: dict[str, Any] = {}
    for k, v in raw.items():
        sub = field_path(path, k)
        if not isinstance(k, str) or not _FILE_NAME.fullmatch(k):
            r.problems.add(
                sub, "invalid file name: letters, digits, '.', '_' or '-', not starting with '.'"
            )
        elif v is None and patch:
            out[k] = None
        elif not isinstance(v, str):
            r.problems.add(sub, f"must be text, got {describe(v)}")
        elif len(v.encode()) > MAX_FILE_BYTES:
            r.problems.add(sub, f"must be at most {MAX_FILE_BYTES} bytes, got {len(v.encode())}")
        else:
            out[k] = v
    return dict(sorted(out.items()))


def _read_override(r: Reader) -> ConfigOverride:
    has_selector, has_devices = r.has("selector"), r.has("devices")
    if has_selector == has_devices:
        r.problems.add(r.path, "give exactly one of selector (labels) or devices (names)")
    selector = r.string_map("selector", label_key, label_value) or {}
    if (
        has_selector
        and not selector
        and not any(p.path.startswith(r.at("selector")) for p in r.problems.collect())
    ):
        r.problems.add(
            r.at("selector"), "must name at least one label (the defaults are spec.data)"
        )
    if len(selector) > MAX_SELECTOR_LABELS:
        r.problems.add(r.at("selector"), f"at most {MAX_SELECTOR_LABELS} labels")
    devices = r.list_of("devices", dns_label, unique=True) or []
    if (
        has_devices
        and not devices
        and not any(p.path.startswith(r.at("devices")) for p in r.problems.collect())
    ):
        r.problems.add(r.at("devices"), "must name at least one device")
    if len(devices) > MAX_DEVICES_PER_OVERRIDE:
        r.problems.add(r.at("devices"), f"at most {MAX_DEVICES_PER_OVERRIDE} devices")
    data = _read_data(r, "data", patch=True)
    files = _read_files(r, patch=True)
    if not data and not files and not r.has("data") and not r.has("files"):
        r.problems.add(r.path, "sets nothing: give data or files")
    return ConfigOverride(selector=selector, devices=tuple(devices), data=data, files=files)


def _data_keys(data: object, path: str) -> Iterator[tuple[str, str]]:
    """Every key of nested mappings (lists included) with its path."""
    if isinstance(data, Mapping):
        for k, v in data.items():
            sub = field_path(path, k)
            yield str(k), sub
            yield from _data_keys(v, sub)
    elif isinstance(data, list):
        for i, item in enumerate(data):
            yield from _data_keys(item, index_path(path, i))


def credential_key_problems(config: ModelConfig) -> list[Problem]:
    """Pure: every data key or file name that looks like a credential, with its path, unless
    :data:`ALLOW_KEYS_ANNOTATION` names it."""
    allowed = {
        k.strip()
        for k in config.metadata.annotations.get(ALLOW_KEYS_ANNOTATION, "").split(",")
        if k.strip()
    }
    sections: list[tuple[str, Mapping[str, Any], Mapping[str, Any]]] = [
        ("spec", config.spec.data, config.spec.files)
    ]
    sections += [
        (f"spec.overrides[{i}]", o.data, o.files) for i, o in enumerate(config.spec.overrides)
    ]
    found = []
    for prefix, data, files in sections:
        keys = list(_data_keys(data, f"{prefix}.data"))
        keys += [(name, field_path(f"{prefix}.files", name)) for name in files]
        for key, path in keys:
            word = credential_word(key)
            if word is not None and key not in allowed:
                found.append(
                    Problem(
                        path,
                        f"key {key!r} looks like a credential ({word!r}): a config is sent "
                        "in the clear to every device and shown to every reader; keep "
                        "credentials in a Secret (spec.secrets of the deployment). If it is "
                        f'not one, name it in the annotation "{ALLOW_KEYS_ANNOTATION}"',
                    )
                )
    return found


def read_model_config(metadata: ObjectMeta, r: Reader | None) -> ModelConfig:
    """The kind's reader for :func:`edgefleet.api.manifests.read_manifest`."""
    if r is None:
        return ModelConfig(metadata=metadata, spec=ModelConfigSpec(model=""))
    model = r.required("model", dns_label, "")
    data = _read_data(r, "data", patch=False)
    files = _read_files(r, patch=False)
    overrides = []
    items = r.items("overrides")
    if len(items) > MAX_OVERRIDES:
        r.problems.add(r.at("overrides"), f"at most {MAX_OVERRIDES} overrides, got {len(items)}")
        items = []
    for path, item in items:
        sub = r.problems.reader(item, path)
        if sub is not None:
            overrides.append(_read_override(sub))
    config = ModelConfig(
        metadata=metadata,
        spec=ModelConfigSpec(model=model, data=data, files=files, overrides=tuple(overrides)),
    )
    for p in credential_key_problems(config):
        r.problems.add(p.path, p.message)
    return config


# -- merging ---------------------------------------------------------------------------------

DEFAULTS = "spec (defaults)"


@dataclass(frozen=True, slots=True)
class MergedConfig:
    """A device's config: the data, the files, and where each value came from (``sources``:
    a leaf's path, ``data.zones`` or ``files["labels.txt"]``, to the step that set it)."""

    data: Mapping[str, Any]
    files: Mapping[str, str]
    sources: Mapping[str, str]
    steps: tuple[str, ...]  # the steps applied, in order

    def document(self) -> dict[str, Any]:
        """What a worker reads (``config.json``): ``{"data": ..., "files": ...}``."""
        return {"data": dict(self.data), "files": dict(self.files)}

    def digest(self) -> str:
        return config_digest(self.document())


def config_digest(document: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical JSON of a merged config's document."""
    return "sha256:" + hashlib.sha256(canonical_json(document)).hexdigest()


def _merge(
    base: dict[str, Any], patch: Mapping[str, Any], path: str, step: str, sources: dict[str, str]
) -> None:
    """RFC 7396 on ``base`` in place, ``sources`` kept: a leaf's path to the step that set it."""
    for k, v in patch.items():
        sub = field_path(path, k)
        if isinstance(v, Mapping) and isinstance(base.get(k), dict):
            _merge(base[k], v, sub, step, sources)
            continue
        # what was under this key is replaced (or removed): it loses its sources
        for old in [s for s in sources if s == sub or s.startswith((sub + ".", sub + "["))]:
            del sources[old]
        if v is None:
            base.pop(k, None)
        elif isinstance(v, Mapping):
            base[k] = {}
            _merge(base[k], v, sub, step, sources)  # nulls inside a new mapping are dropped
            if not base[k]:
                sources[sub] = step
        else:
            base[k] = json.loads(json.dumps(v))  # a copy
            sources[sub] = step


def ordered_overrides(
    config: ModelConfig, device: str, labels: Mapping[str, str]
) -> list[tuple[str, ConfigOverride]]:
    """The overrides that apply to a device, in merge order (module doc), each with its
    step's name (``spec.overrides[1] (selector region=eu)``)."""
    named = [
        (f"spec.overrides[{i}] ({o.describe()})", i, o)
        for i, o in enumerate(config.spec.overrides)
        if o.matches(device, labels)
    ]
    by_selector = sorted(
        (t for t in named if not t[2].devices), key=lambda t: (len(t[2].selector), t[1])
    )
    by_device = [t for t in named if t[2].devices]
    return [(step, o) for step, _, o in (*by_selector, *by_device)]


def merge_steps(config: ModelConfig, steps: list[tuple[str, ConfigOverride]]) -> MergedConfig:
    """The defaults, then ``steps`` in order (pure)."""
    data: dict[str, Any] = {}
    files: dict[str, str] = {}
    sources: dict[str, str] = {}
    _merge(data, config.spec.data, "data", DEFAULTS, sources)
    _merge(files, config.spec.files, "files", DEFAULTS, sources)
    for step, override in steps:
        _merge(data, override.data, "data", step, sources)
        _merge(files, override.files, "files", step, sources)
    return MergedConfig(
        data=data,
        files=dict(sorted(files.items())),
        sources=dict(sorted(sources.items())),
        steps=(DEFAULTS, *(s for s, _ in steps)),
    )


def merge_for_device(config: ModelConfig, device: str, labels: Mapping[str, str]) -> MergedConfig:
    """The device's merged config (pure; the order in the module doc)."""
    return merge_steps(config, ordered_overrides(config, device, labels))


MAX_MERGED_BYTES = 256 * 1024
"""A device's merged config (data and files) as compact JSON: checked at apply for the
defaults, each override over them and every known device's merge."""


def merged_size_problem(merged: MergedConfig) -> str | None:
    size = len(canonical_json(merged.document()))
    if size > MAX_MERGED_BYTES:
        return f"is {size} bytes as JSON once merged, more than {MAX_MERGED_BYTES}"
    return None
