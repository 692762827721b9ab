"""A regional hub's side of federation (docs/federation.md).

* :func:`enroll_with_parent` (``hub init --parent HOST:PORT[,HOST:PORT...] --token T
  --parent-ca-hash PIN --region R``): the token-and-pin flow devices use, at each of the
  root's addresses (its replicas) in turn until one answers. The root's enrollment port is
  read over TLS without verification to get the chain it presents, whose CA must match the
  pin; then, over TLS to that CA, ``EnrollHub(token, CSR, region)``. Written (0600 keys,
  atomically): ``D/parent.json`` (the root's addresses, its region;
  :func:`set_parent_addresses` changes the addresses later), ``D/parent-ca.crt``,
  ``D/federation.{crt,key}`` (the hub-role client certificate) and the fleet's trust roots as
  the root sent them (``D/trust-root.json``, ``D/trust-roots/``): the region carries the
  fleet's roots to its devices; it has no root or publisher key of its own.
* :class:`ParentLink` (component ``federation``, run by ``hub serve`` when ``D/parent.json``
  exists): one Federate stream to the root, reconnected with full-jitter backoff; with
  several addresses it sticks to the one that works and, when a session fails, dials the
  next (:mod:`edgefleet.failover`, as edged's hub link does: the backoff grows once per
  round of every address). Every root replica shares the root's CA, so the same pinned CA
  and certificate work at each. Each slice is applied whole
  (:func:`hub.decide.regionslice.plan_apply`, pure): artifacts the region lacks are fetched from
  the root first and stored only if their bytes have the signed digest and length; then every
  object and model record the slice adds, changes or drops is written in **one** transaction
  with ``/federation/state`` (generation, digest); a slice older than the one applied is
  ignored, so the root's state wins by generation. Objects written so carry
  ``"federated": {"generation": G}``: AdminService refuses to apply or delete them at the
  region (FAILED_PRECONDITION, "owned by the root hub"). The region's own controllers
  (scheduler, rollouts, projector) then act on them as on any object; with the root away the
  region keeps enforcing the last slice. Status goes up every ``REPORT_PERIOD_S`` when it
  changed, and at least every ``REPORT_EVERY_S``; every new stream resends it.

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
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from edgefleet import pinning
from edgefleet.api import parse_manifest
from edgefleet.artifacts.storing import ArtifactStore, PinnedDigest
from edgefleet.backoff import Backoff, Jitter
from edgefleet.configfiles import parse_host_port
from edgefleet.errors import ArtifactError, EdgefleetError, StoreError, TrustError
from edgefleet.failover import Rotation, address_list, round_delay, split_addresses
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic
from edgefleet.pinning import parse_pin
from edgefleet.supervising import wait_for_stop
from edgefleet.trust.documents import Root, parse_root
from edgefleet.trust.envelopes import ROOT_TYPE, decode_payload, parse_envelope_bytes
from edgefleet.v1 import federation_pb2, federation_pb2_grpc
from hub import pki
from hub.controllers.objectstatus import shown_object
from hub.controllers.rollout import RolloutController, targeted
from hub.decide import regionslice
from hub.decide.regionslice import StoredValue
from hub.decide.rollout import Revision
from hub.decide.status import revisions_of, wanted_revision
from hub.initializing import HubPaths
from hub.state import storekeys, tufrelay
from hub.state.cache import Cache
from hub.state.heldtuf import HeldTuf
from hub.state.sharedblobs import SharedBlobs
from hub.state.sharedtuf import SharedRelay
from hub.state.store import Compare, Delete, Op, Put, Store
from hub.state.trustroots import HISTORY_DIR, ROOT_FILE
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

PARENT_FILE = "parent.json"
PARENT_CA_FILE = "parent-ca.crt"
FEDERATION_CERT_FILE = "federation.crt"
FEDERATION_KEY_FILE = "federation.key"
STATE_KEY = "/federation/state"
REPORT_PERIOD_S = 1.0
REPORT_EVERY_S = 30.0
REPORT_CPU_FACTOR = 10.0
RECONNECT = Backoff(0.5, 30.0, Jitter.FULL)
MAX_ARTIFACT_BYTES = 16 * 2**30
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    ("grpc.max_send_message_length", 4 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


Outbox = asyncio.Queue[federation_pb2.RegionMessage | None]
"""What a regional hub sends its root on the open stream; None ends it."""


class FederationError(EdgefleetError):
    """Enrolling with a parent hub failed, or the parent's answer is unusable."""


def fleet_root_of(signed: bytes) -> Root | None:
    """The fleet trust root this hub holds, parsed (None: it holds none)."""
    if not signed:
        return None
    env = parse_envelope_bytes(signed, what="the fleet trust root")
    return parse_root(decode_payload(env, expected_type=ROOT_TYPE, what="the fleet trust root"))


# -- enrollment -----------------------------------------------------------------------------


def _presented_chain(host: str, port: int, timeout: float = 10.0) -> list[bytes]:
    try:
        return pinning.fetch_presented_chain(host, port, timeout=timeout)
    except OSError as exc:
        raise FederationError(
            f"cannot reach the parent's enrollment port {host}:{port}: {exc}"
        ) from None


def _pinned_ca(chain: list[bytes], pin: str) -> bytes:
    try:
        expected = parse_pin(pin)
    except EdgefleetError:
        raise FederationError(
            f"--parent-ca-hash must look like sha256:<64 hex digits>, got {pin!r}"
        ) from None
    found = pinning.find_pinned(chain, expected)
    if found is None:
        raise FederationError(
            "the parent presented no CA certificate matching --parent-ca-hash: wrong hub, or a "
            "machine in the middle"
        )
    return found


def parent_addresses(parent: str | Sequence[str]) -> list[str]:
    """The root's addresses from ``hub init --parent A,B`` (or a list): each HOST:PORT, in
    order, each once, 1 to :data:`~edgefleet.failover.MAX_ADDRESSES`; FederationError naming
    what is wrong."""
    try:
        if isinstance(parent, str):
            return split_addresses(parent, what="parent")
        got = address_list(list(parent), what="parent")
    except ValueError as exc:
        raise FederationError(f"--parent: {exc}") from None
    if not got:
        raise FederationError("--parent: at least one HOST:PORT of the root hub")
    return got


_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class _Unreachable(FederationError):
    """This address of the root did not answer: the next one may (nothing was sent)."""


async def enroll_with_parent(
    paths: HubPaths, *, parent: str | Sequence[str], token: str, ca_hash: str, region: str
) -> None:
    """Enroll this (new) hub with its parent (module doc); writes nothing when it fails.
    ``parent``: the root's address, or several (its replicas, ``A,B``): tried in turn while
    one does not answer; a refusal or a CA that does not match the pin ends it at once. The
    address that enrolled goes first in ``D/parent.json``, the others after it in order, then
    the root's replicas its answer names (``hub_addresses``) that were not given."""
    addresses = parent_addresses(parent)
    problems: list[str] = []
    for address in addresses:
        try:
            resp, key = await _enroll_at(address, token=token, ca_hash=ca_hash, region=region)
        except _Unreachable as exc:
            problems.append(str(exc))
            log.warning("root hub address unreachable", parent=address, error=str(exc))
            continue
        break
    else:
        raise FederationError("no address of the root hub answered: " + "; ".join(problems))
    d = paths.data_dir
    roots = list(resp.trust_roots)
    write_atomic(d / PARENT_CA_FILE, bytes(resp.ca_certificate_pem), mode=0o644)
    write_atomic(d / FEDERATION_CERT_FILE, bytes(resp.certificate_chain_pem), mode=0o644)
    pki.write_private_key(d / FEDERATION_KEY_FILE, key)
    if roots:
        _write_roots(d, roots)
    ordered = [address, *(a for a in addresses if a != address)]
    try:  # the root's replicas, after the addresses given here (as a device's enrollment)
        ordered = address_list(ordered, list(resp.hub_addresses), what="parent")
    except ValueError as exc:
        log.warning("root replica addresses ignored", error=str(exc))
    write_atomic(
        d / PARENT_FILE, orjson.dumps(parent_doc(ordered, region, resp.root_region)), mode=0o600
    )
    log.info("hub enrolled with parent", parent=address, region=region, root=resp.root_region)


def parent_doc(addresses: Sequence[str], region: str, root_region: str) -> dict[str, Any]:
    """``D/parent.json``: ``parent`` the first address (what a hub before lists of addresses
    reads), ``parents`` every address when there are several."""
    doc: dict[str, Any] = {"parent": addresses[0], "region": region, "rootRegion": root_region}
    if len(addresses) > 1:
        doc["parents"] = list(addresses)
    return doc


async def _enroll_at(
    address: str, *, token: str, ca_hash: str, region: str
) -> tuple[federation_pb2.EnrollHubResponse, Any]:
    host, port = parse_host_port(address)
    eport = port + 1
    try:
        chain = await asyncio.to_thread(_presented_chain, host, eport)
    except FederationError as exc:
        raise _Unreachable(str(exc)) from None
    ca_pem = _pinned_ca(chain, ca_hash)
    key = pki.generate_key()
    request = federation_pb2.EnrollHubRequest(token=token, csr_pem=_csr(key, region), region=region)
    creds = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    async with grpc.aio.secure_channel(f"{host}:{eport}", creds) as channel:
        stub = federation_pb2_grpc.HubEnrollmentServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            resp = await stub.EnrollHub(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _UNREACHABLE:
                raise _Unreachable(f"{host}:{eport}: {exc.code().name}: {exc.details()}") from None
            raise FederationError(
                f"the parent refused enrollment: {exc.code().name}: {exc.details()}"
            ) from None
    return resp, key


def set_parent_addresses(data_dir: Path, addresses: str | Sequence[str]) -> list[str]:
    """``hub parent set-addresses``: replace the root's addresses in ``D/parent.json``
    (validated; atomically; the region and its certificate unchanged). A running hub's link
    reads the file again before each connection; the addresses written are returned."""
    path = data_dir / PARENT_FILE
    if not path.exists():
        raise FederationError(
            f"{data_dir} is not a regional hub (no {PARENT_FILE}): enroll it with hub init --parent"
        )
    got = parent_addresses(addresses)
    _, region, root_region, _ = ParentFiles.read_addresses(data_dir)
    doc = parent_doc(got, region, root_region)
    write_atomic(path, orjson.dumps(doc), mode=0o600)
    log.info("root hub addresses set", parents=got)
    return got


def _csr(key: Any, region: str) -> bytes:
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, region)]))
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )


def renewal_due(certificate_pem: bytes, received: float, fraction: float) -> float:
    """Wall-clock time to renew a federation certificate (pure): ``fraction`` (0.7-0.9,
    jittered by the caller) into its life, which starts when the region received it unless
    ``notBefore`` is later (the root backdates it a little for clock skew, which is not life
    used), as a device's renewal is timed."""
    cert = x509.load_pem_x509_certificate(certificate_pem)
    start = max(cert.not_valid_before_utc.timestamp(), received)
    end = cert.not_valid_after_utc.timestamp()
    return start + max(end - start, 0.0) * fraction


def _write_roots(data_dir: Path, roots: Sequence[bytes]) -> None:
    """The fleet's roots as the root sent them: the newest as the current one, the others as
    history (what :func:`hub.state.trustroots.load_roots` reads)."""
    if len(roots) > 1:
        history = data_dir / HISTORY_DIR
        history.mkdir(mode=0o700, exist_ok=True)
        for i, raw in enumerate(roots[:-1]):
            version = orjson.loads(_payload(raw)).get("version", i + 1)
            write_atomic(history / f"{int(version)}.json", raw, mode=0o644)
    write_atomic(data_dir / ROOT_FILE, roots[-1], mode=0o644)


def _payload(envelope: bytes) -> bytes:
    import base64

    return base64.b64decode(orjson.loads(envelope)["payload"])


# -- applying a slice (decided in hub.decide.regionslice) ------------------------------------


@dataclass(frozen=True, slots=True)
class ApplyPlan:
    """One transaction that makes the region's store hold the slice."""

    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]
    put_objects: tuple[Mapping[str, Any], ...]
    dropped_objects: tuple[tuple[str, str], ...]
    put_models: tuple[storekeys.ModelRecord, ...]
    dropped_models: tuple[tuple[str, str], ...] = ()  # root-owned models no longer used


def model_from(m: federation_pb2.FederatedModel) -> storekeys.ModelRecord:
    return storekeys.ModelRecord(
        name=m.name,
        version=m.version,
        sha256=m.sha256,
        length=m.length,
        envelope=bytes(m.envelope),
        pushed_at=m.pushed_at,
        extras=dict(m.extras),
        rollback_allowance=bytes(m.rollback_allowance),
    )


def plan_apply(
    generation: int,
    digest: str,
    objects: Sequence[Mapping[str, Any]],
    models: Sequence[storekeys.ModelRecord],
    stored_objects: Mapping[str, StoredValue],
    stored_models: Mapping[str, StoredValue],
    now: float,
    kept: Collection[tuple[str, str]] = frozenset(),
) -> ApplyPlan:
    """:func:`hub.decide.regionslice.plan_apply` (pure: what the slice adds, changes and
    drops) as the store's transaction, ``/federation/state`` last."""
    plan = regionslice.plan_apply(
        generation, digest, objects, models, stored_objects, stored_models, now, kept
    )
    return ApplyPlan(
        tuple(Compare(w.key, w.expected) for w in plan.writes),
        (
            *(Put(w.key, w.value) if w.value is not None else Delete(w.key) for w in plan.writes),
            Put(STATE_KEY, plan.state),
        ),
        plan.put_objects,
        plan.dropped_objects,
        plan.put_models,
        plan.dropped_models,
    )


def check_slice(message: federation_pb2.RegionSlice) -> list[str]:
    """Problems of a slice from the root (bounded and well-formed; every object parses)."""
    problems: list[str] = []
    if len(message.objects) > regionslice.MAX_SLICE_OBJECTS:
        problems.append(f"slice.objects: at most {regionslice.MAX_SLICE_OBJECTS}")
        return problems
    for i, raw in enumerate(message.objects):
        try:
            doc = orjson.loads(raw)
            if doc.get("kind") not in regionslice.FEDERATED_KINDS:
                problems.append(f"slice.objects[{i}].kind: {doc.get('kind')!r} is not federated")
                continue
            if doc["kind"] == "ModelDeployment":
                parse_manifest(dict(doc))
        except Exception as exc:  # a manifest the region cannot take
            problems.append(f"slice.objects[{i}]: {exc}")
    for i, m in enumerate(message.models):
        if len(m.sha256) != 64 or m.length > MAX_ARTIFACT_BYTES:
            problems.append(f"slice.models[{i}]: bad sha256 or length")
    return problems


# -- the link ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParentFiles:
    parent: str
    region: str
    root_region: str
    ca: bytes
    certificate: bytes
    key: bytes
    parents: tuple[str, ...] = ()
    """Every address of the root (its replicas), ``parent`` first; empty: ``parent`` alone."""

    @property
    def addresses(self) -> tuple[str, ...]:
        return self.parents or (self.parent,)

    @staticmethod
    def read_addresses(data_dir: Path) -> tuple[str, str, str, tuple[str, ...]]:
        """(first address, region, root region, every address) from ``D/parent.json`` (one
        address in files written before lists: ``parent`` alone); FederationError naming
        what is wrong."""
        path = data_dir / PARENT_FILE
        try:
            doc = orjson.loads(path.read_bytes())
            parent = str(doc["parent"])
            parents = address_list([parent], doc.get("parents", []), what="parent")
            return parent, str(doc["region"]), str(doc.get("rootRegion", "")), tuple(parents)
        except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
            raise FederationError(f"{path}: not a parent link: {exc}") from None

    @classmethod
    def load(cls, data_dir: Path) -> ParentFiles | None:
        path = data_dir / PARENT_FILE
        if not path.exists():
            return None
        parent, region, root_region, parents = cls.read_addresses(data_dir)
        return cls(
            parent=parent,
            region=region,
            root_region=root_region,
            ca=(data_dir / PARENT_CA_FILE).read_bytes(),
            certificate=(data_dir / FEDERATION_CERT_FILE).read_bytes(),
            key=(data_dir / FEDERATION_KEY_FILE).read_bytes(),
            parents=parents if len(parents) > 1 else (),
        )


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
    ) -> None:
        """``data_dir``: the hub's (its parent files, the relayed TUF set, the trust root a
        slice rotates); ``tuf``: what this region serves, replaced by the root's set;
        ``rollouts``: the status reported up is what ``edgectl get`` shows here (its canary
        analysis); ``tuf_relay_shared``, ``shared_blobs``: at a region's replicas."""
        self._data_dir = data_dir
        self._store = store
        self._cache = cache
        self._writer = writer
        self._blobs = blobs
        self._tuf = tuf
        self._region = region
        self._rollouts = rollouts
        self._tuf_relay_shared = tuf_relay_shared
        self._shared_blobs = shared_blobs
        self._clock = clock
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
            csr_pem=_csr(key, self.files.region)
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
                await self._adopt_tuf(message.tuf)
                continue
            if message.WhichOneof("kind") != "slice":
                continue
            s = message.slice
            if s.generation < self.generation:
                log.warning("stale slice ignored", generation=s.generation, applied=self.generation)
                continue
            if s.generation == self.generation and s.digest == self.digest:
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
            await outbox.put(
                federation_pb2.RegionMessage(
                    applied=federation_pb2.SliceApplied(generation=s.generation)
                )
            )
        raise FederationError("the parent ended the stream")

    async def _adopt_tuf(self, message: federation_pb2.TufMetadataSet) -> None:
        """The root's TUF metadata: served to this region's devices once it checked out
        (:mod:`hub.state.tufrelay`); else refused with an event, the last good one kept."""
        held = self._tuf.current
        if isinstance(held, tufrelay.RelayedTuf) and held.digest == message.digest:
            await self._share_tuf(held)  # e.g. adopted before a store write that failed
            return
        problems = tufrelay.check_set(message)
        try:
            if problems:
                raise TrustError("MalformedMetadata", "; ".join(problems[:5]))
            files = {f.name: bytes(f.data) for f in message.files}
            fleet_root = fleet_root_of(self._cache.trust_root)
            relayed = await asyncio.to_thread(
                tufrelay.adopt, self._data_dir, files, message.digest, fleet_root
            )
            versions = relayed.versions()
        except (TrustError, OSError) as exc:
            reason = exc.reason if isinstance(exc, TrustError) else "TufRelayFailed"
            log.error("tuf metadata refused", reason=reason, error=str(exc))
            self._writer.event(
                "TufRepository",
                "fleet",
                "Warning",
                "TufMetadataRefused",
                f"{reason}: the root hub's TUF metadata refused ({exc}); this region keeps "
                "serving the last it accepted",
            )
            return
        before = held.versions() if isinstance(held, tufrelay.RelayedTuf) else None
        self._tuf.current = relayed  # the feed is told below when it is news
        log.info("tuf metadata adopted", **versions)
        await self._share_tuf(relayed)
        if before is None or {k: v for k, v in before.items() if k != "timestamp"} != {
            k: v for k, v in versions.items() if k != "timestamp"
        }:  # a timestamp signed again alone is no news
            self._writer.event(
                "TufRepository",
                "fleet",
                "Normal",
                "TufMetadataRelayed",
                "the root hub's TUF metadata served: "
                + ", ".join(f"{k} version {v}" for k, v in versions.items()),
            )
            self._tuf.adopt(relayed)  # the change feed projects every device again

    async def _share_tuf(self, relayed: tufrelay.RelayedTuf) -> None:
        """A region's replicas: the set this replica adopted goes into the store, which the
        others follow (:class:`hub.state.sharedtuf.SharedRelay`); a failure is an event, and this
        replica keeps serving the set."""
        shared = self._tuf_relay_shared
        if shared is None:
            return
        try:
            await shared.publish(*relayed.files())
        except (TrustError, StoreError) as exc:
            reason = exc.reason if isinstance(exc, TrustError) else "StoreError"
            log.error("relayed tuf metadata not shared", reason=reason, error=str(exc))
            self._writer.event(
                "TufRepository",
                "fleet",
                "Warning",
                "TufRelayNotShared",
                f"{reason}: the root hub's TUF metadata is served by this replica but not "
                f"shared with the region's other replicas ({exc})",
            )

    async def _fetch(self, stub: Any, sha256: str, length: int, name: str, version: str) -> None:
        """One artifact from the root into the blob store, kept only with its signed digest."""
        blobs = self._blobs
        if blobs.has(sha256):
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
                    self._cache, self.generation, region=self._region, rollouts=self._rollouts
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


def revision_figures(
    cache: Cache, name: str, revision: Revision
) -> federation_pb2.RegionRevisionFigures:
    """What ``revision`` of deployment ``name`` did on the region's devices where it serves:
    the devices' counters added up, the highest latency p95, the lowest accuracy (what the
    root's waves analyse, :mod:`hub.decide.wave`)."""
    record = cache.models.get(revision.model)
    sha = record.sha256 if record is not None else None
    out = federation_pb2.RegionRevisionFigures(template=revision.template)
    for device_name in targeted(cache, name):
        device = cache.devices.get(device_name)
        report = device.workloads.get(name) if device is not None else None
        got = (
            wanted_revision(revisions_of(report), revision.model[1], sha)
            if report is not None
            else None
        )
        if got is None or not got.serves:
            continue
        out.devices += 1
        out.requests += got.requests
        out.errors += min(got.errors, got.requests)
        p95 = got.latency_p95_s if got.window_requests > 0 else None
        if p95 is not None and (not out.HasField("latency_p95_s") or p95 > out.latency_p95_s):
            out.latency_p95_s = p95
        if got.validation_reason:
            if len(out.validation_problems) < regionslice.MAX_VALIDATION_PROBLEMS:
                why = got.validation_reason + (
                    f": {got.validation_message}" if got.validation_message else ""
                )
                out.validation_problems[device_name[: regionslice.MAX_NAME]] = why[
                    : regionslice.MAX_TEXT
                ]
        elif got.accuracy is not None:
            out.accuracy_devices += 1
            if not out.HasField("accuracy") or got.accuracy < out.accuracy:
                out.accuracy = got.accuracy
    return out


def build_report(
    cache: Cache, generation: int, *, region: str, rollouts: RolloutController | None
) -> federation_pb2.RegionReport:
    """The region's status: its root-owned deployments' figures and its device inventory."""
    deployments = []
    for (kind, name), stored in sorted(cache.stored.items()):
        if kind != "ModelDeployment":
            continue
        status = shown_object(  # as edgectl shows it at the region
            cache, kind, stored.manifest, region=region, rollouts=rollouts
        ).get("status", {})
        rollout = cache.rollouts.get(name)
        revisions = cache.revisions.get(name, {})
        current = revisions.get(rollout.revision) if rollout is not None else None
        stable = revisions.get(rollout.stable) if rollout is not None else None
        failing = dict(sorted(status.get("failing", {}).items())[: regionslice.MAX_FAILING])
        deployments.append(
            federation_pb2.RegionDeploymentStatus(
                name=name,
                desired=int(status.get("desiredDevices", 0)),
                updated=int(status.get("updatedDevices", 0)),
                ready=int(status.get("readyDevices", 0)),
                available=int(status.get("availableDevices", 0)),
                failing={k: str(v)[: regionslice.MAX_TEXT] for k, v in failing.items()},
                versions={
                    v: int(c.get("devices", 0))
                    for v, c in list(status.get("versions", {}).items())[: regionslice.MAX_VERSIONS]
                },
                rollout_phase=rollout.phase.value if rollout is not None else "",
                rollout_revision=rollout.revision if rollout is not None else 0,
                rollout_template=current.template if current is not None else "",
                stable_template=stable.template if stable is not None else "",
                rollout_reason=rollout.reason[:64] if rollout is not None else "",
                rollout_message=rollout.message[: regionslice.MAX_TEXT]
                if rollout is not None
                else "",
                revision_figures=[
                    revision_figures(cache, name, rev)
                    for rev in {r.number: r for r in (current, stable) if r is not None}.values()
                ],
            )
        )
    by_phase: dict[str, int] = {}
    rows: list[federation_pb2.RegionDevice] = []
    for device in sorted(cache.devices.values(), key=lambda d: d.name):
        by_phase[device.phase.value] = by_phase.get(device.phase.value, 0) + 1
        if len(rows) >= regionslice.MAX_REPORT_DEVICES:
            continue
        desired = cache.desired.get(device.name)
        labels = dict(sorted(device.all_labels().items())[: regionslice.MAX_LABELS])
        rows.append(
            federation_pb2.RegionDevice(
                name=device.name,
                phase=device.phase.value,
                labels=labels,
                deployments=list(desired.deployments) if desired is not None else [],
                cordoned=device.cordoned,
                schedulable=device.health.schedulable,
                attestation=device.attestation.state.value,
                last_heartbeat=device.last_heartbeat or 0.0,
            )
        )
    return federation_pb2.RegionReport(
        generation=generation,
        deployments=deployments[: regionslice.MAX_REPORT_DEPLOYMENTS],
        inventory=federation_pb2.RegionInventory(
            total=len(cache.devices),
            by_phase=by_phase,
            devices=rows,
            truncated=len(cache.devices) > len(rows),
        ),
    )
