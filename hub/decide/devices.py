"""The hub's records of devices, as pure data: what a device is, what it reported, what it is owed.

Frozen dataclasses with ``to_json``/``from_json`` (the Store holds them as JSON bytes under
``/devices/NAME``). Decisions about devices live in :mod:`hub.decide.placement` (pure functions of
these
records); :mod:`hub.state.writer` writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from edgefleet.api import TaintEffect


class DevicePhase(StrEnum):
    PENDING = "Pending"  # enrolled, never connected
    READY = "Ready"  # heartbeats arrive
    NOT_READY = "NotReady"  # heartbeats missed for longer than the grace period


class TrustState(StrEnum):
    UNKNOWN = "Unknown"  # not attested yet
    TRUSTED = "Trusted"  # the last evidence verified against the reference policy
    UNTRUSTED = "Untrusted"  # evidence failed, or the device stopped answering challenges


@dataclass(frozen=True, slots=True)
class Taint:
    """As in Kubernetes: NoSchedule keeps new workloads off, NoExecute removes existing ones."""

    key: str
    effect: TaintEffect
    value: str = ""
    reason: str = ""

    def to_json(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect.value}
        if self.value:
            out["value"] = self.value
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True, slots=True)
class Health:
    """What the device reports from its own ``DeviceHealthPolicy``."""

    schedulable: bool = True
    reasons: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"schedulable": self.schedulable, "reasons": list(self.reasons)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Health:
        return cls(bool(doc.get("schedulable", True)), tuple(doc.get("reasons", ())))


@dataclass(frozen=True, slots=True)
class Attestation:
    state: TrustState = TrustState.UNKNOWN
    reasons: tuple[str, ...] = ()
    verified_at: float | None = None  # wall-clock seconds of the last verdict
    challenged_at: float | None = None  # wall-clock seconds of the outstanding challenge

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "reasons": list(self.reasons),
            "verifiedAt": self.verified_at,
            "challengedAt": self.challenged_at,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Attestation:
        return cls(
            TrustState(doc.get("state", TrustState.UNKNOWN.value)),
            tuple(doc.get("reasons", ())),
            doc.get("verifiedAt"),
            doc.get("challengedAt"),
        )


class RevisionPhase(StrEnum):
    """A revision's phase as devices report it (edged's ``RevisionPhase``)."""

    PENDING = "Pending"
    DOWNLOADING = "Downloading"
    VERIFYING = "Verifying"
    REFUSED = "Refused"
    LOADING = "Loading"
    READY = "Ready"
    FAILED = "Failed"
    DRAINING = "Draining"

    @classmethod
    def parse(cls, value: str) -> RevisionPhase:
        """A phase this hub does not know (a newer device) counts as Pending: never serving."""
        try:
            return cls(value)
        except ValueError:
            return cls.PENDING


@dataclass(frozen=True, slots=True)
class RevisionReport:
    """One revision of a workload on a device: what it is and how far it got."""

    model_version: str
    sha256: str = ""
    phase: RevisionPhase = RevisionPhase.PENDING
    ready_replicas: int = 0
    revision: str = ""
    reason: str = ""
    message: str = ""
    wanted: bool = False
    # the inference path (counters since the revision started serving on the device)
    requests: int = 0
    errors: int = 0
    latency_p95_s: float | None = None  # over the device's latency window; None: not measured
    window_requests: int = 0  # requests in that window
    # the validation set (None: not evaluated; validation_reason: why there is no accuracy)
    accuracy: float | None = None
    validation_samples: int = 0
    validation_reason: str = ""
    validation_message: str = ""
    bytes_done: int = 0  # while Downloading: how far the device got, of bytes_total
    bytes_total: int = 0

    @property
    def serves(self) -> bool:
        return self.phase is RevisionPhase.READY and self.ready_replicas > 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "modelVersion": self.model_version,
            "sha256": self.sha256,
            "phase": self.phase.value,
            "readyReplicas": self.ready_replicas,
            "revision": self.revision,
            "reason": self.reason,
            "message": self.message,
            "wanted": self.wanted,
        }
        if self.requests or self.latency_p95_s is not None:
            out["metrics"] = {
                "requests": self.requests,
                "errors": self.errors,
                "latencyP95Seconds": self.latency_p95_s,
                "windowRequests": self.window_requests,
            }
        if self.accuracy is not None or self.validation_reason:
            out["validation"] = {
                "accuracy": self.accuracy,
                "samples": self.validation_samples,
                "reason": self.validation_reason,
                "message": self.validation_message,
            }
        if self.bytes_total:
            out["download"] = {"bytesDone": self.bytes_done, "bytesTotal": self.bytes_total}
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RevisionReport:
        return cls(
            str(doc.get("modelVersion", "")),
            str(doc.get("sha256", "")),
            RevisionPhase.parse(str(doc.get("phase", ""))),
            int(doc.get("readyReplicas", 0)),
            str(doc.get("revision", "")),
            str(doc.get("reason", "")),
            str(doc.get("message", "")),
            bool(doc.get("wanted", False)),
            **_measures(doc),
            bytes_done=int(doc.get("download", {}).get("bytesDone", 0)),
            bytes_total=int(doc.get("download", {}).get("bytesTotal", 0)),
        )


def _measures(doc: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    m = doc.get("metrics")
    if isinstance(m, Mapping):
        p95 = m.get("latencyP95Seconds")
        out.update(
            requests=int(m.get("requests", 0)),
            errors=int(m.get("errors", 0)),
            latency_p95_s=None if p95 is None else float(p95),
            window_requests=int(m.get("windowRequests", 0)),
        )
    v = doc.get("validation")
    if isinstance(v, Mapping):
        accuracy = v.get("accuracy")
        out.update(
            accuracy=None if accuracy is None else float(accuracy),
            validation_samples=int(v.get("samples", 0)),
            validation_reason=str(v.get("reason", "")),
            validation_message=str(v.get("message", "")),
        )
    return out


@dataclass(frozen=True, slots=True)
class Termination:
    """How a replica's worker last ended on a device when edged did not stop it on purpose
    (Kubernetes' ``lastState.terminated``): ``OOMKilled``, ``Error``... with the exit code or
    the signal, and when (wall-clock seconds of the device; None: not said). A device's clock
    is its own: a time after the hub received it is held at that receipt, the device's own in
    ``reported_finished_at`` (``hub.decide.status.bound_termination_times``)."""

    replica: str
    reason: str
    message: str = ""
    exit_code: int = 0
    signal: int = 0
    finished_at: float | None = None
    reported_finished_at: float | None = None  # the device's time, when the hub bounded it

    def same_end(self, other: Termination) -> bool:
        """The same end as the device reported it (whatever time the hub gave either)."""
        return self._as_reported() == other._as_reported()

    def _as_reported(self) -> tuple[object, ...]:
        at = self.finished_at if self.reported_finished_at is None else self.reported_finished_at
        return (self.replica, self.reason, self.message, self.exit_code, self.signal, at)

    def to_json(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "reason": self.reason,
            "message": self.message,
            "exitCode": self.exit_code,
            "signal": self.signal,
            "finishedAt": self.finished_at,
            **(
                {"reportedFinishedAt": self.reported_finished_at}
                if self.reported_finished_at is not None
                else {}
            ),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Termination:
        finished = doc.get("finishedAt")
        reported = doc.get("reportedFinishedAt")
        return cls(
            str(doc.get("replica", "")),
            str(doc.get("reason", "")),
            str(doc.get("message", "")),
            int(doc.get("exitCode", 0)),
            int(doc.get("signal", 0)),
            float(finished) if isinstance(finished, int | float) else None,
            float(reported) if isinstance(reported, int | float) else None,
        )


@dataclass(frozen=True, slots=True)
class WorkloadReport:
    """What a device last said about one of its workloads.

    ``model_version`` is what the device was asked to run; ``revisions`` what it holds and how
    far each got (the wanted one first). Only ``revisions`` says what serves.
    """

    model_version: str
    revision: str = ""
    desired_replicas: int = 0
    ready_replicas: int = 0
    phase: str = ""
    conditions: tuple[Mapping[str, str], ...] = ()
    revisions: tuple[RevisionReport, ...] = ()
    # the device's autoscaling and eviction of it (edged's WorkloadSizing); None: not reported
    sizing: Mapping[str, Any] | None = None
    # what confines each replica's worker (Landlock, no_new_privs, seccomp, egress ports)
    sandboxes: tuple[Mapping[str, Any], ...] = ()
    # the newest unasked-for end of one of its replicas' workers, and their restarts summed
    last_termination: Termination | None = None
    restart_count: int = 0
    # its model configuration as the device applied it (kind: ModelConfig): the digest its
    # replicas read ("": none) and why the one sent is not applied ("": it is)
    config_digest: str = ""
    config_error: str = ""

    def wanted(self, version: str) -> RevisionReport | None:
        """The revision of ``version`` the device reports (the one it calls wanted first)."""
        matches = [r for r in self.revisions if r.model_version == version]
        matches.sort(key=lambda r: not r.wanted)
        return matches[0] if matches else None

    @property
    def ready(self) -> bool:
        return self.desired_replicas > 0 and self.ready_replicas >= self.desired_replicas

    def to_json(self) -> dict[str, Any]:
        return {
            "modelVersion": self.model_version,
            "revision": self.revision,
            "desiredReplicas": self.desired_replicas,
            "readyReplicas": self.ready_replicas,
            "phase": self.phase,
            "conditions": [dict(c) for c in self.conditions],
            "revisions": [r.to_json() for r in self.revisions],
            **({"sizing": dict(self.sizing)} if self.sizing is not None else {}),
            **({"sandboxes": [dict(x) for x in self.sandboxes]} if self.sandboxes else {}),
            **({"restartCount": self.restart_count} if self.restart_count else {}),
            **(
                {"lastTermination": self.last_termination.to_json()}
                if self.last_termination is not None
                else {}
            ),
            **({"configDigest": self.config_digest} if self.config_digest else {}),
            **({"configError": self.config_error} if self.config_error else {}),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> WorkloadReport:
        return cls(
            str(doc.get("modelVersion", "")),
            str(doc.get("revision", "")),
            int(doc.get("desiredReplicas", 0)),
            int(doc.get("readyReplicas", 0)),
            str(doc.get("phase", "")),
            tuple(dict(c) for c in doc.get("conditions", ())),
            tuple(RevisionReport.from_json(r) for r in doc.get("revisions", ())),
            dict(doc["sizing"]) if isinstance(doc.get("sizing"), Mapping) else None,
            tuple(dict(x) for x in doc.get("sandboxes", ())),
            (
                Termination.from_json(doc["lastTermination"])
                if isinstance(doc.get("lastTermination"), Mapping)
                else None
            ),
            int(doc.get("restartCount", 0)),
            str(doc.get("configDigest", "")),
            str(doc.get("configError", "")),
        )


@dataclass(frozen=True, slots=True)
class AgentReport:
    """edged's own release and where its self-update stands, as the device last reported it
    (the status message's ``agent``, issue 32): every field is the device's word, for itself
    only (hub.decide.agentupgrade bounds what it may claim)."""

    version: str = ""
    committed_version: str = ""
    phase: str = ""  # Idle, Downloading, ... Trying, Committed, RolledBack, Failed
    desired_version: str = ""
    reason: str = ""
    message: str = ""
    tries: int = 0
    slot: str = ""
    arch: str = ""
    python_abi: str = ""
    launcher: bool = False
    upgrade: str = ""
    upgrade_revision: int = 0
    changed_at: float | None = None
    bytes_done: int = 0
    bytes_total: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "committedVersion": self.committed_version,
            "phase": self.phase,
            "desiredVersion": self.desired_version,
            "reason": self.reason,
            "message": self.message,
            "tries": self.tries,
            "slot": self.slot,
            "arch": self.arch,
            "pythonAbi": self.python_abi,
            "launcher": self.launcher,
            "upgrade": self.upgrade,
            "upgradeRevision": self.upgrade_revision,
            "changedAt": self.changed_at,
            "bytesDone": self.bytes_done,
            "bytesTotal": self.bytes_total,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AgentReport:
        changed = doc.get("changedAt")
        return cls(
            str(doc.get("version", "")),
            str(doc.get("committedVersion", "")),
            str(doc.get("phase", "")),
            str(doc.get("desiredVersion", "")),
            str(doc.get("reason", "")),
            str(doc.get("message", "")),
            int(doc.get("tries", 0)),
            str(doc.get("slot", "")),
            str(doc.get("arch", "")),
            str(doc.get("pythonAbi", "")),
            bool(doc.get("launcher", False)),
            str(doc.get("upgrade", "")),
            int(doc.get("upgradeRevision", 0)),
            float(changed) if isinstance(changed, int | float) else None,
            int(doc.get("bytesDone", 0)),
            int(doc.get("bytesTotal", 0)),
        )


MAX_LATENCIES = 64  # self-benchmarks a device record keeps (the newest)


def with_latencies(known: Mapping[str, float], reported: Mapping[str, float]) -> dict[str, float]:
    """``known`` updated with ``reported`` (newest last), at most :data:`MAX_LATENCIES`."""
    out = {k: v for k, v in known.items() if k not in reported}
    out.update(reported)
    return dict(list(out.items())[-MAX_LATENCIES:])


@dataclass(frozen=True, slots=True)
class Device:
    """One enrolled device.

    ``labels`` are those set at enrollment and win over ``reported_labels`` (what the device
    says in its Hello and status: what it discovered, ``arch``, ``accelerator``..., and what its
    own config sets) on conflict. ``own_labels`` names the keys of ``labels`` the device asked
    for itself at enrollment (its token allowed it); the others are its bootstrap token's.
    :meth:`trusted_labels` are the labels no device chose: a Secret follows only those
    (:mod:`hub.decide.labeltrust`).
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    reported_labels: Mapping[str, str] = field(default_factory=dict)
    own_labels: frozenset[str] = frozenset()
    cordoned: bool = False
    revoked: bool = False
    phase: DevicePhase = DevicePhase.PENDING
    last_heartbeat: float | None = None  # wall-clock seconds
    health: Health = Health()
    attestation: Attestation = Attestation()
    facts: Mapping[str, Any] = field(default_factory=dict)
    generation_acked: int = 0
    workloads: Mapping[str, WorkloadReport] = field(default_factory=dict)
    # The desired-state generation ``workloads`` were reconciled against (the status
    # message's observed_generation; 0: not said, an edged too old to say or a report made
    # before it accepted anything). A rollout trusts a report's claim that the new revision
    # serves only when this reached the generation that carried the revision
    # (hub.controllers.rollout).
    observed_generation: int = 0
    certificate_serial: str = ""
    """The serial (hex) of the certificate the hub issued this device last: its current one."""
    previous_serial: str = ""
    """The certificate a renewal was asked with, accepted only until the device connects with
    the new one (the hand-over); then cleared, and that certificate is refused."""
    public_key_pem: str = ""  # the device identity key (from its CSR): verifies attestation
    enrolled_at: float | None = None
    # The device's TPM attestation key, bound to its endorsement key (edgefleet.trust.tpmbinding):
    # once set, only evidence with a quote by it is trusted.
    attestation_key_pem: str = ""
    # An attestation key offered at enrollment, not activated yet: {"akPem", "secretSha256",
    # "ekSha256"}.
    ak_offer: Mapping[str, str] | None = None
    # The sha256 of the endorsement key (SubjectPublicKeyInfo DER of the EK certificate's key)
    # of the TPM that holds the bound attestation key: one TPM backs one device record unless
    # the operator allowed otherwise (hub.api.enrollment). "": no TPM bound.
    ek_sha256: str = ""
    # The device's TPM sealing key (an ECDH key in the TPM, certified by the attestation key
    # when it was bound): the Secrets with spec.requireTpm are sealed to it, not to the
    # identity key, so only that TPM opens them. "": none (no TPM, or enrolled before).
    sealing_key_pem: str = ""
    # The device's last drift check as it reported it (None: never reported one).
    compliance: Mapping[str, Any] | None = None
    # The self-benchmarks the device reported (p95 seconds by model artifact sha256, the
    # newest last, at most MAX_LATENCIES): kept after the model leaves the device, so that the
    # scheduler does not place a deployment with placement.maxLatencyP95 back on a device
    # known to be too slow for it.
    latencies: Mapping[str, float] = field(default_factory=dict)
    # edged's version as its last Hello said ("": never connected, or a record written before
    # the hub kept it), and why the hub refused that version ("": accepted), a sentence that
    # names the window (hub.api.devicesync, edgefleet.agentskew).
    agent_version: str = ""
    agent_refused: str = ""
    # edged's release and self-update as its last status reported them (None: never, an
    # edged too old to say); the AgentUpgrade controller reads it (hub.decide.agentupgrade)
    agent: AgentReport | None = None

    def accepts_serial(self, serial: str) -> bool:
        """Whether a certificate with this serial may speak for the device: its current one,
        or the one it renewed with until the hand-over (records without a serial: any)."""
        return not self.certificate_serial or serial in (
            self.certificate_serial,
            self.previous_serial,
        )

    def all_labels(self) -> dict[str, str]:
        return {**self.reported_labels, **self.labels}

    def trusted_labels(self) -> dict[str, str]:
        """The labels the device did not choose: its bootstrap token's (a record enrolled
        before ``own_labels`` was kept counts every enrollment label as its token's)."""
        return {k: v for k, v in self.labels.items() if k not in self.own_labels}

    def with_(self, **changes: Any) -> Device:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "labels": dict(sorted(self.labels.items())),
            "reportedLabels": dict(sorted(self.reported_labels.items())),
            **({"ownLabels": sorted(self.own_labels)} if self.own_labels else {}),
            "cordoned": self.cordoned,
            "revoked": self.revoked,
            "phase": self.phase.value,
            "lastHeartbeat": self.last_heartbeat,
            "health": self.health.to_json(),
            "attestation": self.attestation.to_json(),
            "facts": dict(self.facts),
            "generationAcked": self.generation_acked,
            "workloads": {k: v.to_json() for k, v in sorted(self.workloads.items())},
            "observedGeneration": self.observed_generation,
            "certificateSerial": self.certificate_serial,
            "previousSerial": self.previous_serial,
            "publicKeyPem": self.public_key_pem,
            "enrolledAt": self.enrolled_at,
            "attestationKeyPem": self.attestation_key_pem,
            "akOffer": dict(self.ak_offer) if self.ak_offer is not None else None,
            **({"ekSha256": self.ek_sha256} if self.ek_sha256 else {}),
            **({"sealingKeyPem": self.sealing_key_pem} if self.sealing_key_pem else {}),
            **({"compliance": dict(self.compliance)} if self.compliance is not None else {}),
            **({"latencies": dict(self.latencies)} if self.latencies else {}),
            **({"agentVersion": self.agent_version} if self.agent_version else {}),
            **({"agentRefused": self.agent_refused} if self.agent_refused else {}),
            **({"agent": self.agent.to_json()} if self.agent is not None else {}),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Device:
        return cls(
            name=str(doc["name"]),
            labels=dict(doc.get("labels", {})),
            reported_labels=dict(doc.get("reportedLabels", {})),
            own_labels=frozenset(str(k) for k in doc.get("ownLabels", ())),
            cordoned=bool(doc.get("cordoned", False)),
            revoked=bool(doc.get("revoked", False)),
            phase=DevicePhase(doc.get("phase", DevicePhase.PENDING.value)),
            last_heartbeat=doc.get("lastHeartbeat"),
            health=Health.from_json(doc.get("health", {})),
            attestation=Attestation.from_json(doc.get("attestation", {})),
            facts=dict(doc.get("facts", {})),
            generation_acked=int(doc.get("generationAcked", 0)),
            workloads={
                str(k): WorkloadReport.from_json(v) for k, v in doc.get("workloads", {}).items()
            },
            observed_generation=int(doc.get("observedGeneration", 0)),
            certificate_serial=str(doc.get("certificateSerial", "")),
            previous_serial=str(doc.get("previousSerial", "")),
            public_key_pem=str(doc.get("publicKeyPem", "")),
            enrolled_at=doc.get("enrolledAt"),
            attestation_key_pem=str(doc.get("attestationKeyPem", "")),
            sealing_key_pem=str(doc.get("sealingKeyPem", "")),
            ek_sha256=str(doc.get("ekSha256", "")),
            compliance=dict(doc["compliance"]) if isinstance(doc.get("compliance"), dict) else None,
            latencies={str(k): float(v) for k, v in doc.get("latencies", {}).items()},
            agent_version=str(doc.get("agentVersion", "")),
            agent_refused=str(doc.get("agentRefused", "")),
            agent=(
                AgentReport.from_json(doc["agent"]) if isinstance(doc.get("agent"), dict) else None
            ),
            ak_offer=(
                {str(k): str(v) for k, v in doc["akOffer"].items()}
                if isinstance(doc.get("akOffer"), dict)
                else None
            ),
        )
