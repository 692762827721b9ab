"""The ``Secret`` kind: values a workload needs that must never travel in a manifest.

Applied to the hub like every kind; the hub keeps the values encrypted (AEAD with a key of its
own), sends them only to devices that run a workload mounting them, encrypted to the device's
identity key, and shows only names, keys and a version (docs/security.md, "Secrets")::

    apiVersion: edgefleet.io/v1
    kind: Secret
    metadata: {name: sensor-tls}
    spec:
      data: {tls.key: <base64>}          # bytes, base64 (as Kubernetes' Secret.data)
      stringData: {endpoint: "https://..."}   # text, taken as UTF-8
      requireTpm: true                   # only to TPM-attested devices (default false)

A deployment mounts it with ``spec.secrets: [{name: sensor-tls, mountPath: /secrets/tls}]``
(:class:`SecretMount`). Values are never echoed in a problem: a bad value is named by its
path only. ``Secret.data`` has ``repr=False`` so that a stray log of the object shows none.

Also here: :func:`embedded_key_problems`, the refusal of a manifest (any kind) that embeds a
private key or a certificate (PEM blocks, also base64-encoded): such things belong in a Secret.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from edgefleet.api.meta import API_VERSION, ObjectMeta
from edgefleet.api.validating import (
    Problems,
    Reader,
    as_bool,
    field_path,
    index_path,
    matching,
)
from edgefleet.errors import Problem

KIND = "Secret"

MAX_SECRET_BYTES = 64 * 1024
"""The most one Secret's values may take together (decoded): certificates, keys, tokens."""
MAX_SECRET_KEYS = 64
MAX_MOUNTS = 16
"""The most secrets one deployment mounts."""

# A key is a file name in the worker's secret directory: no "/", not "." or "..", and never
# starting with ".." (edged's own ``..data`` link and version directories live beside them).
_KEY = re.compile(r"(?!\.\.)(?!\.$)[A-Za-z0-9._-]{1,253}")


def secret_key(value: object) -> str:
    if not isinstance(value, str) or not _KEY.fullmatch(value):
        raise ValueError(
            "must be a file name of letters, digits, '.', '_' or '-' (at most 253, not "
            "starting with '..')"
        )
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Secret:
    """A named set of values (file name -> bytes)."""

    KIND: ClassVar[str] = KIND

    metadata: ObjectMeta
    data: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    # Sent only to TPM-attested devices (an attestation key bound to the TPM's endorsement
    # key, last evidence trusted); a device without such a key refuses to open it.
    require_tpm: bool = False

    @property
    def kind(self) -> str:
        return self.KIND

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(sorted(self.data))

    def to_dict(self) -> dict[str, Any]:
        """The canonical document, values included (base64): for the hub to seal, never to
        store or show; :meth:`redacted` is what may be shown."""
        return {
            "apiVersion": API_VERSION,
            "kind": self.KIND,
            "metadata": self.metadata.to_dict(),
            "spec": {
                "data": {k: base64.b64encode(v).decode() for k, v in sorted(self.data.items())},
                "requireTpm": self.require_tpm,
            },
        }

    def _policy(self) -> dict[str, Any]:
        # only when set: the stored documents of Secrets applied before the field existed stay
        # as they were (an apply of the same values is still "unchanged")
        return {"requireTpm": True} if self.require_tpm else {}

    def redacted(self) -> dict[str, Any]:
        """The document without its values: names of the keys only (what the hub stores in
        the clear and shows)."""
        return {
            "apiVersion": API_VERSION,
            "kind": self.KIND,
            "metadata": self.metadata.to_dict(),
            "spec": {"keys": list(self.keys), **self._policy()},
        }


def _base64(value: object) -> bytes:
    if not isinstance(value, str):
        raise ValueError("must be a base64 string")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise ValueError("must be base64 (the value is not shown)") from None


def _text(value: object) -> bytes:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value.encode("utf-8")


def _read_values(r: Reader, name: str, convert: Any, out: dict[str, bytes]) -> None:
    raw = r.raw(name)
    if raw is None:
        return
    at = r.at(name)
    if not isinstance(raw, Mapping):
        r.problems.add(at, "must be a mapping of key to value")
        return
    for k, v in raw.items():
        path = field_path(at, k)
        try:
            key = secret_key(k)
        except ValueError as exc:
            r.problems.add(path, f"invalid key: {exc}")
            continue
        try:
            value = convert(v)
        except ValueError as exc:
            r.problems.add(path, str(exc))
            continue
        if key in out:
            r.problems.add(path, "is also in spec.data (a key may be in one of the two)")
            continue
        out[key] = value


def read_secret(metadata: ObjectMeta, r: Reader | None) -> Secret:
    """The kind's reader for :func:`edgefleet.api.manifests.read_manifest`."""
    data: dict[str, bytes] = {}
    require_tpm = False
    if r is not None:
        require_tpm = r.optional("requireTpm", as_bool, False)
        _read_values(r, "data", _base64, data)
        _read_values(r, "stringData", _text, data)
        if r.has("keys"):
            r.problems.add(
                r.at("keys"),
                "is shown by the hub, not applied: give the values in spec.data or spec.stringData",
            )
        path = r.path
        if not data and r.raw("data") is None and r.raw("stringData") is None:
            r.problems.add(path, "a Secret needs at least one value in data or stringData")
        if len(data) > MAX_SECRET_KEYS:
            r.problems.add(path, f"at most {MAX_SECRET_KEYS} keys, got {len(data)}")
        size = sum(len(v) for v in data.values())
        if size > MAX_SECRET_BYTES:
            r.problems.add(
                path,
                f"its values take {size} bytes, more than {MAX_SECRET_BYTES}, the most allowed",
            )
    return Secret(metadata=metadata, data=dict(sorted(data.items())), require_tpm=require_tpm)


def requires_tpm(manifest: Mapping[str, Any]) -> bool:
    """Whether a Secret's stored (redacted) document says ``spec.requireTpm: true``."""
    spec = manifest.get("spec")
    return isinstance(spec, Mapping) and spec.get("requireTpm") is True


# -- mounting: a deployment's spec.secrets -------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretMount:
    """``spec.secrets[i]`` of a ModelDeployment: the Secret ``name`` given to its workers.

    Workers have no mount namespace of their own, so nothing appears at ``mountPath``: edged
    writes the values to a tmpfs directory of the workload's own (``<secrets dir>/<workload>/
    <name>/<key>``), only that workload's workers may read it (Landlock), and the worker is
    told which directory serves ``mountPath`` (its launch spec and ``EDGEFLEET_SECRET_DIRS``,
    a JSON object of mountPath -> directory). ``mountPath`` is the name the workload knows the
    secret by; it must be absolute and distinct within the deployment."""

    name: str
    mount_path: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mountPath": self.mount_path}


_mount_path = matching(r"/[A-Za-z0-9._/-]{0,255}", "an absolute path (letters, digits, . _ - /)")
_secret_name = matching(
    r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", "a Secret's name (a DNS label)", max_length=63
)


def _clean_mount_path(value: object) -> str:
    path = _mount_path(value)
    parts = path.split("/")[1:]
    if any(p in ("", ".", "..") for p in parts) and path != "/":
        raise ValueError("must be a normalised absolute path (no //, . or .. parts)")
    if path == "/":
        raise ValueError("must name a directory below /")
    return path


def read_secret_mounts(r: Reader) -> tuple[SecretMount, ...]:
    """``spec.secrets`` of a deployment (absent: none)."""
    mounts: list[SecretMount] = []
    names: dict[str, str] = {}
    paths: dict[str, str] = {}
    items = r.items("secrets")
    if len(items) > MAX_MOUNTS:
        r.problems.add(r.at("secrets"), f"at most {MAX_MOUNTS} secrets, got {len(items)}")
    for path, item in items[:MAX_MOUNTS]:
        m = r.problems.reader(item, path)
        if m is None:
            continue
        name = m.required("name", _secret_name, "")
        mount_path = m.required("mountPath", _clean_mount_path, "")
        if name and name in names:
            r.problems.add(field_path(path, "name"), f"is already mounted by {names[name]}")
            continue
        if mount_path and mount_path in paths:
            r.problems.add(field_path(path, "mountPath"), f"is already used by {paths[mount_path]}")
            continue
        names[name], paths[mount_path] = path, path
        if name and mount_path:
            mounts.append(SecretMount(name=name, mount_path=mount_path))
    return tuple(mounts)


# -- what no manifest may embed ----------------------------------------------------------------

_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----")
# "-----BEGIN" base64-encoded, at each of the three alignments it can have in a longer text
_PEM_BASE64 = ("LS0tLS1CRUdJTi", "tLS0tLUJFR0lO", "0tLS0tQkVHSU4")


def _strings(value: object, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            key_path = field_path(path, k)
            if isinstance(k, str):
                yield key_path, k
            yield from _strings(v, key_path)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, index_path(path, i))


def embedded_key_problems(doc: object) -> list[Problem]:
    """Pure: every place in a manifest that embeds a PEM block (a private key, a certificate,
    any ``-----BEGIN ...-----``), plain or base64-encoded, with its field path. A Secret's
    ``spec.data`` and ``spec.stringData`` are where such things belong and are not looked at."""
    skip: tuple[str, ...] = ()
    if isinstance(doc, Mapping) and doc.get("kind") == KIND:
        skip = ("spec.data", "spec.stringData")
    problems: list[Problem] = []
    for path, text in _strings(doc, ""):
        if any(path == s or path.startswith((s + ".", s + "[")) for s in skip):
            continue
        found = _PEM.search(text)
        if found is not None:
            what = found.group(1).lower()
            problems.append(
                Problem(
                    path,
                    f"embeds a PEM block ({what}): private keys and certificates are never "
                    "put in manifests; keep them in a Secret and mount it (spec.secrets)",
                )
            )
        elif any(marker in text for marker in _PEM_BASE64):
            problems.append(
                Problem(
                    path,
                    "embeds a base64-encoded PEM block (a key or a certificate): keep it in a "
                    "Secret and mount it (spec.secrets)",
                )
            )
    return problems


def check_embedded_keys(problems: Problems, doc: object) -> None:
    for p in embedded_key_problems(doc):
        problems.add(p.path, p.message)
