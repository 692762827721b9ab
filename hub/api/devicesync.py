"""DeviceService: the one long-lived Sync stream per device, certificate renewal, artifact fetch.

Sync, from the hub's side:

1. The caller must hold a device certificate of this hub's region, not revoked, for a device
   that exists and is not revoked; its first message must be a Hello naming that same device.
2. The Hello's edged version must be inside the window this hub accepts
   (:func:`edgefleet.agentskew.check_skew`: its own and the two previous minor versions);
   outside it the stream ends with FAILED_PRECONDITION ``AgentVersionOutsideWindow: ...``
   naming the window, an event, and the record showing the version and why, nothing else of
   the Hello kept. Inside: the Hello's labels, inventory, health and version go into the
   device record; the device is Ready.
3. The hub sends the device's complete desired state now, and again whenever it changes
   (level-based: always the whole state; a slow device only ever gets the newest).
4. Status, Ack and Heartbeat messages update the record through the coalescing writer;
   heartbeats only touch an in-memory last-seen time (the lifecycle controller judges it).
   Every message is bounded (:mod:`hub.api.deviceinput`: INVALID_ARGUMENT naming the field, and
   nothing of it kept) and Status is rate limited per device (``[devices] statusRate``,
   ``statusBurst``: RESOURCE_EXHAUSTED ends the stream; edged sends status only on change).
5. Attestation challenges queued on the session are sent; evidence is handed to the
   attestation controller.

``hub_sync_latency_seconds`` is measured here, from a desired state sent on this stream to its
Ack: the Sync handler is not wrapped by the metrics interceptor (grpc aio turned a wrapped
Sync's refusal before the Hello, a revoked device's UNAUTHENTICATED, into INTERNAL).

A second stream from the same device replaces the first. Revocation closes the stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import grpc
from google.protobuf import json_format

from edgefleet.agentskew import SkewVerdict, check_skew
from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.errors import CsrRejected, EdgefleetError, PkiError, TrustError
from edgefleet.logs import get_logger
from edgefleet.metrics import Histogram
from edgefleet.sealing import public_key_of
from edgefleet.trust import tpmbinding
from edgefleet.v1 import common_pb2, device_pb2, device_pb2_grpc
from edgefleet.versioning import installed_version
from hub import pki
from hub.api.auth import Caller, authorize
from hub.api.blobserving import blob_chunks
from hub.api.deviceinput import check_hello, check_message
from hub.api.ratelimit import Rate, RateLimiter
from hub.config import DevicesConfig
from hub.decide.agentrevisions import DesiredAgentSpec
from hub.decide.desired import MAX_DESIRED_STATE_BYTES, DesiredContent
from hub.decide.devices import (
    AgentReport,
    Device,
    DevicePhase,
    Health,
    RevisionPhase,
    RevisionReport,
    Termination,
    TrustState,
    WorkloadReport,
    with_latencies,
)
from hub.decide.placement import tpm_attested
from hub.decide.status import (
    bound_termination_times,
    broken_revisions,
    describe_failure,
    new_terminations,
    termination_message,
)
from hub.pki import CertifiedKey, Role
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.secrets import SecretKeys, seal_for
from hub.state.sessions import Session, Sessions
from hub.state.sharedblobs import SharedBlobs
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

HELLO_TIMEOUT_S = 30.0
TIMED_GENERATIONS = 8
"""Desired states sent on one stream whose Ack is timed; older ones are dropped."""


class StreamRefused(EdgefleetError):
    """A device's message was refused: the Sync stream ends with ``code`` and ``message``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _joined(problems: list[str], limit: int = 20) -> str:
    more = f"; and {len(problems) - limit} more" if len(problems) > limit else ""
    return "; ".join(problems[:limit]) + more


MAX_REPORTED_WORKLOADS = 256
MAX_REPORTED_REVISIONS = 8
MAX_REPORTED_SANDBOXES = 64

EvidenceHandler = Callable[[str, bytes, bytes], None]


def _health(msg: Any) -> Health:
    return Health(bool(msg.schedulable), tuple(msg.reasons))


def _sizing(s: device_pb2.WorkloadSizing) -> dict[str, Any]:
    d = s.last_decision
    return {
        "currentReplicas": s.current_replicas,
        "desiredReplicas": s.desired_replicas,
        "minReplicas": s.min_replicas,
        "maxReplicas": s.max_replicas,
        "evictedReplicas": s.evicted_replicas,
        "priority": s.priority,
        "effectiveMaxBatchSize": s.effective_max_batch_size,
        "queueDepth": s.queue_depth if s.HasField("queue_depth") else None,
        "cpuPercent": s.cpu_percent if s.HasField("cpu_percent") else None,
        "lastDecision": {
            "from": d.from_replicas,
            "to": d.to_replicas,
            "reason": d.reason,
            "message": d.message,
            "at": d.at.ToNanoseconds() / 1e9,
        }
        if s.HasField("last_decision")
        else None,
    }


def _workload(w: device_pb2.WorkloadStatus) -> WorkloadReport:
    return WorkloadReport(
        model_version=w.model_version,
        revision=w.revision,
        desired_replicas=w.desired_replicas,
        ready_replicas=w.ready_replicas,
        phase="",
        conditions=tuple(
            {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message}
            for c in w.conditions
        ),
        revisions=tuple(
            RevisionReport(
                model_version=r.model_version,
                sha256=r.sha256,
                phase=RevisionPhase.parse(r.phase),
                ready_replicas=r.ready_replicas,
                revision=r.revision,
                reason=r.reason,
                message=r.message,
                wanted=r.wanted,
                **_measures(r),
                bytes_done=r.bytes_done,
                bytes_total=r.bytes_total,
            )
            for r in w.revisions[:MAX_REPORTED_REVISIONS]
        ),
        sizing=_sizing(w.sizing) if w.HasField("sizing") else None,
        sandboxes=tuple(_sandbox(x) for x in w.replica_sandboxes[:MAX_REPORTED_SANDBOXES]),
        last_termination=_termination(w) if w.HasField("last_termination") else None,
        restart_count=w.restart_count,
        config_digest=w.model_config.digest,
        config_error=w.model_config.error,
    )


def _termination(w: device_pb2.WorkloadStatus) -> Termination:
    t = w.last_termination
    finished = t.finished_at.ToNanoseconds() / 1e9 if t.HasField("finished_at") else None
    return Termination(t.replica, t.reason, t.message, t.exit_code, t.signal, finished)


def _compliance(c: device_pb2.DeviceCompliance) -> dict[str, Any]:
    return {
        "checked": c.checked,
        "compliant": c.compliant if c.checked else None,
        "action": c.action,
        "findings": [
            {"kind": f.kind, "subject": f.subject, "message": f.message} for f in c.findings
        ],
        "quarantined": c.quarantined or None,
        "processesChecked": c.processes_checked,
        "opensWatched": c.opens_watched if c.HasField("opens_watched") else None,
        "opensWatchReason": c.opens_watch_reason or None,
    }


def _desired_agent(agent: DesiredAgentSpec | None) -> device_pb2.DesiredAgent | None:
    """``DesiredState.agent`` (None: unset, the device keeps its committed release)."""
    if agent is None:
        return None
    return device_pb2.DesiredAgent(
        version=agent.version,
        signed_metadata=agent.signed_metadata,
        upgrade=agent.upgrade,
        upgrade_revision=agent.upgrade_revision,
        commit_deadline=_duration(agent.commit_deadline_s),
        max_tries=agent.max_tries,
    )


def _agent(a: device_pb2.AgentStatus, now: float) -> AgentReport:
    """The status message's ``agent`` (bounds: ``hub.api.deviceinput``); a change the device
    dates after ``now`` (its clock ahead, or lying) is dated ``now``."""
    changed = a.changed_at.ToNanoseconds() / 1e9 if a.HasField("changed_at") else None
    changed = None if changed is None else min(changed, now)
    return AgentReport(
        version=a.version,
        committed_version=a.committed_version,
        phase=a.phase,
        desired_version=a.desired_version,
        reason=a.reason,
        message=a.message,
        tries=a.tries,
        slot=a.slot,
        arch=a.arch,
        python_abi=a.python_abi,
        launcher=a.launcher,
        upgrade=a.upgrade,
        upgrade_revision=a.upgrade_revision,
        changed_at=changed,
        bytes_done=a.bytes_done,
        bytes_total=a.bytes_total,
    )


def _sandbox(x: device_pb2.ReplicaSandbox) -> dict[str, Any]:
    return {
        "replica": x.replica,
        "revision": x.revision,
        "mode": x.mode,
        "landlockAbi": x.landlock_abi,
        "filesystem": x.filesystem,
        "network": x.network,
        "noNewPrivs": x.no_new_privs,
        "seccomp": x.seccomp,
        "scoped": x.scoped,
        "connectPorts": list(x.connect_ports),
        **({"connectTo": list(x.connect_to)} if x.connect_to else {}),
        "uid": x.uid,
        "separateUid": x.separate_uid,
        "problems": list(x.problems),
    }


def _measures(r: device_pb2.RevisionStatus) -> dict[str, Any]:
    """The revision's metrics and validation accuracy, when the device reports them (bounds:
    ``hub.api.deviceinput``)."""
    out: dict[str, Any] = {}
    if r.HasField("metrics"):
        m = r.metrics
        out.update(
            requests=m.requests,
            errors=m.errors,
            latency_p95_s=m.latency_p95_seconds if m.window_requests else None,
            window_requests=m.window_requests,
        )
    if r.HasField("validation"):
        v = r.validation
        out.update(
            accuracy=None if v.reason else v.accuracy,
            validation_samples=v.samples,
            validation_reason=v.reason,
            validation_message=v.message,
        )
    return out


class DeviceServicer(device_pb2_grpc.DeviceServiceServicer):
    """DeviceService (the module doc); hub.server builds it with what it uses."""

    def __init__(
        self,
        cache: Cache,
        writer: DeviceWriter,
        projector: Projector,
        sessions: Sessions,
        ca: CertifiedKey,
        blobs: ArtifactStore,
        secret_keys: SecretKeys,
        *,
        region: str,
        limits: DevicesConfig,
        reserved_labels: tuple[str, ...],
        pcrs: tuple[int, ...],
        device_lifetime_s: float,
        sync_seconds: Histogram,
        tuf: Callable[[], TufRepository | RelayedTuf | None],
        shared_blobs: SharedBlobs | None,
        clock: Callable[[], float],
        on_evidence: EvidenceHandler | None = None,
        agent_release: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        # whether a sha256 is the file of an edged release the hub holds (any device may
        # fetch those: hub.state.agentreleases.holds_agent_release)
        self.agent_release = agent_release
        self.cache = cache
        self.writer = writer
        self.projector = projector
        self.sessions = sessions  # each device's open stream
        self.ca = ca  # signs renewed device certificates
        self.blobs = blobs  # the artifacts devices fetch
        self.secret_keys = secret_keys  # open the Secrets sealed at rest, to seal them again
        self.region = region
        self.limits = limits  # [devices]: the heartbeat interval, the status rate
        self.reserved_labels = reserved_labels  # [enrollment] reservedLabels
        self.pcrs = pcrs  # [attestation] pcrs: what a challenge asks to quote
        self.device_lifetime_s = device_lifetime_s  # a renewed certificate's lifetime
        self.sync_seconds = sync_seconds  # hub_sync_latency_seconds (module doc)
        self.tuf = tuf  # the TUF repository held now (tufwatch, a region's relay replace it)
        self.shared_blobs = shared_blobs  # replicas: bytes pushed through another replica
        self.clock = clock
        self.last_seen: dict[str, float] = {}
        # the last desired state sent to each device from this replica: what its artifact
        # fetches are checked against where the projector does not run (a follower replica,
        # hub.controllers.replicas.FollowerOffers); one per device
        self.sent_contents: dict[str, DesiredContent] = {}
        self.on_evidence = on_evidence
        # hub replicas on etcd: told of each newer acknowledgement, which then goes into the
        # replica's heartbeat record (hub.controllers.replicas.ReplicaDevices.acked) rather
        # than a write of the device's whole record; None (one hub): the device writer's
        self.on_ack: Callable[[str, int], None] | None = None
        self.status_limit = RateLimiter(Rate(limits.status_rate, limits.status_burst))
        # The edged versions this hub accepts are a window around its own (agentskew).
        self.hub_version = installed_version()

    async def _caller(self, context: grpc.aio.ServicerContext) -> tuple[Caller, Device]:
        caller = await authorize(
            context, region=self.region, revoked=self.cache.revoked, roles={Role.DEVICE}
        )
        device = self.cache.devices.get(caller.name)
        if device is None:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED, f"device {caller.name} is not enrolled here"
            )
            raise AssertionError("unreachable")
        if device.revoked:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, f"device {caller.name} has been revoked"
            )
        if not device.accepts_serial(caller.serial):
            log.warning(
                "superseded certificate refused",
                device=caller.name,
                serial=caller.serial,
                current=device.certificate_serial,
            )
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"certificate {caller.serial} of device {caller.name} has been superseded by a "
                "renewal; the device must use its current certificate",
            )
        return caller, device

    def _sealed(
        self,
        context: grpc.aio.ServicerContext,
        device: str,
        refs: tuple[tuple[str, int], ...],
    ) -> list[device_pb2.SealedSecret]:
        """The secrets of a desired state sealed to the key of the certificate this stream
        was opened with (the device's identity key). Checked again here: none to a device
        that is not trusted while a baseline requires attestation, and none that requires a
        TPM to a device that is not TPM-attested; those go sealed to its TPM sealing key."""
        if not refs:
            return []
        record = self.cache.devices.get(device)
        trusted = record is not None and record.attestation.state is TrustState.TRUSTED
        if self.cache.security_policy().require_attestation and not trusted:
            return []
        tpm_secrets = self.cache.tpm_secrets()
        sealing_pem = ""
        if record is not None and tpm_attested(record):
            sealing_pem = record.sealing_key_pem
        if not sealing_pem:  # spec.requireTpm: only to TPM-attested devices with a sealing key
            refs = tuple(ref for ref in refs if ref[0] not in tpm_secrets)
        try:
            sealing_key = public_key_of(sealing_pem.encode()) if sealing_pem else None
            pem = (context.auth_context().get("x509_pem_cert") or (b"",))[0]
            key = public_key_of(pem)
            sealed = seal_for(
                device,
                key,
                refs,
                self.cache.secrets,
                self.secret_keys,
                tpm_secrets=tpm_secrets,
                tpm_key=sealing_key,
            )
        except (EdgefleetError, ValueError) as exc:  # SealError: no key of this hub opens one
            log.error("secrets not sealed", device=device, error=str(exc))
            return []
        return [
            device_pb2.SealedSecret(
                name=s.name,
                version=s.version,
                ephemeral_public_key=s.ephemeral_public,
                nonce=s.nonce,
                ciphertext=s.ciphertext,
                require_tpm=s.require_tpm,
            )
            for s in sealed
        ]

    # -- Sync -------------------------------------------------------------------------------------
    async def Sync(
        self,
        request_iterator: AsyncIterator[device_pb2.DeviceMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[device_pb2.HubMessage]:
        it = request_iterator.__aiter__()
        # The first message is read before the caller is checked: a refusal sent while the
        # device is still writing its hello reaches it as INTERNAL ("Internal error from
        # Core", gRPC's client turns the failed write into that), not as the refusal. The
        # caller passed mutual TLS; the read is bounded in size and time.
        missing: BaseException | None = None
        try:
            first = await asyncio.wait_for(it.__anext__(), HELLO_TIMEOUT_S)
        except (TimeoutError, StopAsyncIteration) as exc:
            missing = exc
        except asyncio.CancelledError:
            log.warning("sync cancelled before hello", peer=context.peer())
            raise
        caller, device = await self._caller(context)
        if missing is not None:
            log.warning("sync without hello", device=caller.name, error=type(missing).__name__)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the stream must open with Hello")
            return
        if first.WhichOneof("message") != "hello":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the first message must be hello, got {first.WhichOneof('message')}",
            )
        hello = first.hello
        problems = check_hello(hello, reserved=self.reserved_labels)
        if problems:
            log.warning("device input refused", device=caller.name, problems=problems[:5])
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _joined(problems))
        if hello.device_name and hello.device_name != caller.name:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"device {caller.name} may not speak for device {hello.device_name}",
            )
        verdict = check_skew(hello.edged_version, self.hub_version)
        if not verdict.allowed:
            await self._refuse_version(context, device, hello.edged_version, verdict)
        now = self.clock()
        device = device.with_(
            agent_version=hello.edged_version,
            agent_refused="",
            reported_labels=dict(hello.labels),
            facts=json_format.MessageToDict(hello.inventory),
            health=_health(hello.health) if hello.HasField("health") else device.health,
            phase=DevicePhase.READY,
            last_heartbeat=now,
            generation_acked=max(device.generation_acked, hello.applied_generation),
        )
        handover = bool(device.previous_serial) and caller.serial == device.certificate_serial
        if handover:
            device = device.with_(previous_serial="")
            self.writer.event(
                "Device",
                caller.name,
                "Normal",
                "CertificateHandedOver",
                f"connected with its renewed certificate {caller.serial}; the previous one "
                "is refused from now on",
            )
        if device.phase is not self.cache.devices[caller.name].phase:
            self.writer.event("Device", caller.name, "Normal", "Connected", "the device connected")
        self.writer.update(device)
        if handover:
            await self.writer.flush()  # the old certificate stays refused across a restart
        self.last_seen[caller.name] = now
        session = self.sessions.open(caller.name, caller.serial)
        log.info("device connected", device=caller.name, generation=hello.applied_generation)
        sent_at: dict[int, float] = {}  # generation -> when it was sent on this stream
        reader = asyncio.ensure_future(self._read(caller.name, it, session, sent_at))
        try:
            # What the device is owed now goes out at once; the batched projector looks at
            # the device again (its labels and phase may have changed) and offers any newer
            # state to the session. Projecting inline here would cost one transaction per
            # connecting device: thousands when a hub restarts.
            # (only the state the store records: a replica that led before and follows now
            # holds its projector's contents of then; the follower sends the recorded one,
            # hub.controllers.replicas.FollowerOffers)
            content = self.projector.content_for(caller.name)
            record = self.cache.desired.get(caller.name)
            if content is not None and record is not None and record.digest == content.digest:
                session.offer(content)
            self.projector.mark([caller.name])
            sent = 0
            while not session.closed and not reader.done():
                if session.desired is not None:
                    record = self.cache.desired.get(caller.name)
                    content, session.desired = session.desired, None
                    if record is not None and record.generation > sent:
                        sent = record.generation
                        self.sent_contents[caller.name] = content
                        message = device_pb2.HubMessage(
                            desired_state=device_pb2.DesiredState(
                                generation=record.generation,
                                manifests=list(content.manifests),
                                artifact_metadata=list(content.artifact_metadata),
                                rollback_allowances=list(content.rollback_allowances),
                                trust_roots=list(content.trust_roots),
                                heartbeat_interval=_duration(self.limits.heartbeat_interval_s),
                                secrets=self._sealed(context, caller.name, content.secrets),
                                agent=_desired_agent(content.agent),
                                model_configs=[
                                    device_pb2.ModelConfigDocument(workload=n, document=d, digest=g)
                                    for n, d, g in content.model_configs
                                ],
                            )
                        )
                        size = message.ByteSize()
                        if size > MAX_DESIRED_STATE_BYTES:
                            # Apply refuses this; a label or a push can still cause it. The
                            # device keeps what it runs; the operator is told which and why.
                            log.error(
                                "desired state too large",
                                device=caller.name,
                                generation=record.generation,
                                bytes=size,
                            )
                            self.writer.event(
                                "Device",
                                caller.name,
                                "Warning",
                                "DesiredStateTooLarge",
                                f"desired state generation {record.generation} is "
                                f"{size / 2**20:.1f} MiB, over the "
                                f"{MAX_DESIRED_STATE_BYTES / 2**20:.2f} MiB a device can "
                                "receive: not sent; the device keeps its current state",
                            )
                        else:
                            session.sent_any = True
                            yield message
                            sent_at[record.generation] = time.monotonic()
                            for old in sorted(sent_at)[:-TIMED_GENERATIONS]:
                                del sent_at[old]
                while session.log_requests:
                    request_id, workload, tail = session.log_requests.pop(0)
                    yield device_pb2.HubMessage(
                        log_request=device_pb2.DeviceLogRequest(
                            request_id=request_id, workload=workload, tail=tail
                        )
                    )
                while session.challenges:
                    nonce = session.challenges.pop(0)
                    yield device_pb2.HubMessage(
                        attestation_challenge=device_pb2.AttestationChallenge(
                            nonce=nonce, pcr_selection=list(self.pcrs)
                        )
                    )
                waiter = asyncio.ensure_future(session.wait())
                try:
                    await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                finally:  # also when the call is cancelled while waiting
                    waiter.cancel()
            if session.closed:
                await context.abort(grpc.StatusCode.UNAVAILABLE, session.close_reason)
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                failure = reader.exception()
                if isinstance(failure, StreamRefused):
                    await context.abort(failure.code, failure.message)
                raise failure  # type: ignore[misc]  # e.g. a malformed message's abort
        finally:
            reader.cancel()
            for answer in list(session.log_answers.values()):
                answer.cancel()  # nobody will answer them on this stream
            self.sessions.release(session)
            log.info("device disconnected", device=caller.name)

    async def _refuse_version(
        self,
        context: grpc.aio.ServicerContext,
        device: Device,
        version: str,
        verdict: SkewVerdict,
    ) -> None:
        """End a Sync from an edged outside the version window (edgefleet.agentskew): the
        record shows the version and why (an event when that changes: a refused edged
        reconnects on its backoff), and nothing else of its Hello is kept."""
        refused = f"{verdict.reason}: {verdict.message}"
        log.warning("edged version refused", device=device.name, version=version)
        if (device.agent_version, device.agent_refused) != (version, refused):
            self.writer.update(device.with_(agent_version=version, agent_refused=refused))
            self.writer.event("Device", device.name, "Warning", verdict.reason, verdict.message)
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refused)

    def _observe_ack(self, generation: int, sent_at: dict[int, float]) -> None:
        """The time from sending ``generation`` to its Ack; older ones sent are now moot (a
        device acknowledges only the newest state it was given)."""
        at = sent_at.pop(generation, None)
        if at is not None:
            self.sync_seconds.observe(time.monotonic() - at)
        for older in [g for g in sent_at if g < generation]:
            del sent_at[older]

    async def _read(
        self,
        name: str,
        it: AsyncIterator[device_pb2.DeviceMessage],
        session: Session,
        sent_at: dict[int, float],
    ) -> None:
        async for msg in it:
            now = self.clock()
            self.last_seen[name] = now
            kind = msg.WhichOneof("message")
            device = self.cache.devices.get(name)
            if device is None or session.closed:
                return
            record = self.cache.desired.get(name)
            issued = max(record.generation if record else 0, device.generation_acked)
            problems = check_message(msg, issued=issued, reserved=self.reserved_labels)
            if problems:
                log.warning("device input refused", device=name, problems=problems[:5])
                raise StreamRefused(grpc.StatusCode.INVALID_ARGUMENT, _joined(problems))
            if kind == "status" and not self.status_limit.allow(name, now):
                log.warning("device status rate limited", device=name)
                rate = self.status_limit.rate
                raise StreamRefused(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"status messages faster than {rate.per_second:g}/s (burst {rate.burst}): "
                    "reconnect later and send status when it changes",
                )
            if kind == "log_lines":
                session.answer_logs(msg.log_lines.request_id, list(msg.log_lines.lines))
            elif kind == "ack":
                self._observe_ack(msg.ack.generation, sent_at)
                if msg.ack.generation > device.generation_acked:
                    acked = device.with_(generation_acked=msg.ack.generation)
                    if self.on_ack is None:
                        self.writer.update(acked)
                    else:  # hub replicas: into this replica's heartbeat record, not the device's
                        self.cache.put_device(acked)
                        self.on_ack(name, msg.ack.generation)
            elif kind == "status":
                workloads = bound_termination_times(
                    device.workloads, {w.name: _workload(w) for w in msg.status.workloads}, now
                )
                health = _health(msg.status.health) if msg.status.HasField("health") else None
                changed = device.with_(
                    workloads=workloads,
                    observed_generation=msg.status.observed_generation,
                    health=health or device.health,
                    last_heartbeat=now,
                    compliance=(
                        _compliance(msg.status.compliance)
                        if msg.status.HasField("compliance")
                        else device.compliance
                    ),
                    agent=_agent(msg.status.agent, now)
                    if msg.status.HasField("agent")
                    else device.agent,
                )
                measured = {
                    r.sha256: r.benchmark.p95_seconds
                    for w in msg.status.workloads
                    for r in w.revisions[:MAX_REPORTED_REVISIONS]
                    if r.sha256 and r.HasField("benchmark")
                }
                if any(device.latencies.get(k) != v for k, v in measured.items()):
                    changed = changed.with_(latencies=with_latencies(device.latencies, measured))
                    self.projector.mark([name])  # the scheduler reads them (maxLatencyP95)
                labels = dict(msg.status.labels)
                if labels and labels != device.reported_labels:  # empty: an older edged
                    changed = changed.with_(reported_labels=labels)
                    self.projector.mark([name])  # placement reads labels (the scheduler too)
                    log.info("device labels changed", device=name)
                if changed.health != device.health:
                    self.projector.mark([name])
                    self.writer.event(
                        "Device",
                        name,
                        "Normal" if changed.health.schedulable else "Warning",
                        "Schedulable" if changed.health.schedulable else "Unschedulable",
                        "; ".join(changed.health.reasons) or "health policy met",
                    )
                for workload, rev in broken_revisions(device.workloads, workloads):
                    self.writer.event(
                        "ModelDeployment",
                        workload,
                        "Warning",
                        "Revision" + rev.phase.value,
                        f"device {name}: {describe_failure(rev)}",
                    )
                for workload, ended in new_terminations(device.workloads, workloads):
                    self.writer.event(
                        "ModelDeployment",
                        workload,
                        "Warning",
                        ended.reason,
                        f"device {name}: {termination_message(ended)}",
                    )
                self.writer.update(changed)  # a rollout reacts (hub.state.feed)
            elif kind == "attestation_evidence" and self.on_evidence is not None:
                ev = msg.attestation_evidence
                self.on_evidence(name, bytes(ev.nonce), bytes(ev.evidence))
            # heartbeat: last_seen above is all it does

    # -- certificates -----------------------------------------------------------------------------
    async def RenewCertificate(
        self, request: device_pb2.RenewCertificateRequest, context: grpc.aio.ServicerContext
    ) -> device_pb2.RenewCertificateResponse:
        caller, device = await self._caller(context)
        try:
            certificate = pki.sign_device_csr(
                self.ca,
                request.csr_pem,
                caller.identity,
                lifetime=timedelta(seconds=self.device_lifetime_s),
            )
        except (CsrRejected, PkiError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"csr_pem: {exc}")
            raise AssertionError("unreachable") from None
        serial = format(certificate.serial_number, "x")
        # The certificate this was asked with stays valid until the device connects with the
        # new one; any other earlier certificate is refused from now on.
        self.writer.update(
            device.with_(
                certificate_serial=serial,
                previous_serial=caller.serial,
                public_key_pem=pki.public_key_pem(certificate),
            )
        )
        self.writer.event(
            "Device",
            caller.name,
            "Normal",
            "CertificateRenewed",
            f"certificate {serial} issued; {caller.serial} is accepted until the device "
            "connects with the new one",
        )
        await self.writer.flush()
        log.info("certificate renewed", device=caller.name, serial=serial)
        return device_pb2.RenewCertificateResponse(
            certificate_chain_pem=pki.certificate_pem(certificate)
        )

    # -- the TPM attestation key ----------------------------------------------------------------
    async def ActivateAttestationKey(
        self,
        request: device_pb2.ActivateAttestationKeyRequest,
        context: grpc.aio.ServicerContext,
    ) -> device_pb2.ActivateAttestationKeyResponse:
        """The device's TPM recovered the enrollment credential's secret: the attestation key
        it was made for is in the TPM whose EK certificate the hub checked. Bind it (one try:
        a wrong secret withdraws the offer)."""
        caller, device = await self._caller(context)
        offer = device.ak_offer
        if offer is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"device {caller.name} has no attestation key waiting to be activated",
            )
            raise AssertionError("unreachable")
        got = hashlib.sha256(bytes(request.secret[:64])).hexdigest()
        if not hmac.compare_digest(got, offer.get("secretSha256", "")):
            self.writer.update(device.with_(ak_offer=None))
            self.writer.event(
                "Device", caller.name, "Warning", "AttestationKeyRefused",
                "the credential's secret is wrong: the key is not in the TPM the EK "
                "certificate names; the device stays software-attested",
            )  # fmt: skip
            await self.writer.flush()
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "the secret does not match the credential: attestation key not bound",
            )
        sealing_pem, refused = "", ""
        if request.sealing_key_public:
            try:
                sealing_pem = tpmbinding.check_sealing_key(
                    bytes(request.sealing_key_public),
                    bytes(request.sealing_key_attest),
                    bytes(request.sealing_key_signature_r),
                    bytes(request.sealing_key_signature_s),
                    ak_pem=offer["akPem"],
                    qualifying_data=tpmbinding.sealing_qualifying_data(bytes(request.secret[:64])),
                )
            except TrustError as exc:
                refused = str(exc)
        self.writer.update(
            device.with_(
                attestation_key_pem=offer["akPem"],
                ak_offer=None,
                sealing_key_pem=sealing_pem,
                ek_sha256=offer.get("ekSha256", ""),
            )
        )
        self.writer.event(
            "Device", caller.name, "Normal", "AttestationKeyBound",
            "TPM attestation key bound to the endorsement key: only quotes are accepted now"
            + ("; TPM sealing key recorded (Secrets that require a TPM are sealed to it)"
               if sealing_pem else ""),
        )  # fmt: skip
        if refused:
            self.writer.event(
                "Device", caller.name, "Warning", "SealingKeyRefused",
                f"{refused}; Secrets that require a TPM are not sent to this device",
            )  # fmt: skip
        await self.writer.flush()
        log.info("attestation key bound", device=caller.name, sealing_key=bool(sealing_pem))
        return device_pb2.ActivateAttestationKeyResponse(
            sealing_key_recorded=bool(sealing_pem), sealing_key_refused=refused
        )

    # -- artifacts --------------------------------------------------------------------------------
    async def FetchTufMetadata(
        self, request: common_pb2.TufMetadataRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.TufMetadataResponse:
        """A file of the TUF repository: any enrolled device may read it (it is public)."""
        await self._caller(context)
        from hub.state.tufrepo import serve_metadata

        response: common_pb2.TufMetadataResponse = await serve_metadata(
            self.tuf(), request, context
        )
        return response

    async def FetchArtifact(
        self, request: device_pb2.FetchArtifactRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[device_pb2.ArtifactChunk]:
        caller, _ = await self._caller(context)
        content = self.projector.content_for(caller.name)
        sent = self.sent_contents.get(caller.name)
        if (
            (content is None or request.sha256 not in content.artifacts)
            and (sent is None or request.sha256 not in sent.artifacts)
            and not (self.agent_release is not None and await self.agent_release(request.sha256))
        ):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"artifact {request.sha256[:16]} is not in device {caller.name}'s desired state",
            )
        async for offset, data in blob_chunks(
            self.blobs,
            self.shared_blobs,
            request.sha256,
            request.offset,
            context,
            end="the artifact's end",
        ):
            yield device_pb2.ArtifactChunk(offset=offset, data=data)


def _duration(seconds: float) -> Any:
    from google.protobuf.duration_pb2 import Duration

    d = Duration()
    d.FromTimedelta(timedelta(seconds=seconds))
    return d
