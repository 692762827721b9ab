"""The ``SecurityBaseline`` kind: what the fleet requires of a device before it runs workloads.

Parsed and validated like every manifest (every problem with its field path, unknown fields
are problems); ``to_dict()`` is canonical (every default written, digests lowercase and
sorted), so applying the same baseline twice is "unchanged"::

    apiVersion: edgefleet.io/v1
    kind: SecurityBaseline
    metadata: {name: fleet}
    spec:
      requireAttestation: true          # untrusted devices get a NoExecute taint
      requireTpm: true                  # ...and so do devices that are not TPM-attested
      requireMeasurementPcr: true       # ...and TPM-attested ones whose quote lacks edged's
                                        # measurement PCR and its event log (implies requireTpm)
      allowedCodeDigests: [sha256:...]  # measurements an attesting device may report
      allowedConfigDigests: []
      allowedModelDigests: []
      allowedPcrValues:                 # reference values of measured boot (sha256 bank)
        "0": [<64 hex>, ...]            # PCR index 0-7 -> the values allowed
      requireSandbox: true              # devices run no worker without its Landlock sandbox
      network:                          # bounds what deployments' spec.network may ask for
        egress: [{port: 8080}]          # TCP ports; [] = no egress for any worker
        ingress: {socketGroup: apps, socketMode: "0660", tcpPorts: []}   # who uses infer.sock
      drift: {action: alert, period: 30s}   # or restartWorkload, quarantine
                                        # requireOpenWatch: true: no worker starts on a device
                                        # where fanotify cannot watch opens of the store
      publishers:                       # which publisher keys may sign which deployments' models
      - keys: [<64 hex key id>]         # publisher keys (``edgectl keys generate`` prints ids)
        deployments: ["vision-*"]       # deployment name patterns ...
        deploymentLabels: {team: vision}  # ... or deployments carrying all these labels

Every baseline applies fleet-wide (the hub's cache reads them together). The digest lists
are for the attestation controller; an empty list allows any digest. ``requireSandbox`` and
``network`` reach every device with its desired state: a worker whose sandbox cannot be put
in force there (no Landlock), or whose deployment asks for egress beyond ``network.egress``,
does not start and says why (docs/security.md). A PCR with reference
values must be quoted by an EK-bound attestation key with one of them (docs/trust.md);
``requireMeasurementPcr`` makes a TPM-attested device whose quote does not carry edged's
measurement PCR and its event log (``trust.measurementPcr`` off) Untrusted.
Once any baseline lists ``publishers``, a device admits a hub-assigned artifact only when a
rule covering its deployment names a threshold of the keys that signed it (and, with TUF, of
the keys of the delegated role that lists it): docs/trust.md, "Publishers per deployment".
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from edgefleet.api.meta import API_VERSION, ObjectMeta, label_key, label_value
from edgefleet.api.networking import NetworkPolicy, read_network
from edgefleet.api.quantities import format_duration, parse_duration
from edgefleet.api.validating import Reader, as_bool, matching
from edgefleet.errors import Problem, ValidationError

KIND = "SecurityBaseline"

_digest_text = matching(r"sha256:[0-9a-fA-F]{64}", '"sha256:" and 64 hexadecimal digits')


def _digest(value: object) -> str:
    return _digest_text(value).lower()


DRIFT_ACTIONS = ("alert", "restartWorkload", "quarantine")
"""``spec.drift.action``, mildest first (several baselines: the most severe applies)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftPolicy:
    """``spec.drift``: what a device does when what it holds differs from what edged made
    (files added to or changed in the artifact store, its config edited by hand, processes
    in its cgroup it did not start): ``alert`` reports, ``restartWorkload`` undoes (moves
    files away, kills strays, fetches and restarts), ``quarantine`` stops every workload and
    starts none until an operator clears it. ``period``: seconds between checks.
    ``requireOpenWatch``: a device where opens of the store cannot be watched by the kernel
    (fanotify: ``CAP_SYS_ADMIN``) starts no worker, and says why."""

    action: str = "alert"
    period_s: float = 30.0
    require_open_watch: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action, "period": format_duration(self.period_s)}
        if self.require_open_watch:
            out["requireOpenWatch"] = True
        return out


def _drift_action(value: object) -> str:
    if value not in DRIFT_ACTIONS:
        raise ValueError(f"must be one of {', '.join(DRIFT_ACTIONS)}, got {value!r}")
    return str(value)


def _drift_period(value: object) -> float:
    seconds = parse_duration(value)
    if not 1 <= seconds <= 3600:
        raise ValueError(f"must be between 1s and 1h, got {value!r}")
    return seconds


def _read_drift(r: Reader | None) -> DriftPolicy | None:
    if r is None:
        return None
    return DriftPolicy(
        action=r.optional("action", _drift_action, "alert"),
        period_s=r.optional("period", _drift_period, 30.0),
        require_open_watch=r.optional("requireOpenWatch", as_bool, False),
    )


MAX_PUBLISHER_RULES = 256
MAX_PUBLISHER_KEYS = 64
MAX_PATTERNS = 64
_PATTERN = re.compile(r"[a-z0-9*?]([a-z0-9.*?-]{0,252})?")
_keyid_text = matching(r"[0-9a-fA-F]{64}", "a key id: 64 hexadecimal digits")


def _keyid(value: object) -> str:
    return _keyid_text(value).lower()


def _name_pattern(value: object) -> str:
    """A deployment-name pattern: a name whose ``*`` matches any run of characters and ``?``
    one (fnmatch without character classes, so nothing in it is read as syntax)."""
    if not isinstance(value, str) or not _PATTERN.fullmatch(value):
        raise ValueError(
            "must be a deployment-name pattern: lowercase letters, digits, '-', '.', with "
            f"'*' and '?' as wildcards, 1-253 characters, got {value!r}"
        )
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class PublisherRule:
    """One entry of ``spec.publishers``: the publisher keys (key ids) that may sign the
    artifacts of the deployments it covers (by name pattern, or by labels: all of them)."""

    keys: tuple[str, ...]
    deployments: tuple[str, ...] = ()
    deployment_labels: Mapping[str, str] = field(default_factory=dict)

    def covers(self, deployment: str, labels: Mapping[str, str]) -> bool:
        """Whether this rule speaks for the deployment ``deployment`` with ``labels``."""
        if any(fnmatch.fnmatchcase(deployment, p) for p in self.deployments):
            return True
        return bool(self.deployment_labels) and all(
            labels.get(k) == v for k, v in self.deployment_labels.items()
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"keys": sorted(self.keys)}
        if self.deployments:
            out["deployments"] = sorted(self.deployments)
        if self.deployment_labels:
            out["deploymentLabels"] = dict(sorted(self.deployment_labels.items()))
        return out


def _read_publishers(r: Reader) -> tuple[PublisherRule, ...] | None:
    items = r.items("publishers")
    if r.raw("publishers") is None:
        return None
    if len(items) > MAX_PUBLISHER_RULES:
        r.problems.add(r.at("publishers"), f"at most {MAX_PUBLISHER_RULES} rules")
        return ()
    rules = []
    for path, item in items:
        rule = r.problems.reader(item, path)
        if rule is None:
            continue
        keys = rule.list_of("keys", _keyid, unique=True) or []
        if not rule.raw("keys"):
            rule.problems.add(rule.at("keys"), "must name at least one publisher key id")
        elif len(keys) > MAX_PUBLISHER_KEYS:
            rule.problems.add(rule.at("keys"), f"at most {MAX_PUBLISHER_KEYS} keys")
        patterns = rule.list_of("deployments", _name_pattern, unique=True) or []
        if len(patterns) > MAX_PATTERNS:
            rule.problems.add(rule.at("deployments"), f"at most {MAX_PATTERNS} patterns")
        labels = rule.string_map("deploymentLabels", label_key, label_value) or {}
        if not patterns and not labels:
            rule.problems.add(
                path,
                "must say which deployments it covers: deployments (name patterns) or "
                "deploymentLabels",
            )
        rules.append(
            PublisherRule(
                keys=tuple(keys),  # the document's order (field paths); to_dict sorts
                deployments=tuple(patterns),
                deployment_labels=labels,
            )
        )
    return tuple(rules)


@dataclass(frozen=True, slots=True, kw_only=True)
class SecurityBaselineSpec:
    require_attestation: bool = False
    # Only TPM-attested devices (an attestation key bound to the EK) are trusted; implies
    # require_attestation.
    require_tpm: bool = False
    # TPM-attested devices must also quote edged's measurement PCR with its event log
    # (trust.measurementPcr); implies require_tpm (and so require_attestation).
    require_measurement_pcr: bool = False
    allowed_code_digests: tuple[str, ...] = ()
    allowed_config_digests: tuple[str, ...] = ()
    allowed_model_digests: tuple[str, ...] = ()
    # PCR index (0-7, measured boot) -> allowed sha256-bank values (lowercase hex)
    allowed_pcr_values: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    require_sandbox: bool = False
    network: NetworkPolicy | None = None
    drift: DriftPolicy | None = None
    # None: the baseline says nothing of publishers; () is "no publisher for any deployment"
    publishers: tuple[PublisherRule, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requireAttestation": self.require_attestation,
            "requireTpm": self.require_tpm,
            "allowedCodeDigests": sorted(self.allowed_code_digests),
            "allowedConfigDigests": sorted(self.allowed_config_digests),
            "allowedModelDigests": sorted(self.allowed_model_digests),
            "allowedPcrValues": {
                str(i): sorted(v) for i, v in sorted(self.allowed_pcr_values.items())
            },
        }
        # written only when set: baselines stored before these fields keep their canonical form
        if self.require_measurement_pcr:
            out["requireMeasurementPcr"] = True
        if self.require_sandbox:
            out["requireSandbox"] = True
        if self.network is not None:
            out["network"] = self.network.to_dict()
        if self.drift is not None:
            out["drift"] = self.drift.to_dict()
        if self.publishers is not None:
            out["publishers"] = [p.to_dict() for p in self.publishers]
        return out


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


def _read_spec(r: Reader | None) -> SecurityBaselineSpec:
    if r is None:
        return SecurityBaselineSpec()
    return SecurityBaselineSpec(
        require_attestation=r.optional("requireAttestation", as_bool, False),
        require_tpm=r.optional("requireTpm", as_bool, False),
        require_measurement_pcr=r.optional("requireMeasurementPcr", as_bool, False),
        allowed_code_digests=tuple(r.list_of("allowedCodeDigests", _digest, unique=True) or ()),
        allowed_config_digests=tuple(r.list_of("allowedConfigDigests", _digest, unique=True) or ()),
        allowed_model_digests=tuple(r.list_of("allowedModelDigests", _digest, unique=True) or ()),
        allowed_pcr_values=_read_pcrs(r),
        require_sandbox=r.optional("requireSandbox", as_bool, False),
        network=read_network(r.section("network"), ingress=True),
        drift=_read_drift(r.section("drift")),
        publishers=_read_publishers(r),
    )


PCR_INDEXES = range(8)  # the measured-boot PCRs an attestation key's quote covers
_pcr_hex = matching(r"[0-9a-fA-F]{64}", "64 hexadecimal digits (a sha256-bank PCR value)")


def _read_pcrs(r: Reader) -> dict[int, tuple[str, ...]]:
    raw = r.raw("allowedPcrValues")
    at = r.at("allowedPcrValues")
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        r.problems.add(at, "must be a mapping of PCR index (0-7) to a list of values")
        return {}
    out: dict[int, tuple[str, ...]] = {}
    for key, values in raw.items():
        path = f"{at}.{key}"
        index = int(key) if isinstance(key, int | str) and str(key).isdigit() else -1
        if isinstance(key, bool) or index not in PCR_INDEXES:
            r.problems.add(path, "a PCR index 0-7 (the measured-boot PCRs a quote covers)")
            continue
        if not isinstance(values, list) or not values:
            r.problems.add(path, "must be a non-empty list of PCR values")
            continue
        good: list[str] = []
        for i, v in enumerate(values):
            try:
                value = _pcr_hex(v).lower()
            except ValueError as exc:
                r.problems.add(f"{path}[{i}]", str(exc))
                continue
            if value in good:
                r.problems.add(f"{path}[{i}]", "duplicates an earlier value")
                continue
            good.append(value)
        out[index] = tuple(sorted(good))
    return dict(sorted(out.items()))


def read_security_baseline(metadata: ObjectMeta, r: Reader | None) -> SecurityBaseline:
    """The kind's reader for :func:`edgefleet.api.manifests.read_manifest`."""
    return SecurityBaseline(metadata=metadata, spec=_read_spec(r))


def requires_attestation(manifest: Mapping[str, Any]) -> bool:
    """Whether a stored (canonical) baseline document requires attestation (requireTpm
    implies it)."""
    spec = manifest.get("spec", {})
    return bool(spec.get("requireAttestation")) or requires_tpm(manifest)


def requires_tpm(manifest: Mapping[str, Any]) -> bool:
    """Whether a stored (canonical) baseline document requires TPM attestation
    (requireMeasurementPcr implies it)."""
    spec = manifest.get("spec", {})
    return bool(spec.get("requireTpm")) or requires_measurement_pcr(manifest)


def requires_measurement_pcr(manifest: Mapping[str, Any]) -> bool:
    """Whether a stored (canonical) baseline document requires edged's measurement PCR."""
    return bool(manifest.get("spec", {}).get("requireMeasurementPcr"))


def parse_security_baseline(doc: object, *, source: str = "") -> SecurityBaseline:
    """A typed baseline (through :func:`edgefleet.api.manifests.parse_manifest`, like every
    kind); :class:`ValidationError` lists every problem with its field path."""
    from edgefleet.api.manifests import parse_manifest

    manifest = parse_manifest(doc, source=source)
    if not isinstance(manifest, SecurityBaseline):
        raise ValidationError(
            [Problem("kind", f'must be "{KIND}", got "{manifest.kind}"')], source=source
        )
    return manifest
