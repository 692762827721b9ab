"""The ``SecurityBaseline`` kind: what the fleet requires of a device before it runs workloads.

Parsed and validated like every manifest (every problem with its field path, unknown fields
are problems); ``to_dict()`` is canonical (every default written, digests lowercase and
sorted), so applying the same baseline twice is "unchanged"::

    apiVersion: edgefleet.io/v1
    kind: SecurityBaseline
    metadata: {name: fleet}
    spec:
      requireAttestation: true          # untrusted devices get a NoExecute taint
      allowedCodeDigests: [sha256:...]  # measurements an attesting device may report
      allowedConfigDigests: []
      allowedModelDigests: []

Every baseline applies fleet-wide (:meth:`hub.core.Cache.security_policy`). The digest lists
are for the attestation controller; an empty list allows any digest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from edged.api import API_VERSION, ObjectMeta
from edged.api.manifests import dns_label, label_key, label_value
from edged.api.quantities import describe
from edged.api.validating import Problems, Reader, as_bool, as_str, matching
from edged.errors import ValidationError

KIND = "SecurityBaseline"

_digest_text = matching(r"sha256:[0-9a-fA-F]{64}", '"sha256:" and 64 hexadecimal digits')


def _digest(value: object) -> str:
    return _digest_text(value).lower()


@dataclass(frozen=True, slots=True, kw_only=True)
class SecurityBaselineSpec:
    require_attestation: bool = False
    allowed_code_digests: tuple[str, ...] = ()
    allowed_config_digests: tuple[str, ...] = ()
    allowed_model_digests: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "requireAttestation": self.require_attestation,
            "allowedCodeDigests": sorted(self.allowed_code_digests),
            "allowedConfigDigests": sorted(self.allowed_config_digests),
            "allowedModelDigests": sorted(self.allowed_model_digests),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SecurityBaseline:
    KIND: ClassVar[str] = KIND

    metadata: ObjectMeta
    spec: SecurityBaselineSpec = field(default_factory=SecurityBaselineSpec)

    @property
    def kind(self) -> str:
        return self.KIND

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


def _read_metadata(r: Reader | None) -> ObjectMeta:
    if r is None:
        return ObjectMeta(name="")
    return ObjectMeta(
        name=r.required("name", dns_label, ""),
        labels=r.string_map("labels", label_key, label_value) or {},
        annotations=r.string_map("annotations", label_key, as_str) or {},
    )


def _read_spec(r: Reader | None) -> SecurityBaselineSpec:
    if r is None:
        return SecurityBaselineSpec()
    return SecurityBaselineSpec(
        require_attestation=r.optional("requireAttestation", as_bool, False),
        allowed_code_digests=tuple(r.list_of("allowedCodeDigests", _digest, unique=True) or ()),
        allowed_config_digests=tuple(r.list_of("allowedConfigDigests", _digest, unique=True) or ()),
        allowed_model_digests=tuple(r.list_of("allowedModelDigests", _digest, unique=True) or ()),
    )


def parse_security_baseline(doc: object, *, source: str = "") -> SecurityBaseline:
    """A typed baseline; :class:`ValidationError` lists every problem with its field path."""
    problems = Problems()
    r = problems.reader(doc)
    if r is None:
        problems.raise_if_any(ValidationError, source=source)
        raise AssertionError("unreachable")
    if r.raw("apiVersion") != API_VERSION:
        problems.add(
            r.at("apiVersion"), f'must be "{API_VERSION}", got {describe(r.raw("apiVersion"))}'
        )
    if r.raw("kind") != KIND:
        problems.add(r.at("kind"), f'must be "{KIND}", got {describe(r.raw("kind"))}')
    r.ignore("status")
    metadata = _read_metadata(r.required_section("metadata"))
    spec = _read_spec(r.section("spec"))
    problems.raise_if_any(ValidationError, source=source)
    return SecurityBaseline(metadata=metadata, spec=spec)


def requires_attestation(manifest: Mapping[str, Any]) -> bool:
    """Whether a stored (canonical) baseline document requires attestation."""
    return bool(manifest.get("spec", {}).get("requireAttestation"))
