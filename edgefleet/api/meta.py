"""What every kind shares: ``apiVersion``, ``metadata`` (name, labels, annotations) and the
syntax of names, label keys and label values (as Kubernetes has them)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from edgefleet.api.quantities import describe
from edgefleet.api.validating import Reader, as_str, matching

API_VERSION = "edgefleet.io/v1"


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectMeta:
    """``metadata``: the object's name and labels. Treat the mappings as read-only."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.labels:
            out["labels"] = dict(sorted(self.labels.items()))
        if self.annotations:
            out["annotations"] = dict(sorted(self.annotations.items()))
        return out


_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*"
_LABEL_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"

dns_label = matching(
    _DNS_LABEL,
    'a DNS label: lowercase letters, digits and "-", starting and ending with a letter or digit',
    max_length=63,
)


def label_key(value: object) -> str:
    """A Kubernetes label key: ``name`` or ``prefix/name`` (prefix a DNS subdomain)."""
    if not isinstance(value, str):
        raise ValueError(f"must be a label key (a string), got {describe(value)}")
    prefix, slash, name = value.rpartition("/")
    if slash and (len(prefix) > 253 or not re.fullmatch(_DNS_SUBDOMAIN, prefix)):
        raise ValueError(f"must have a DNS subdomain as its prefix, got {describe(value)}")
    if len(name) > 63 or not re.fullmatch(_LABEL_NAME, name):
        raise ValueError(
            "must be a label key: at most 63 letters, digits, '-', '_' or '.', starting and ending "
            f"with a letter or digit, optionally after a prefix and '/', got {describe(value)}"
        )
    return value


def label_value(value: object) -> str:
    """A Kubernetes label value: empty, or up to 63 letters, digits, ``-_.``."""
    if not isinstance(value, str):
        hint = " (write it in quotes)" if isinstance(value, int | float) else ""
        raise ValueError(f"must be a string{hint}, got {describe(value)}")
    if len(value) > 63 or (value and not re.fullmatch(_LABEL_NAME, value)):
        raise ValueError(
            "must be a label value: at most 63 letters, digits, '-', '_' or '.', starting and "
            f"ending with a letter or digit, got {describe(value)}"
        )
    return value


SERVER_METADATA = ("uid", "resourceVersion", "creationTimestamp")
"""metadata fields the hub fills in when it shows an object: accepted and ignored when read,
so that what ``edgectl get -o yaml`` prints can be applied again (as Kubernetes does)."""


def read_metadata(r: Reader | None) -> ObjectMeta:
    if r is None:
        return ObjectMeta(name="")
    r.ignore(*SERVER_METADATA)
    return ObjectMeta(
        name=r.required("name", dns_label, ""),
        labels=r.string_map("labels", label_key, label_value) or {},
        annotations=r.string_map("annotations", label_key, as_str) or {},
    )


class SpecObject:
    """What every kind made of ``metadata`` and ``spec`` shares: its kind, apiVersion and name,
    and the canonical camelCase document (:func:`edgefleet.api.parse_manifest` reads it back
    equal). Subclasses are frozen dataclasses that declare ``KIND``, ``metadata`` and ``spec``
    (whose ``to_dict`` gives the spec's document)."""

    __slots__ = ()

    KIND: ClassVar[str]
    metadata: ObjectMeta
    spec: Any

    @property
    def kind(self) -> str:
        return self.KIND

    @property
    def api_version(self) -> str:
        return API_VERSION

    @property
    def name(self) -> str:
        return self.metadata.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": self.KIND,
            "metadata": self.metadata.to_dict(),
            "spec": self.spec.to_dict(),
        }
