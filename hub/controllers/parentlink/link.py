"""A regional hub's link to its root (docs/federation.md).

:class:`ParentLink` (component ``federation``, run by ``hub serve`` when ``D/parent.json``
exists, written by :mod:`hub.controllers.parentlink.regionenrollment`): one Federate stream to
the root, reconnected with full-jitter backoff; with several addresses it sticks to the one
that works and, when a session fails, dials the next (:mod:`edgefleet.failover`, as edged's hub
link does: the backoff grows once per round of every address). Every root replica shares the
root's CA, so the same pinned CA and certificate work at each. Each slice is applied whole
(:func:`hub.controllers.parentlink.sliceapply.plan_apply` over
:func:`hub.decide.regionslice.plan_apply`, pure): artifacts the region lacks are fetched from
the root first and stored only if their bytes have the signed digest and length; then every
object and model record the slice adds, changes or drops is written in **one** transaction with
``/federation/state`` (generation, digest); a slice older than the one applied is ignored, so
the root's state wins by generation. Objects written so carry ``"federated": {"generation":
G}``: AdminService refuses to apply or delete them at the region (FAILED_PRECONDITION, "owned
by the root hub"). The region's own controllers (scheduler, rollouts, projector) then act on
them as on any object; with the root away the region keeps enforcing the last slice. Status
(:mod:`hub.controllers.parentlink.regionreport`) goes up every ``REPORT_PERIOD_S`` when it
changed, and at least every ``REPORT_EVERY_S``; every new stream resends it. The root's TUF
metadata on the stream is checked and served by :mod:`hub.controllers.parentlink.tufadoption`.
The edged releases the slice names are fetched, checked as a push checks them, while the
stream is up (:mod:`hub.controllers.parentlink.agentrelay`).

Signed bytes are relayed as they came: model envelopes and rollback allowances go into the
region's model records unchanged, so devices verify the publisher's signature, never the
region's; a region that changes an artifact or its metadata is refused by its own devices.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import orjson
from cryptography.hazmat.primitives import serialization

from edgefleet.artifacts.storing import ArtifactStore, PinnedDigest
from edgefleet.backoff import Backoff, Jitter
from edgefleet.errors import ArtifactError, EdgefleetError, StoreError
from edgefleet.failover import Rotation, round_delay
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic
from edgefleet.supervising import wait_for_stop
from edgefleet.v1 import federation_pb2, federation_pb2_grpc
from hub import pki
from hub.controllers.parentlink.agentrelay import AgentReleaseRelay
from hub.controllers.parentlink.regionenrollment import (
    FEDERATION_CERT_FILE,
    PARENT_FILE,
    FederationError,
    ParentFiles,
    make_csr,
    renewal_due,
)
from hub.controllers.parentlink.regionreport import build_report
from hub.controllers.parentlink.sliceapply import (
    MAX_ARTIFACT_BYTES,
    STATE_KEY,
    check_slice,
    model_from,
    plan_apply,
)
from hub.controllers.parentlink.tufadoption import TufAdoption
from hub.controllers.rollout import RolloutController
from hub.decide.regionslice import StoredValue
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.heldtuf import HeldTuf
from hub.state.sharedblobs import SharedBlobs
from hub.state.sharedtuf import SharedRelay
from hub.state.store import Store
from hub.state.trustroots import ROOT_FILE
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

REPORT_PERIOD_S = 1.0
REPORT_EVERY_S = 30.0
REPORT_CPU_FACTOR = 10.0
RECONNECT = Backoff(0.5, 30.0, Jitter.FULL)
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    ("grpc.max_send_message_length", 4 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # gRPC times a keepalive ping out by this (default 60 s), not by keepalive_timeout_ms: without
    # it a region whose packets to its root were dropped noticed after 20 + 60 s where its socket's
    # TCP_USER_TIMEOUT did not end it first (tests/soak/test_soak_root_link.py)
    ("grpc.http2.ping_timeout_ms", 10_000),
]


Outbox = asyncio.Queue[federation_pb2.RegionMessage | None]
"""What a regional hub sends its root on the open stream; None ends it."""


class ParentLink:
    """The component that keeps this regional hub federated with its root (module doc)."""

    name = "federation"

    def __init__(
        self,
        files: ParentFiles,
        *,
        data_dir: Path,
        store: Store,
        cache: Cache,
        writer: DeviceWriter,
        blobs: ArtifactStore,
        tuf: HeldTuf,
        region: str,
        rollouts: RolloutController | None = None,
        tuf_relay_shared: SharedRelay | None = None,
        shared_blobs: SharedBlobs | None = None,
        clock: Callable[[], float] = time.time,
        on_agent_release: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``data_dir``: the hub's (its parent files, the relayed TUF set, the trust root a
        slice rotates); ``tuf``: what this region serves, replaced by the root's set;
        ``rollouts``: the status reported up is what ``edgectl get`` shows here (its canary
        analysis); ``tuf_relay_shared``, ``shared_blobs``: at a region's replicas;
        ``on_agent_release``: called when an edged release fetched from the root was stored."""
        self._data_dir = data_dir
        self._store = store
        self._cache = cache
        self._writer = writer
        self._blobs = blobs
        self._region = region
        self._rollouts = rollouts
        self._tuf_adoption = TufAdoption(
            data_dir=data_dir, cache=cache, writer=writer, tuf=tuf, shared=tuf_relay_shared
        )
        self._shared_blobs = shared_blobs
        self._clock = clock
        self.relay = AgentReleaseRelay(
            store=store,
            blobs=blobs,
            tuf=tuf,
            data_dir=data_dir,
            writer=writer,
            shared_blobs=shared_blobs,
            clock=clock,
            on_stored=on_agent_release,
        )
        self.files = files
        self.connected = False
        self.generation = 0
        self.digest = ""
        self.slices_applied = 0
        self.renewed_at: float | None = None
        self._failures = 0
        self._rng = random.Random()
        self._rotation = Rotation(files.addresses)  # the root's replicas (edgefleet.failover)
        self._parent_stamp = self._stamp()

    @property
    def parent(self) -> str:
        """The root's address (replica) the link dials now."""
        return self._rotation.current

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = (self._data_dir / PARENT_FILE).stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _reload_addresses(self) -> None:
        """``hub parent set-addresses`` changed ``D/parent.json``: dial the new list from
        the next connection (a file that does not read keeps the old list, logged)."""
        stamp = self._stamp()
        if stamp is None or stamp == self._parent_stamp:
            return
        self._parent_stamp = stamp
        try:
            _, _, _, parents = ParentFiles.read_addresses(self._data_dir)
        except FederationError as exc:
            log.error("root hub addresses not reloaded", error=str(exc))
            return
        if parents != self._rotation.addresses:
            self._rotation.replace(parents)
            self.files = dataclasses.replace(
                self.files, parent=parents[0], parents=parents if len(parents) > 1 else ()
            )
            log.info("root hub addresses reloaded", parents=list(parents), next=self.parent)

    async def run(self, stop: asyncio.Event) -> None:
        renewer = asyncio.ensure_future(self._renew_loop(stop))
        try:
            await self._run(stop)
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer

    # -- renewing the federation certificate ---------------------------------------------------
    def renewal_due(self) -> float:
        path = self._data_dir / FEDERATION_CERT_FILE
        received = min(path.stat().st_mtime, time.time())
        return renewal_due(self.files.certificate, received, self._rng.uniform(0.7, 0.9))

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
            except (grpc.aio.AioRpcError, OSError, ValueError, EdgefleetError) as exc:
                attempt += 1
                error = (
                    f"{exc.code().name}: {exc.details()}"
                    if isinstance(exc, grpc.aio.AioRpcError)
                    else str(exc)
                )
                log.warning("federation certificate renewal failed", error=error)
                due = time.time() + RECONNECT.delay(attempt, self._rng) + 1.0

    async def renew(self) -> None:
        """Ask the root for a new certificate (the same key) and write it atomically; the
        next connection uses it (the open one goes on with the certificate it was made with,
        which the root accepts until this region renews again)."""
        key = serialization.load_pem_private_key(self.files.key, password=None)
        request = federation_pb2.RenewFederationCertificateRequest(
            csr_pem=make_csr(key, self.files.region)
        )
        async with self._channel() as channel:
            stub = federation_pb2_grpc.FederationServiceStub(channel)  # type: ignore[no-untyped-call]
            resp = await stub.RenewFederationCertificate(request, timeout=30)
        certificate = bytes(resp.certificate_chain_pem)
        identity = pki.identity_from_certificate(pki.load_certificate(certificate))
        if (identity.role, identity.name) != (pki.Role.HUB, self.files.region):
            raise FederationError(
                f"the root sent a certificate for {identity.role.value} {identity.name}, not "
                f"for hub {self.files.region}: not written"
            )
        write_atomic(self._data_dir / FEDERATION_CERT_FILE, certificate, mode=0o644)
        self.files = dataclasses.replace(self.files, certificate=certificate)
        self.renewed_at = time.time()
        log.info("federation certificate renewed", region=self.files.region)

    async def _run(self, stop: asyncio.Event) -> None:
        kv = await self._store.get(STATE_KEY)
        if kv is not None:
            state = storekeys.loads(kv.value)
            self.generation, self.digest = int(state["generation"]), str(state["digest"])
        while not stop.is_set():
            started = time.monotonic()
            self._reload_addresses()
            try:
                await self._session(stop)
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "parent link lost",
                    code=exc.code().name,
                    error=exc.details(),
                    parent=self.parent,
                )
            except (StoreError, FederationError, ArtifactError, OSError) as exc:
                log.warning("parent link failed", error=str(exc), parent=self.parent)
            finally:
                self.connected = False
            if stop.is_set():
                break
            if time.monotonic() - started > 30:
                self._failures = 0
            count = len(self._rotation.addresses)
            if count > 1:  # the next replica of the root; the backoff grows once per round
                log.info("parent link moving on", failed=self.parent, next=self._rotation.advance())
            delay = round_delay(RECONNECT, self._failures, count, self._rng)
            self._failures += 1
            await wait_for_stop(stop, delay)

    def _channel(self) -> grpc.aio.Channel:
        creds = grpc.ssl_channel_credentials(self.files.ca, self.files.key, self.files.certificate)
        return grpc.aio.secure_channel(self.parent, creds, options=CHANNEL_OPTIONS)

    async def _session(self, stop: asyncio.Event) -> None:
        async with self._channel() as channel:
            stub = federation_pb2_grpc.FederationServiceStub(channel)  # type: ignore[no-untyped-call]
            # None ends the stream's request iterator (else grpc's task consuming it would wait
            # on this queue forever after the call ended: one task leaked per reconnection)
            outbox: Outbox = asyncio.Queue(maxsize=16)
            await outbox.put(
                federation_pb2.RegionMessage(
                    hello=federation_pb2.RegionHello(
                        region=self.files.region, generation=self.generation
                    )
                )
            )

            async def outgoing() -> AsyncIterator[federation_pb2.RegionMessage]:
                while (message := await outbox.get()) is not None:
                    yield message

            call = stub.Federate(outgoing())
            reporter = asyncio.ensure_future(self._report(outbox))
            relayer = asyncio.ensure_future(self.relay.run(stub))  # while the stream is up
            stopper = asyncio.ensure_future(stop.wait())
            try:
                reader = asyncio.ensure_future(self._receive(call, stub, outbox))
                done, _ = await asyncio.wait([reader, stopper], return_when=asyncio.FIRST_COMPLETED)
                if reader in done:
                    reader.result()
                else:
                    reader.cancel()
                    call.cancel()
            finally:
                reporter.cancel()
                relayer.cancel()
                stopper.cancel()
                while not outbox.empty():
                    outbox.get_nowait()
                outbox.put_nowait(None)

    async def _receive(
        self,
        call: Any,
        stub: Any,
        outbox: Outbox,
    ) -> None:
        async for message in call:
            if not self.connected:
                log.info("parent link up", parent=self.parent)
            self.connected = True
            self._failures = 0
            if message.WhichOneof("kind") == "tuf":
                await self._tuf_adoption.adopt(message.tuf)
                continue
            if message.WhichOneof("kind") != "slice":
                continue
            s = message.slice
            if s.generation < self.generation:
                log.warning("stale slice ignored", generation=s.generation, applied=self.generation)
                continue
            if s.generation == self.generation and s.digest == self.digest:
                self.relay.want(list(s.agent_release_versions))
                await outbox.put(
                    federation_pb2.RegionMessage(
                        applied=federation_pb2.SliceApplied(generation=s.generation)
                    )
                )
                continue
            problems = check_slice(s)
            if problems:
                log.error("slice refused", generation=s.generation, problems=problems[:5])
                self._writer.event(
                    "Region", self.files.region, "Warning", "SliceRefused", "; ".join(problems[:5])
                )
                continue
            await self._apply(s, stub)
            self.relay.want(list(s.agent_release_versions))
            await outbox.put(
                federation_pb2.RegionMessage(
                    applied=federation_pb2.SliceApplied(generation=s.generation)
                )
            )
        raise FederationError("the parent ended the stream")

    async def _fetch(self, stub: Any, sha256: str, length: int, name: str, version: str) -> None:
        """One artifact from the root into the blob store, kept only with its signed digest;
        at a region's replicas also into the store they share (:meth:`_share`)."""
        blobs = self._blobs
        if blobs.has(sha256):
            await self._share(sha256, name, version)
            return
        fd, tmp = tempfile.mkstemp(dir=self._data_dir, prefix=".fetch-")
        try:
            with os.fdopen(fd, "wb") as f:
                got = 0
                async for chunk in stub.FetchFederatedArtifact(
                    federation_pb2.FetchFederatedArtifactRequest(sha256=sha256, offset=0)
                ):
                    got += len(chunk.data)
                    if got > length:
                        raise ArtifactError(
                            "LengthExceeded",
                            f"{name} {version}: more than the signed {length} bytes",
                        )
                    f.write(chunk.data)
            await asyncio.to_thread(
                blobs.ingest_file,
                Path(tmp),
                name=name,
                version=version,
                verifiers=[PinnedDigest(sha256)],
                max_bytes=length,
            )
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        await self._share(sha256, name, version)

    async def _share(self, sha256: str, name: str, version: str) -> None:
        """At a region of several replicas, write the root's artifact into their store as a
        push does (hub.state.sharedblobs): a device connected to another replica than the one
        that fetched it downloads it there (it was answered that the artifact is not stored,
        and never ran the deployment). One too large to share stays on this replica alone,
        said in a Warning event."""
        if self._shared_blobs is None:
            return
        try:
            await self._shared_blobs.publish(sha256)
        except ArtifactError as exc:
            if exc.reason != "SharedArtifactTooLarge":
                raise
            log.warning("artifact not shared", model=name, version=version, error=str(exc))
            self._writer.event(
                storekeys.KIND_MODEL, f"{name}-{version}", "Warning", exc.reason,
                f"{name} {version} is served by this replica only: {exc}",
            )  # fmt: skip

    async def _apply(self, s: federation_pb2.RegionSlice, stub: Any) -> None:
        store, cache, writer = self._store, self._cache, self._writer
        models = [model_from(m) for m in s.models]
        for record in models:
            await self._fetch(stub, record.sha256, record.length, record.name, record.version)
            for fname, digest in record.extras.items():
                await self._fetch(
                    stub, digest, MAX_ARTIFACT_BYTES, record.name, f"{record.version}/{fname}"
                )
        objects = [orjson.loads(raw) for raw in s.objects]
        stored_objects = {
            kv.key: StoredValue(kv.key, kv.value, kv.mod_revision)
            for kv in (await store.range(storekeys.OBJECTS)).kvs
        }
        stored_models = {
            kv.key: StoredValue(kv.key, kv.value, kv.mod_revision)
            for kv in (await store.range(storekeys.MODELS)).kvs
        }
        kept = {r.model for revisions in cache.revisions.values() for r in revisions.values()}
        plan = plan_apply(
            s.generation,
            s.digest,
            objects,
            models,
            stored_objects,
            stored_models,
            self._clock(),
            kept,
        )
        changed = [(str(o["kind"]), str(o["metadata"]["name"])) for o in plan.put_objects]
        events = [
            writer.prepare_event(
                kind,
                name,
                "Normal",
                "Federated",
                f"{kind} {name} from the root, generation {s.generation}",
            )
            for kind, name in [*changed, *plan.dropped_objects]
        ] + [
            writer.prepare_event(
                storekeys.KIND_MODEL,
                f"{name}-{version}",
                "Normal",
                "Federated",
                f"model {name} {version} removed: the root no longer sends it and nothing in "
                "this region refers to it",
            )
            for name, version in plan.dropped_models
        ]
        revision = await store.txn(plan.compares, [*plan.ops, *(e.put for e in events)])
        for manifest in plan.put_objects:
            cache.put_object(manifest, revision)
        for kind, name in plan.dropped_objects:
            cache.drop_object(kind, name)
        for record in plan.put_models:
            cache.put_model(record)
        for name, version in plan.dropped_models:
            gone = cache.drop_model(name, version)
            if gone is not None and self._shared_blobs is not None:  # as a delete at a hub does
                still = {d for m in cache.models.values() for d in m.digests()}
                for digest in gone.digests() - still:
                    await self._shared_blobs.forget(digest)
        for e in events:
            writer.committed(e)
        self.generation, self.digest = s.generation, s.digest
        self.slices_applied += 1
        current = cache.trust_roots[-1] if cache.trust_roots else b""
        if s.trust_roots and bytes(s.trust_roots[-1]) != current:
            # a rotation at the root: the trust-roots watcher checks that the new root follows
            # the current one, then carries it to this region's devices
            write_atomic(self._data_dir / ROOT_FILE, bytes(s.trust_roots[-1]), mode=0o644)
        # the rollout controller and the projector react to what changed (hub.state.feed)
        log.info(
            "slice applied",
            generation=s.generation,
            changed=len(changed),
            dropped=len(plan.dropped_objects),
            models=len(plan.put_models),
            models_removed=len(plan.dropped_models),
        )

    async def _report(self, outbox: Outbox) -> None:
        last = b""
        sent_at = 0.0
        while True:
            began = time.process_time()
            try:
                report = build_report(
                    self._cache,
                    self.generation,
                    region=self._region,
                    rollouts=self._rollouts,
                    agent_release_refusals=self.relay.refusals(),
                )
            except Exception as exc:  # a bug must not end the reports silently (the task's)
                log.error("region report failed", error=repr(exc))
                await asyncio.sleep(REPORT_EVERY_S)
                continue
            encoded = report.SerializeToString(deterministic=True)
            took = time.process_time() - began
            now = time.monotonic()
            if encoded != last or now - sent_at >= REPORT_EVERY_S:
                await outbox.put(federation_pb2.RegionMessage(report=report))
                last, sent_at = encoded, now
            # a report that cost T seconds of CPU waits 10 T before the next: at most a tenth
            # of a core for reports, whatever the region's size (the dashboard's rule)
            await asyncio.sleep(max(REPORT_PERIOD_S, REPORT_CPU_FACTOR * took))
