"""The hub link: edged's side of the Sync stream, as a supervised component.

* Connects to the hub over mutual TLS (the pinned hub CA, this device's certificate and
  identity key), opens Sync, sends Hello (inventory, labels, health, generation applied).
* Desired states are applied newest-first by one task: a state that arrives while another is
  being applied (downloads can take long) replaces any state still waiting. Once applied
  (verified, persisted) it is acknowledged. A transient failure retries the same state.
* Status is sent when it changed (checked every ``status_period``), a heartbeat every
  interval the hub asks for; attestation challenges are answered with signed evidence.
* When the stream breaks, it reconnects with exponential backoff and **full jitter** (a random
  delay up to the current bound), so a hub restart does not bring every device back at once.
  Meanwhile edged keeps serving its last verified state, across its own restarts too.
* The device certificate is renewed at a random point between 70 % and 90 % of its lifetime.

Only one task writes to the stream (grpc's rule); others queue messages for it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import orjson
from google.protobuf import struct_pb2

from edged import __version__
from edged.hublink.files import Link, LinkFiles
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic
from edgefleet.supervising import wait_for_stop
from edgefleet.v1 import common_pb2, device_pb2, device_pb2_grpc

log = get_logger(__name__)

BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
STABLE_AFTER_S = 30.0  # a session that lasted this long resets the backoff
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    # Our own backoff decides when to reconnect; grpc's must not add a lockstep of its own.
    ("grpc.initial_reconnect_backoff_ms", 1000),
]


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying a desired state gave: the generation now accepted, and whether to retry."""

    generation: int
    retry: bool = False


ApplyState = Callable[[device_pb2.DesiredState, "Fetcher"], Awaitable[Applied]]


@dataclass(frozen=True, slots=True)
class DeviceReport:
    """What the device says about itself (Hello and Status)."""

    inventory: dict[str, Any]
    labels: dict[str, str]
    schedulable: bool
    reasons: tuple[str, ...]
    workloads: tuple[device_pb2.WorkloadStatus, ...]


class Fetcher:
    """Artifact downloads over the link's channel: ``fetch(sha256, offset)``."""

    def __init__(self, stub: device_pb2_grpc.DeviceServiceStub) -> None:
        self._stub = stub

    async def __call__(self, sha256: str, offset: int) -> AsyncIterator[tuple[int, bytes]]:
        from edgefleet.errors import TemporaryError

        call = self._stub.FetchArtifact(
            device_pb2.FetchArtifactRequest(sha256=sha256, offset=offset)
        )
        try:
            async for chunk in call:
                yield chunk.offset, bytes(chunk.data)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND):
                from edgefleet.errors import ArtifactError

                raise ArtifactError("ArtifactFetchRefused", f"the hub: {exc.details()}") from None
            raise TemporaryError(f"artifact download broke: {exc.code().name}") from None


def full_jitter(attempt: int, rng: random.Random) -> float:
    """AWS's "full jitter": uniform in [0, min(max, base * 2**attempt)]."""
    return rng.uniform(0.0, min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2.0 ** min(attempt, 16)))


class HubLink:
    name = "hub-link"

    def __init__(
        self,
        files: LinkFiles,
        *,
        apply_state: ApplyState,
        report: Callable[[], DeviceReport],
        generation: Callable[[], int],
        answer_challenge: Callable[[bytes], Awaitable[bytes]] | None = None,
        status_period: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        self.files = files
        self.link: Link = files.load()
        self._apply_state = apply_state
        self._report = report
        self._generation = generation
        self._answer = answer_challenge
        self._status_period = status_period
        self._rng = rng or random.Random()
        self.connected = False
        self.last_error = ""
        self.heartbeat_interval = 30.0
        self.renewed_at: float | None = None
        self._last_state: device_pb2.DesiredState | None = None
        self._pending: list[device_pb2.DesiredState] | None = None
        self._wake: asyncio.Event | None = None

    def reapply(self) -> None:
        """Apply the last desired state again (an artifact of it went missing locally)."""
        if self._last_state is not None and self._pending is not None and self._wake:
            if not self._pending:
                self._pending.append(self._last_state)
            self._wake.set()

    def status(self) -> dict[str, Any]:
        return {
            "hub": self.link.hub,
            "deviceName": self.link.device_name,
            "connected": self.connected,
            "lastError": self.last_error or None,
        }

    # -- the component -------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        attempt = 0
        renewer = asyncio.ensure_future(self._renew_loop(stop))
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    await self._session(stop)
                except grpc.aio.AioRpcError as exc:
                    self.last_error = f"{exc.code().name}: {exc.details()}"
                    log.warning("hub link broken", code=exc.code().name, details=exc.details())
                except (OSError, ValueError) as exc:
                    self.last_error = str(exc)
                    log.warning("hub link failed", error=str(exc))
                finally:
                    self.connected = False
                if stop.is_set():
                    break
                attempt = 0 if time.monotonic() - started > STABLE_AFTER_S else attempt + 1
                delay = full_jitter(attempt, self._rng)
                await wait_for_stop(stop, delay)
        finally:
            renewer.cancel()

    def _credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.files.ca.read_bytes(),
            private_key=self.files.key.read_bytes(),
            certificate_chain=self.files.certificate.read_bytes(),
        )

    async def _session(self, stop: asyncio.Event) -> None:
        async with grpc.aio.secure_channel(
            self.link.hub, self._credentials(), options=CHANNEL_OPTIONS
        ) as channel:
            stub = device_pb2_grpc.DeviceServiceStub(channel)  # type: ignore[no-untyped-call]
            call = stub.Sync()
            outbox: asyncio.Queue[device_pb2.DeviceMessage] = asyncio.Queue()
            report = self._report()
            await call.write(
                device_pb2.DeviceMessage(
                    hello=device_pb2.Hello(
                        device_name=self.link.device_name,
                        inventory=_struct(report.inventory),
                        labels=report.labels,
                        health=common_pb2.Health(
                            schedulable=report.schedulable, reasons=list(report.reasons)
                        ),
                        applied_generation=self._generation(),
                        edged_version=__version__,
                    )
                )
            )
            self.connected = True
            self.last_error = ""
            log.info("hub link up", hub=self.link.hub, device=self.link.device_name)
            pending: list[device_pb2.DesiredState] = []
            wake = asyncio.Event()
            self._pending, self._wake = pending, wake
            tasks = [
                asyncio.ensure_future(self._read(call, pending, wake, outbox)),
                asyncio.ensure_future(self._write(call, outbox)),
                asyncio.ensure_future(self._applier(pending, wake, outbox, Fetcher(stub))),
                asyncio.ensure_future(self._reporter(outbox)),
            ]
            stopper = asyncio.ensure_future(stop.wait())
            try:
                done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t is not stopper and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
            finally:
                stopper.cancel()
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                call.cancel()

    async def _read(
        self,
        call: Any,
        pending: list[device_pb2.DesiredState],
        wake: asyncio.Event,
        outbox: asyncio.Queue[device_pb2.DeviceMessage],
    ) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            kind = msg.WhichOneof("message")
            if kind == "desired_state":
                state = msg.desired_state
                if state.HasField("heartbeat_interval"):
                    self.heartbeat_interval = max(
                        state.heartbeat_interval.ToTimedelta().total_seconds(), 1.0
                    )
                pending[:] = [state]  # only the newest matters (level-based)
                self._last_state = state
                wake.set()
            elif kind == "attestation_challenge" and self._answer is not None:
                nonce = bytes(msg.attestation_challenge.nonce)
                evidence = await self._answer(nonce)
                outbox.put_nowait(
                    device_pb2.DeviceMessage(
                        attestation_evidence=device_pb2.AttestationEvidence(
                            nonce=nonce, evidence=evidence
                        )
                    )
                )

    async def _write(self, call: Any, outbox: asyncio.Queue[device_pb2.DeviceMessage]) -> None:
        while True:
            try:
                msg = await asyncio.wait_for(outbox.get(), self.heartbeat_interval)
            except TimeoutError:  # nothing said for a whole interval: say we are alive
                msg = device_pb2.DeviceMessage(heartbeat=device_pb2.Heartbeat())
            await call.write(msg)

    async def _applier(
        self,
        pending: list[device_pb2.DesiredState],
        wake: asyncio.Event,
        outbox: asyncio.Queue[device_pb2.DeviceMessage],
        fetch: Fetcher,
    ) -> None:
        attempt = 0
        while True:
            await wake.wait()
            wake.clear()
            if not pending:
                continue
            state = pending.pop()
            applied = await self._apply_state(state, fetch)
            if applied.retry:
                attempt += 1
                if not pending:  # nothing newer: try this one again after a backoff
                    pending.append(state)
                    asyncio.get_running_loop().call_later(
                        full_jitter(attempt, self._rng) + 0.1, wake.set
                    )
                else:
                    wake.set()
                continue
            attempt = 0
            outbox.put_nowait(
                device_pb2.DeviceMessage(ack=device_pb2.Ack(generation=applied.generation))
            )
            if pending:
                wake.set()

    async def _reporter(self, outbox: asyncio.Queue[device_pb2.DeviceMessage]) -> None:
        last = b""
        while True:
            report = self._report()
            msg = device_pb2.Status(
                workloads=list(report.workloads),
                health=common_pb2.Health(
                    schedulable=report.schedulable, reasons=list(report.reasons)
                ),
                observed_generation=self._generation(),
            )
            data = msg.SerializeToString(deterministic=True)
            if data != last:
                last = data
                outbox.put_nowait(device_pb2.DeviceMessage(status=msg))
            await asyncio.sleep(self._status_period)

    # -- certificate renewal ---------------------------------------------------------------
    def renewal_due(self) -> float:
        """Wall-clock time to renew: 70-90 % into the certificate's lifetime (jittered)."""
        not_before, not_after = self.files.certificate_validity()
        return not_before + (not_after - not_before) * self._rng.uniform(0.7, 0.9)

    async def _renew_loop(self, stop: asyncio.Event) -> None:
        attempt = 0
        due = self.renewal_due()
        while not stop.is_set():
            if await wait_for_stop(stop, max(due - time.time(), 0.0)):
                return
            try:
                await self.renew()
                attempt = 0
                due = self.renewal_due()
            except (grpc.aio.AioRpcError, OSError, ValueError) as exc:
                attempt += 1
                log.warning("certificate renewal failed", error=str(exc))
                due = time.time() + full_jitter(attempt, self._rng) + 1.0

    async def renew(self) -> None:
        from edged.trust.identity import load_or_create_identity

        identity = load_or_create_identity(self.files.data_dir, tpm="off")
        try:
            csr = identity.build_csr(self.link.device_name)
        finally:
            identity.close()
        async with grpc.aio.secure_channel(
            self.link.hub, self._credentials(), options=CHANNEL_OPTIONS
        ) as channel:
            stub = device_pb2_grpc.DeviceServiceStub(channel)  # type: ignore[no-untyped-call]
            resp = await stub.RenewCertificate(
                device_pb2.RenewCertificateRequest(csr_pem=csr), timeout=30
            )
        write_atomic(self.files.certificate, bytes(resp.certificate_chain_pem), mode=0o644)
        self.renewed_at = time.time()
        log.info("certificate renewed", device=self.link.device_name)


def _struct(doc: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    # Struct holds JSON values only: round-trip through JSON drops anything else safely.
    s.update(orjson.loads(orjson.dumps(doc, default=str)))
    return s
