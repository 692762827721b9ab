"""FederationService: the root hub's end of its regional hubs' streams (docs/federation.md;
mutual TLS, hub role, an enrolled region's current certificate, :mod:`hub.state.regions`).

* ``Federate``: a RegionHello naming the certificate's region, then the root sends the region's
  slice (:func:`hub.decide.regionslice.plan_slice`) at once and whenever its digest changes
  (looked at ``SLICE_GATHER_S`` after every device is marked,
  :meth:`hub.state.regions.Regions.changed`, as an apply, a push, a new revision or a wave
  state written do; and every ``SLICE_POLL_S`` for the rest), with a generation that only
  grows (the root's store revision when the slice changed). The region acknowledges
  (SliceApplied) and reports (RegionReport, bounded by
  :func:`hub.state.regionmapping.check_report`, at most ``REPORT_RATE`` a second with a burst):
  a message over a bound ends the stream with INVALID_ARGUMENT or RESOURCE_EXHAUSTED and
  nothing of it is kept. A second stream of a region replaces the first. The replica a region
  streams to writes its reports to the store (:mod:`hub.state.sharedreports`).
* ``FetchFederatedArtifact``: a blob named by the caller's slice, from an offset.
* ``RenewFederationCertificate``: a new certificate for the caller's own region (the root's
  ``[certificates] regionLifetime``); the record keeps the certificate it was asked with as
  ``previousSerial`` (accepted until the region renews again: a reply lost on the way does not
  lock the region out) with a ``CertificateRenewed`` event, in one transaction.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import grpc

from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.errors import CompareFailed, CsrRejected, EdgefleetError, PkiError
from edgefleet.logs import get_logger
from edgefleet.v1 import federation_pb2, federation_pb2_grpc
from hub import pki
from hub.api.auth import Caller, authorize
from hub.api.blobserving import blob_chunks
from hub.api.ratelimit import Rate, RateLimiter
from hub.controllers.wave import WaveController
from hub.decide import regionslice
from hub.pki import Role
from hub.state import regionmapping, sharedreports, storekeys, tufrelay
from hub.state.agentreleases import agent_releases
from hub.state.cache import Cache
from hub.state.regions import REGIONS, Regions, RegionState, region_key
from hub.state.sharedblobs import SharedBlobs
from hub.state.sharedreports import ReportPublisher
from hub.state.store import Compare, Put, Store
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

HELLO_TIMEOUT_S = 30.0
SLICE_POLL_S = 0.5
MAX_FEDERATED_AGENT_RELEASES = 16  # platforms of one version sent a region at most
SLICE_GATHER_S = 0.02  # after a change: the rest of an apply's changes come with it
REPORT_RATE = Rate(2.0, 20)  # reports per second per region, burst


class FederationServicer(federation_pb2_grpc.FederationServiceServicer):
    """The root's end of the regions' streams (module doc)."""

    def __init__(
        self,
        store: Store,
        cache: Cache,
        writer: DeviceWriter,
        blobs: ArtifactStore,
        ca: pki.CertifiedKey,
        regions: Regions,
        *,
        region: str,
        replica: str,
        region_lifetime_s: float,
        tuf: Callable[[], TufRepository | RelayedTuf | None],
        waves: WaveController | None,
        shared_blobs: SharedBlobs | None,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.cache = cache
        self.writer = writer
        self.blobs = blobs
        self.ca = ca
        self.regions = regions
        self.region = region  # this hub's own
        self.replica = replica  # this replica, as the store's region links name it
        self.region_lifetime = timedelta(seconds=region_lifetime_s)
        self.tuf = tuf  # the TUF metadata held now (it is replaced when it changes)
        self.waves = waves  # a root's rollouts across regions (hub.controllers.wave)
        self.shared_blobs = shared_blobs
        self.clock = clock
        self.reports = RateLimiter(REPORT_RATE)
        self._closing: set[asyncio.Task[None]] = set()  # publishers' last writes (see Federate)
        self._generations: dict[str, tuple[str, int]] = {}  # region -> (slice digest, generation)

    async def _caller(self, context: grpc.aio.ServicerContext) -> tuple[Caller, RegionState]:
        caller = await authorize(
            context, region=self.region, revoked=self.cache.revoked, roles={Role.HUB}
        )
        state = self.regions.regions.get(caller.name)
        if state is None:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED, f"region {caller.name} is not enrolled here"
            )
            raise AssertionError("unreachable")
        if caller.serial not in (state.serial, state.previous_serial):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"certificate {caller.serial} of region {caller.name} was superseded by a later "
                "enrollment",
            )
        return caller, state

    def _slice(self, region: str) -> regionslice.Slice:
        cache = self.cache
        revision_models = {
            name: [r.model for r in revisions.values()]
            for name, revisions in cache.revisions.items()
        }
        waves = self.waves  # a deployment in waves: the stable revision until released
        configs = {}  # ... and its ModelConfig (hub.decide.regionslice.configs_for)
        if waves is not None:
            for (kind, name), o in cache.stored.items():
                if kind == "ModelDeployment":
                    text = waves.config_for(region, o.manifest)
                    if text is not None:
                        configs[name] = text
        return regionslice.plan_slice(
            region,
            [
                waves.manifest_for(region, o.manifest) if waves is not None else o.manifest
                for o in cache.stored.values()
            ],
            cache.models,
            revision_models,
            cache.trust_roots,
            configs,
            root_objects=[o.manifest for o in cache.stored.values()] if waves is not None else (),
        )

    async def Federate(
        self,
        request_iterator: AsyncIterator[federation_pb2.RegionMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[federation_pb2.RootMessage]:
        it = request_iterator.__aiter__()
        # The first message is read before the caller is checked, as Sync does: a refusal sent
        # while the region is still writing its hello reaches it as gRPC's INTERNAL (its
        # client turns the failed write into that), not as the refusal it should log. The
        # caller passed mutual TLS; the read is bounded in size (the server's message limit)
        # and time.
        try:
            first: federation_pb2.RegionMessage | None = await asyncio.wait_for(
                it.__anext__(), HELLO_TIMEOUT_S
            )
        except (TimeoutError, StopAsyncIteration):
            first = None
        caller, state = await self._caller(context)
        if first is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the stream must open with hello")
            return
        if first.WhichOneof("kind") != "hello":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the first message must be hello, got {first.WhichOneof('kind')}",
            )
        if first.hello.region != caller.name:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"region {caller.name} may not speak for region {first.hello.region!r}",
            )
        if state.stream is not None:
            state.stream.set()  # a second stream replaces the first
        replaced = asyncio.Event()
        state.stream, state.stream_serial = replaced, caller.serial
        now = self.clock()
        state.connected, state.connected_at, state.last_message = True, now, now
        state.generation_applied = first.hello.generation
        state.digest_sent = ""  # the whole slice again on every connection
        state.tuf_sent = ""
        self.writer.event(
            "Region", caller.name, "Normal", "Connected", "the regional hub connected"
        )
        log.info("region connected", region=caller.name, generation=first.hello.generation)
        # the region's reports and link go to the store, for every replica (hub.state.sharedreports)
        publisher = ReportPublisher(self.store, caller.name, self.replica)
        await self._publish(publisher.open(now), caller.name)
        failure: list[tuple[grpc.StatusCode, str]] = []
        reader = asyncio.ensure_future(self._read(state, it, failure, publisher))
        waiter = asyncio.ensure_future(replaced.wait())
        woken = asyncio.Event()
        self.regions.wakers.add(woken)
        try:
            while not reader.done() and not replaced.is_set():
                try:
                    await self._publish(publisher.publish(self.clock()), caller.name)
                except sharedreports.Replaced:
                    log.info("region stream replaced on another replica", region=caller.name)
                    await context.abort(
                        grpc.StatusCode.ABORTED,
                        "replaced by a newer stream of this region (on another hub replica)",
                    )
                # TUF metadata first: a device the slice reaches finds its targets listed
                tuf = self._tuf_message(caller.name, state)
                if tuf is not None:
                    yield federation_pb2.RootMessage(tuf=tuf)
                s = self._slice(caller.name)
                if s.digest != state.digest_sent:
                    generation = await self._generation(caller.name, s.digest)
                    message = regionmapping.slice_message(s, generation)
                    size = message.ByteSize()
                    if (
                        size > regionslice.MAX_SLICE_BYTES
                        or len(s.objects) > regionslice.MAX_SLICE_OBJECTS
                    ):
                        log.error("region slice too large", region=caller.name, bytes=size)
                        self.writer.event(
                            "Region",
                            caller.name,
                            "Warning",
                            "SliceTooLarge",
                            f"the region's slice is {size} bytes and {len(s.objects)} objects "
                            f"(at most {regionslice.MAX_SLICE_BYTES} and "
                            f"{regionslice.MAX_SLICE_OBJECTS}): "
                            "not sent; the region keeps its last slice",
                        )
                    else:
                        state.artifacts = frozenset(d for m in s.models for d in m.digests())
                        yield federation_pb2.RootMessage(slice=message)
                        log.info(
                            "region slice sent",
                            region=caller.name,
                            generation=generation,
                            objects=len(s.objects),
                        )
                    state.digest_sent = s.digest
                    state.generation_sent = generation
                waking = asyncio.ensure_future(woken.wait())
                try:
                    await asyncio.wait(
                        [reader, waiter, waking],
                        timeout=SLICE_POLL_S,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    waking.cancel()
                if woken.is_set():
                    await asyncio.sleep(SLICE_GATHER_S)
                    woken.clear()
            if failure:
                await context.abort(*failure[0])
            if state.revoked:
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"certificate {caller.serial} of region {caller.name} has been revoked: "
                    "enroll the region again with a new token (hub token create --for-region)",
                )
            if replaced.is_set():
                await context.abort(
                    grpc.StatusCode.ABORTED, "replaced by a newer stream of this region"
                )
        finally:
            self.regions.wakers.discard(woken)
            reader.cancel()
            waiter.cancel()
            # not awaited here: the generator may be closing for a cancellation
            closing = asyncio.ensure_future(
                self._publish(publisher.close(self.clock()), caller.name)
            )
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            if state.stream is replaced:
                state.connected = False
                state.stream = None
                self.writer.event(
                    "Region",
                    caller.name,
                    "Warning",
                    "Disconnected",
                    "the regional hub's stream ended",
                )
                log.info("region disconnected", region=caller.name)

    @staticmethod
    async def _publish(write: Any, region: str) -> None:
        """Run a publisher's store write; a store that fails is logged (the next pass writes
        again; meanwhile the other replicas see the region's last stored report, then, past
        ``sharedreports.STALE_S``, the region as disconnected)."""
        try:
            await write
        except sharedreports.Replaced:
            raise
        except EdgefleetError as exc:
            log.warning("region report not stored", region=region, error=str(exc))

    def _tuf_message(self, region: str, state: RegionState) -> federation_pb2.TufMetadataSet | None:
        """This hub's TUF metadata when the region has not been sent it as it is now (a push,
        a new root or targets, a timestamp signed again); None otherwise."""
        tuf = self.tuf()
        if tuf is None:
            return None
        files, digest = tuf.files()
        if digest == state.tuf_sent:
            return None
        state.tuf_sent = digest
        message = tufrelay.set_message(files, digest)
        size = message.ByteSize()
        if size > tufrelay.MAX_SET_BYTES:
            log.error("region tuf metadata too large", region=region, bytes=size)
            self.writer.event(
                "Region",
                region,
                "Warning",
                "TufMetadataTooLarge",
                f"the TUF metadata is {size} bytes (at most {tufrelay.MAX_SET_BYTES}): not "
                "sent; the region keeps serving the last it received",
            )
            return None
        log.info("region tuf metadata sent", region=region, files=len(files), bytes=size)
        return message

    async def _generation(self, region: str, digest: str) -> int:
        """The generation of a slice: the same for the same content, else the store's
        revision now (it only grows, across root restarts too)."""
        known = self._generations.get(region)
        if known is not None and known[0] == digest:
            return known[1]
        revision = (await self.store.range(REGIONS)).revision
        generation = max(revision, known[1] + 1 if known else 1)
        self._generations[region] = (digest, generation)
        return generation

    async def _read(
        self,
        state: RegionState,
        it: AsyncIterator[federation_pb2.RegionMessage],
        failure: list[tuple[grpc.StatusCode, str]],
        publisher: ReportPublisher,
    ) -> None:
        async for message in it:
            now = self.clock()
            state.last_message = now
            kind = message.WhichOneof("kind")
            if kind == "applied":
                if message.applied.generation > state.generation_sent:
                    failure.append(
                        (
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"applied.generation: {message.applied.generation} was never sent",
                        )
                    )
                    return
                state.generation_applied = message.applied.generation
            elif kind == "report":
                if not self.reports.allow(state.name, time.monotonic()):
                    failure.append(
                        (
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"reports faster than {REPORT_RATE.per_second:g}/s",
                        )
                    )
                    return
                problems = regionmapping.check_report(message.report)
                if problems:
                    log.warning("region input refused", region=state.name, problems=problems[:5])
                    failure.append((grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems[:20])))
                    return
                state.report, state.reported_at = message.report, now
                publisher.received(message.report, now)
            else:
                failure.append(
                    (grpc.StatusCode.INVALID_ARGUMENT, f"unexpected {kind} on an open stream")
                )
                return

    async def RenewFederationCertificate(
        self,
        request: federation_pb2.RenewFederationCertificateRequest,
        context: grpc.aio.ServicerContext,
    ) -> federation_pb2.RenewFederationCertificateResponse:
        caller, state = await self._caller(context)  # enrolled, not revoked, current
        if len(request.csr_pem) > 16 * 1024:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "csr_pem: at most 16 KiB")
        identity = pki.Identity(Role.HUB, caller.name, self.region)  # the caller's own, only
        try:
            certificate = pki.sign_child_hub_csr(
                self.ca, request.csr_pem, identity, lifetime=self.region_lifetime
            )
        except (CsrRejected, PkiError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"csr_pem: {exc}")
            raise AssertionError("unreachable") from None
        serial = format(certificate.serial_number, "x")
        not_after = certificate.not_valid_after_utc.timestamp()
        renewed = RegionState(caller.name, serial, state.enrolled_at, caller.serial, not_after)
        key = region_key(caller.name)
        kv = await self.store.get(key)
        current = storekeys.loads(kv.value) if kv is not None else {}
        if kv is None or current.get("revoked") or current.get("certificateSerial") != state.serial:
            await context.abort(
                grpc.StatusCode.ABORTED,
                f"region {caller.name} was enrolled again or revoked meanwhile",
            )
            raise AssertionError("unreachable")
        event = self.writer.prepare_event(
            "Region",
            caller.name,
            "Normal",
            "CertificateRenewed",
            f"federation certificate {serial} issued; {caller.serial} is accepted until the "
            "region renews again",
        )
        try:
            await self.store.txn(
                [Compare(key, kv.mod_revision)],
                [Put(key, storekeys.dumps(renewed.to_json())), event.put],
            )
        except CompareFailed:
            await context.abort(
                grpc.StatusCode.ABORTED, f"region {caller.name} changed meanwhile; ask again"
            )
        self.writer.committed(event)
        if self.regions.regions.get(caller.name) is state and not state.revoked:
            state.serial, state.previous_serial = serial, caller.serial
            state.not_after = not_after
        log.info("region certificate renewed", region=caller.name, serial=serial)
        return federation_pb2.RenewFederationCertificateResponse(
            certificate_chain_pem=pki.certificate_pem(certificate)
        )

    async def FetchFederatedArtifact(
        self,
        request: federation_pb2.FetchFederatedArtifactRequest,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[federation_pb2.FederatedChunk]:
        caller, state = await self._caller(context)
        if request.sha256 not in state.artifacts:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"artifact {request.sha256[:16]} is not in region {caller.name}'s slice",
            )
        async for offset, data in blob_chunks(
            self.blobs, self.shared_blobs, request.sha256, request.offset, context
        ):
            yield federation_pb2.FederatedChunk(offset=offset, data=data)

    async def FetchFederatedAgentRelease(
        self,
        request: federation_pb2.FetchFederatedAgentReleaseRequest,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[federation_pb2.FederatedAgentReleasePart]:
        """Every release of the version the root holds (at most 16), each as its record then
        its bytes. Any enrolled region may have them: releases are not secret (a region and its
        devices check each against the TUF agent delegation), as FetchArtifact serves them to
        any enrolled device."""
        caller, _ = await self._caller(context)
        version = request.version
        if not version or len(version) > 128:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "version: 1 to 128 characters")
        if len(request.held_sha256) > MAX_FEDERATED_AGENT_RELEASES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"held_sha256: at most {MAX_FEDERATED_AGENT_RELEASES}",
            )
        held = [r for r in await agent_releases(self.store) if r.version == version]
        if not held:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"the root hub holds no release of edged {version}: push it at the root hub",
            )
        has = set(request.held_sha256)
        held = [r for r in held if r.sha256 not in has]
        if held:
            log.info("agent release sent to a region", region=caller.name, version=version)
        for r in sorted(held, key=lambda r: r.key)[:MAX_FEDERATED_AGENT_RELEASES]:
            yield federation_pb2.FederatedAgentReleasePart(
                release=federation_pb2.FederatedAgentRelease(
                    version=r.version,
                    arch=r.arch,
                    python_abi=r.python_abi,
                    sha256=r.sha256,
                    length=r.length,
                    envelope=r.envelope,
                )
            )
            async for _, data in blob_chunks(self.blobs, self.shared_blobs, r.sha256, 0, context):
                yield federation_pb2.FederatedAgentReleasePart(data=data)
