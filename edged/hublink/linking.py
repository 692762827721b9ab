"""The hub link: edged's side of the Sync stream, as a supervised component.

* Connects to the hub over mutual TLS (the pinned hub CA, this device's certificate and
  identity key), opens Sync, sends Hello (inventory, labels, health, generation applied).
* Desired states are applied newest-first by one task, into the hub source
  (``sources/hub.py``): a state that arrives while another is being applied (downloads can
  take long) replaces any state still waiting. Once applied (verified, persisted) it is handed
  on (``on_accepted``) and acknowledged. A transient failure retries the same state.
* Status is sent when it changed (checked every ``status_period``), a heartbeat every
  interval the hub asks for; attestation challenges are answered with signed evidence.
* When the stream breaks, it reconnects with exponential backoff and **full jitter** (a random
  delay up to the current bound, :data:`RECONNECT_BACKOFF`), so a hub restart does not bring
  every device back at once.
  Meanwhile edged keeps serving its last verified state, across its own restarts too.
* **Hub replicas** (``link.json`` ``hubs``, from ``edged enroll --hub A,B`` and the hub's
  enrollment answer): the link sticks to the address that works; when its session fails it
  dials the next one, and the backoff grows once per round of every address (a replica that
  dies costs a device a delay of at most ``BACKOFF_BASE_S``, jittered, before it dials the
  next one).
* The device certificate is renewed at a random point between 70 % and 90 % of its lifetime.
* A hub that refuses this device (UNAUTHENTICATED: revoked; PERMISSION_DENIED: deleted or not
  enrolled there) :data:`REFUSALS_BEFORE_GIVING_UP` times in a row, with the usual backoff
  between, is not dialled again until edged restarts: the link's status says ``refused`` and
  why, one error is logged, and edged keeps serving its last verified state. The device must
  be enrolled again (``edged enroll``).

Only one task writes to the stream (grpc's rule); others queue messages for it. The
messages about the device are built by ``mapping.py`` from a plain ``DeviceReport``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

import grpc

from edged import __version__
from edged.hublink.devicereport import DeviceReport
from edged.hublink.files import Link, LinkFiles
from edged.hublink.mapping import hello_message, sealed_secrets, status_message
from edged.sources.hub import HubSource
from edgefleet.backoff import Backoff, Jitter
from edgefleet.failover import round_delay
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic
from edgefleet.supervising import wait_for_stop
from edgefleet.v1 import device_pb2, device_pb2_grpc

log = get_logger(__name__)

BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
# Reconnects, certificate renewals and desired states to retry: uniform in [0, min(60, 2**n)] s.
RECONNECT_BACKOFF = Backoff(BACKOFF_BASE_S, BACKOFF_MAX_S, Jitter.FULL)
STABLE_AFTER_S = 30.0  # a session that lasted this long resets the backoff
REFUSALS_BEFORE_GIVING_UP = 3
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    # Our own backoff decides when to reconnect; grpc's must not add a lockstep of its own.
    ("grpc.initial_reconnect_backoff_ms", 1000),
]


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

    async def metadata(self, name: str, max_length: int) -> bytes | None:
        """A file of the hub's TUF repository, at most ``max_length`` bytes; None when the
        hub has none (NOT_FOUND). Other failures raise ``OSError`` for python-tuf's client."""
        from edgefleet.v1 import common_pb2

        try:
            response = await self._stub.FetchTufMetadata(
                common_pb2.TufMetadataRequest(name=name, max_length=max_length), timeout=60.0
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED):
                return None  # UNIMPLEMENTED: a hub older than TUF keeps no repository
            raise OSError(f"TUF metadata {name}: {exc.code().name}: {exc.details()}") from None
        return bytes(response.data)  # python-tuf's fetcher refuses more than max_length


MAX_LOG_LINES = 1000


def answer_log_request(
    request: device_pb2.DeviceLogRequest, recent: Callable[[int, str], list[str]] | None
) -> device_pb2.DeviceMessage:
    """The answer to the hub's request for recent log lines (bounded; none when this edged
    keeps none)."""
    tail = min(request.tail or 100, MAX_LOG_LINES)
    lines = recent(tail, request.workload) if recent is not None else []
    return device_pb2.DeviceMessage(
        log_lines=device_pb2.DeviceLogLines(request_id=request.request_id, lines=lines[-tail:])
    )


class HubLink:
    name = "hub-link"

    def __init__(
        self,
        files: LinkFiles,
        *,
        source: HubSource,
        on_accepted: Callable[[], Awaitable[None]],
        syncing: Callable[[], AbstractContextManager[None]],
        report: Callable[[], DeviceReport],
        answer_challenge: Callable[[bytes], Awaitable[bytes]] | None = None,
        recent_logs: Callable[[int, str], list[str]] | None = None,
        status_period: float = 1.0,
        rng: random.Random | None = None,
        addresses: Sequence[str] = (),
        on_agent: Callable[[device_pb2.DesiredAgent | None], None] | None = None,
    ) -> None:
        """``source``: where desired states from the hub go; ``on_accepted``: called once one
        is accepted; ``syncing``: held while one is applied (no artifact garbage collection
        meanwhile); ``report``: what to say about the device (for Hello and each Status);
        ``on_agent``: each DesiredState's ``agent`` (None when it names none), for the agent
        controller (edged.agent)."""
        self.files = files
        self.link: Link = files.load()
        if addresses:  # edged.toml [hub] addresses: the replicas, instead of link.json's
            self.link = replace(self.link, hub=addresses[0], hubs=tuple(addresses))
        self._source = source
        self._on_accepted = on_accepted
        self._syncing = syncing
        self._report = report
        self._answer = answer_challenge
        self._recent_logs = recent_logs  # (tail, workload) -> lines, for edgectl logs
        self._status_period = status_period
        self._rng = rng or random.Random()
        self._on_agent = on_agent
        self._index = 0  # which of link.addresses the link uses (sticks while it works)
        self.connected = False
        # the session's artifact and TUF fetcher (None between sessions): what the agent
        # release fetch uses (edged.hublink.agentreleases.make_fetch: lambda: link.fetcher)
        self.fetcher: Fetcher | None = None
        self.last_error = ""
        self.refused = False  # the hub refused this device for good: not dialled again
        self.heartbeat_interval = 30.0
        self.renewed_at: float | None = None
        self._last_state: device_pb2.DesiredState | None = None
        self._pending: list[device_pb2.DesiredState] | None = None
        self._wake: asyncio.Event | None = None

    def refetch(self) -> None:
        """An artifact of the hub's desired state went missing locally: apply it again."""
        self._source.refetch_requested = True
        if self._last_state is not None and self._pending is not None and self._wake:
            if not self._pending:
                self._pending.append(self._last_state)
            self._wake.set()

    @property
    def hub(self) -> str:
        """The hub address (replica) the link uses now."""
        addresses = self.link.addresses
        return addresses[self._index % len(addresses)]

    def next_hub(self) -> str:
        """Move on to the next replica's address (after a failure); the new address."""
        self._index = (self._index + 1) % len(self.link.addresses)
        return self.hub

    def status(self) -> dict[str, Any]:
        """The ``hub`` section of ``/v1/status``: the link and the hub source."""
        return {
            "hub": self.hub,
            "hubs": list(self.link.addresses),
            "deviceName": self.link.device_name,
            "connected": self.connected,
            "refused": self.refused,
            "lastError": self.last_error or None,
            **self._source.status(),
        }

    async def _apply(self, state: device_pb2.DesiredState, fetch: Fetcher) -> bool:
        """Apply one desired state into the hub source; whether to retry it later."""
        with self._syncing():
            result = await self._source.apply(
                state.generation,
                list(state.manifests),
                list(state.artifact_metadata),
                list(state.rollback_allowances),
                fetch,
                trust_roots=list(state.trust_roots),
                tuf_fetch=fetch.metadata,
                secrets=sealed_secrets(state),
                model_configs=[
                    (c.workload, bytes(c.document), c.digest) for c in state.model_configs
                ],
            )
        if not result.stale and not result.retry:
            await self._on_accepted()
        return result.retry

    # -- the component -------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        attempt = refusals = 0
        renewer = asyncio.ensure_future(self._renew_loop(stop))
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    await self._session(stop)
                except grpc.aio.AioRpcError as exc:
                    self.last_error = f"{exc.code().name}: {exc.details()}"
                    refusals = refusals + 1 if exc.code() in _REFUSED else 0
                    if refusals >= REFUSALS_BEFORE_GIVING_UP:
                        self._give_up(exc)
                        renewer.cancel()
                        await stop.wait()
                        break
                    log.warning("hub link broken", code=exc.code().name, details=exc.details())
                except (OSError, ValueError) as exc:
                    refusals = 0
                    self.last_error = str(exc)
                    log.warning("hub link failed", error=str(exc))
                finally:
                    self.connected = False
                if stop.is_set():
                    break
                attempt = 0 if time.monotonic() - started > STABLE_AFTER_S else attempt + 1
                failed, hubs = self.hub, len(self.link.addresses)
                if hubs > 1:
                    log.info("hub link moving on", failed=failed, next=self.next_hub())
                # the delay grows once per round of every replica
                delay = round_delay(RECONNECT_BACKOFF, attempt, hubs, self._rng)
                await wait_for_stop(stop, delay)
        finally:
            renewer.cancel()

    def _give_up(self, exc: grpc.aio.AioRpcError) -> None:
        self.refused = True
        self.last_error = (
            f"refused by the hub ({exc.code().name}: {exc.details()}); not dialled again: "
            "enroll this device again (edged enroll), then restart edged"
        )
        log.error(
            "hub refused this device, link stopped",
            hub=self.hub,
            device=self.link.device_name,
            code=exc.code().name,
            details=exc.details(),
        )

    def _credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.files.ca.read_bytes(),
            private_key=self.files.key.read_bytes(),
            certificate_chain=self.files.certificate.read_bytes(),
        )

    async def _session(self, stop: asyncio.Event) -> None:
        async with grpc.aio.secure_channel(
            self.hub, self._credentials(), options=CHANNEL_OPTIONS
        ) as channel:
            stub = device_pb2_grpc.DeviceServiceStub(channel)  # type: ignore[no-untyped-call]
            call = stub.Sync()
            outbox: asyncio.Queue[device_pb2.DeviceMessage] = asyncio.Queue()
            hello = hello_message(
                self._report(),
                device_name=self.link.device_name,
                generation=self._source.generation,
                edged_version=__version__,
            )
            await call.write(device_pb2.DeviceMessage(hello=hello))
            fetcher = Fetcher(stub)
            self.connected = True
            self.fetcher = fetcher
            self.last_error = ""
            log.info("hub link up", hub=self.hub, device=self.link.device_name)
            pending: list[device_pb2.DesiredState] = []
            wake = asyncio.Event()
            self._pending, self._wake = pending, wake
            tasks = [
                asyncio.ensure_future(self._read(call, pending, wake, outbox)),
                asyncio.ensure_future(self._write(call, outbox)),
                asyncio.ensure_future(self._applier(pending, wake, outbox, fetcher)),
                asyncio.ensure_future(self._reporter(outbox)),
            ]
            stopper = asyncio.ensure_future(stop.wait())
            try:
                done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t is not stopper and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
            finally:
                self.fetcher = None
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
                if self._on_agent is not None:
                    self._on_agent(state.agent if state.HasField("agent") else None)
            elif kind == "log_request":
                outbox.put_nowait(answer_log_request(msg.log_request, self._recent_logs))
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
            if await self._apply(state, fetch):
                attempt += 1
                if not pending:  # nothing newer: try this one again after a backoff
                    pending.append(state)
                    asyncio.get_running_loop().call_later(
                        RECONNECT_BACKOFF.delay(attempt, self._rng) + 0.1, wake.set
                    )
                else:
                    wake.set()
                continue
            attempt = 0
            ack = device_pb2.Ack(generation=self._source.generation)
            outbox.put_nowait(device_pb2.DeviceMessage(ack=ack))
            if pending:
                wake.set()

    async def _reporter(self, outbox: asyncio.Queue[device_pb2.DeviceMessage]) -> None:
        last = b""
        while True:
            msg = status_message(self._report(), generation=self._source.generation)
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
                due = time.time() + RECONNECT_BACKOFF.delay(attempt, self._rng) + 1.0

    async def renew(self) -> None:
        from edged.trust.identity import load_or_create_identity

        identity = load_or_create_identity(self.files.data_dir, tpm="off")
        try:
            csr = identity.build_csr(self.link.device_name)
        finally:
            identity.close()
        async with grpc.aio.secure_channel(
            self.hub, self._credentials(), options=CHANNEL_OPTIONS
        ) as channel:
            stub = device_pb2_grpc.DeviceServiceStub(channel)  # type: ignore[no-untyped-call]
            resp = await stub.RenewCertificate(
                device_pb2.RenewCertificateRequest(csr_pem=csr), timeout=30
            )
        write_atomic(self.files.certificate, bytes(resp.certificate_chain_pem), mode=0o644)
        self.renewed_at = time.time()
        log.info("certificate renewed", device=self.link.device_name)
