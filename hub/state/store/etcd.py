"""The :class:`~hub.state.store.protocol.Store` on etcd v3: several hub replicas share one store.

The protocol was modelled on etcd, so the mapping is direct:

* a key is ``namespace + key`` in etcd (the store URL's path, ``etcd://h:p/edgefleet/eu``; empty:
  none), so several hubs can share one etcd cluster; keys and values are bytes on the wire
  (UTF-8 keys sort in code point order, as in SQLite);
* revisions are etcd's own: global to the cluster, shared by every namespace, so a store's
  revisions are increasing but not consecutive when other writers share the cluster, and a
  fresh cluster starts at 1;
* compare-and-swap and :meth:`txn` are one etcd Txn comparing mod revisions; its failure branch
  reads the compared keys, so CompareFailed says which one and where it is;
* watches are etcd watches with ``prev_kv``; a compacted start revision raises Compacted;
* leases are etcd leases, expired by etcd itself (:meth:`expire_leases` has nothing to do;
  TTLs are rounded up to whole seconds, and etcd raises TTLs below its minimum to it);
* compaction is etcd's (logical) compaction.

The wire client: `aetcd <https://pypi.org/project/aetcd/>`_'s etcd v3 API (its generated
messages and stubs, ``aetcd.rpc``), on a grpc.aio channel made here, because aetcd's own
``Client`` connects to one endpoint without TLS and the hub needs a list of endpoints and
mutual TLS. Several endpoints: one channel each, used in turn; a call that finds its endpoint
unavailable moves to the next (a read is retried there, a write raises StoreUnavailable, as
it may or may not have been applied).

etcd bounds a transaction (``--max-txn-ops``, default 128; ``--max-request-bytes``, default
1.5 MiB); the hub's device writer batches more than that, so etcd for a hub runs with
``--max-txn-ops 10000 --max-request-bytes 33554432`` (docs/etcd.md), and a refused
transaction is a StoreError saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from edgefleet.errors import Compacted, CompareFailed, LeaseNotFound, StoreError, StoreUnavailable
from edgefleet.logs import get_logger
from hub.state.store.protocol import (
    NO_LEASE,
    Compare,
    Delete,
    Event,
    EventType,
    KeyValue,
    LeaseId,
    Op,
    Put,
    RangeResult,
    check_key,
    check_ops,
    check_ttl,
)

log = get_logger(__name__)

NEEDS_AETCD = (
    "the etcd store needs the aetcd package, which is not installed: "
    "pip install 'edgefleet[etcd]' (the Debian package has it)"
)


class _Missing:
    def __getattr__(self, name: str) -> Any:
        raise StoreUnavailable(NEEDS_AETCD)


if TYPE_CHECKING:
    from aetcd import rpc
else:
    try:
        from aetcd import rpc
    except ImportError:  # a device: the hub's etcd store is an extra (edgefleet[etcd])
        rpc = _Missing()

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
"""How long one etcd call may take before it counts as unavailable."""
RANGE_PAGE = 1000
"""Keys per range request: a large prefix is read in pages, all at one revision."""
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]
_UNAVAILABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """TLS to etcd: the CA that signed etcd's serving certificates, and this hub's client
    certificate and key (both or neither: etcd with ``--client-cert-auth`` needs them)."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise StoreError(
                "etcd TLS: a client certificate needs its key and a key its certificate "
                "(give both etcd certFile and keyFile, or neither)"
            )

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path, what: str) -> bytes:
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise StoreError(f"etcd TLS: cannot read the {what} {path}: {exc}") from None
            if b"-----BEGIN" not in data:
                raise StoreError(f"etcd TLS: the {what} {path} is not PEM")
            return data

        ca = read(self.ca_file, "CA certificate (caFile)")
        cert = read(self.cert_file, "client certificate (certFile)") if self.cert_file else None
        key = read(self.key_file, "client key (keyFile)") if self.key_file else None
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )


class _Stubs:
    """The etcd services on one channel (made once: a stub builds its calls when made)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.kv = rpc.KVStub(channel)
        self.lease = rpc.LeaseStub(channel)
        self.watch = rpc.WatchStub(channel)


def _bytes_prefix_end(prefix: bytes) -> bytes:
    """etcd's range end for every key starting with ``prefix`` (b"\\0": to the end)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


class EtcdStore:
    """Open with ``await EtcdStore.open(endpoints)``; ``await close()`` when done."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        namespace: str = "",
        tls: EtcdTls | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if not endpoints:
            raise StoreError("an etcd store needs at least one endpoint (HOST:PORT)")
        if isinstance(rpc, _Missing):
            raise StoreUnavailable(NEEDS_AETCD)
        self.endpoints = tuple(endpoints)
        self.namespace = namespace
        self.timeout = timeout
        credentials = tls.credentials() if tls is not None else None
        self._channels: list[grpc.aio.Channel] = [
            grpc.aio.secure_channel(e, credentials, options=CHANNEL_OPTIONS)
            if credentials is not None
            else grpc.aio.insecure_channel(e, options=CHANNEL_OPTIONS)
            for e in self.endpoints
        ]
        self._stubs = [_Stubs(ch) for ch in self._channels]
        self._current = 0
        self._watching = 0
        self._closed = False

    @classmethod
    async def open(
        cls,
        endpoints: Sequence[str],
        *,
        namespace: str = "",
        tls: EtcdTls | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> EtcdStore:
        """Connect, and check that some endpoint answers (StoreUnavailable otherwise)."""
        store = cls(endpoints, namespace=namespace, tls=tls, timeout=timeout)
        try:
            await store.get("/")  # a read: proves an endpoint answers, with TLS if any
        except BaseException:
            await store.close()
            raise
        return store

    # Plumbing

    def _key(self, key: str) -> bytes:
        if self.namespace and not key.startswith("/"):
            raise StoreError(f"a key of a namespaced etcd store starts with /, got {key!r}")
        return (self.namespace + key).encode()

    def _bounds(self, prefix: str) -> tuple[bytes, bytes]:
        """The etcd range [start, end) of the keys under ``prefix`` in this namespace."""
        if self.namespace and not prefix:
            prefix = "/"  # every key of the namespace; not those of "/ns-other"
        start = self._key(prefix)
        return (b"\0", b"\0") if not start else (start, _bytes_prefix_end(start))

    def _unkey(self, raw: bytes) -> str:
        return raw.decode()[len(self.namespace) :]

    def _kv(self, kv: Any) -> KeyValue:
        return KeyValue(
            self._unkey(kv.key),
            bytes(kv.value),
            kv.create_revision,
            kv.mod_revision,
            kv.version,
            LeaseId(kv.lease),
        )

    def _fail(self, exc: grpc.aio.AioRpcError, what: str) -> StoreError:
        code, details = exc.code(), exc.details() or ""
        if code in _UNAVAILABLE:
            where = self.endpoints[self._current]
            self._current = (self._current + 1) % len(self._channels)
            return StoreUnavailable(f"etcd {where}: {what}: {code.name}: {details}")
        if "too many operations in txn" in details or "request is too large" in details:
            return StoreError(
                f"etcd refused {what}: {details} (run etcd with --max-txn-ops 10000 "
                "--max-request-bytes 33554432; docs/etcd.md)"
            )
        return StoreError(f"etcd: {what}: {code.name}: {details}")

    async def _call(self, what: str, call: Callable[[_Stubs], Awaitable[T]], *, retry: bool) -> T:
        """One call on the current endpoint; a read (``retry``) tries every endpoint once."""
        if self._closed:
            raise StoreError("the store is closed")
        attempts = len(self._channels) if retry else 1
        for attempt in range(attempts):
            try:
                return await call(self._stubs[self._current])
            except grpc.aio.AioRpcError as exc:
                error = self._fail(exc, what)
                if not isinstance(error, StoreUnavailable) or attempt == attempts - 1:
                    raise error from None
        raise AssertionError("unreachable")

    # Reads

    async def get(self, key: str) -> KeyValue | None:
        check_key(key)
        request = rpc.RangeRequest(key=self._key(key))
        response = await self._call(
            "get",
            lambda st: st.kv.Range(request, timeout=self.timeout),
            retry=True,
        )
        return self._kv(response.kvs[0]) if response.kvs else None

    async def range(self, prefix: str) -> RangeResult:
        start, end = self._bounds(prefix)
        kvs: list[KeyValue] = []
        revision = 0
        while True:
            request = rpc.RangeRequest(
                key=start, range_end=end, limit=RANGE_PAGE, revision=revision
            )
            response = await self._call("range", self._ranger(request), retry=True)
            if revision == 0:
                revision = response.header.revision
            kvs.extend(self._kv(kv) for kv in response.kvs)
            if not response.more or not response.kvs:
                return RangeResult(tuple(kvs), revision)
            start = bytes(response.kvs[-1].key) + b"\0"

    async def range_at(self, prefix: str, revision: int) -> RangeResult:
        if revision < 1:
            raise StoreError(f"cannot read at revision {revision}: revisions start at 1")
        start, end = self._bounds(prefix)
        kvs: list[KeyValue] = []
        while True:
            request = rpc.RangeRequest(
                key=start, range_end=end, limit=RANGE_PAGE, revision=revision
            )
            try:
                response = await self._call("range", self._ranger(request), retry=True)
            except StoreError as exc:
                if "required revision has been compacted" in str(exc):
                    raise Compacted(revision, revision) from None  # etcd does not say where
                if "future revision" in str(exc):
                    raise StoreError(f"cannot read at revision {revision}: {exc}") from None
                raise
            kvs.extend(self._kv(kv) for kv in response.kvs)
            if not response.more or not response.kvs:
                return RangeResult(tuple(kvs), revision)
            start = bytes(response.kvs[-1].key) + b"\0"

    def _ranger(self, request: Any) -> Callable[[_Stubs], Awaitable[Any]]:
        return lambda st: st.kv.Range(request, timeout=self.timeout)

    # Writes

    def _request_op(self, op: Op) -> Any:
        if isinstance(op, Put):
            return rpc.RequestOp(
                request_put=rpc.PutRequest(key=self._key(op.key), value=op.value, lease=op.lease)
            )
        return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=self._key(op.key)))

    async def _txn(self, compares: Sequence[Compare], ops: Sequence[Op], what: str) -> Any:
        """Run the etcd Txn; raises CompareFailed naming the first compare that did not hold."""
        for c in compares:
            check_key(c.key)
        request = rpc.TxnRequest(
            compare=[
                rpc.Compare(
                    result=rpc.Compare.EQUAL,
                    target=rpc.Compare.MOD,
                    key=self._key(c.key),
                    mod_revision=c.mod_revision,
                )
                for c in compares
            ],
            success=[self._request_op(op) for op in ops],
            failure=[
                rpc.RequestOp(request_range=rpc.RangeRequest(key=self._key(c.key)))
                for c in compares
            ],
        )
        try:
            response = await self._call(
                what, lambda st: st.kv.Txn(request, timeout=self.timeout), retry=False
            )
        except StoreError as exc:
            if "requested lease not found" in str(exc):
                lease = next((op.lease for op in ops if isinstance(op, Put) and op.lease), 0)
                raise LeaseNotFound(lease) from None
            raise
        if not response.succeeded:
            failed: list[tuple[str, int, int]] = []
            for c, r in zip(compares, response.responses, strict=True):
                found = r.response_range.kvs
                actual = found[0].mod_revision if found else 0
                if actual != c.mod_revision:
                    failed.append((c.key, c.mod_revision, actual))
            if failed:
                raise CompareFailed(*failed[0], also=tuple(k for k, _, _ in failed[1:]))
            raise CompareFailed(compares[0].key, compares[0].mod_revision, -1)  # pragma: no cover
        return response

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        check_ops(ops)
        response = await self._txn(compares, ops, f"a transaction of {len(ops)} operations")
        revision: int = response.header.revision
        return revision

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        expect_mod_revision: int | None = None,
        lease: LeaseId = NO_LEASE,
    ) -> int:
        if expect_mod_revision is not None:
            return await self.txn([Compare(key, expect_mod_revision)], [Put(key, value, lease)])
        check_ops([Put(key, value, lease)])
        request = rpc.PutRequest(key=self._key(key), value=value, lease=lease)
        try:
            response = await self._call(
                "put", lambda st: st.kv.Put(request, timeout=self.timeout), retry=False
            )
        except StoreError as exc:
            if "requested lease not found" in str(exc):
                raise LeaseNotFound(lease) from None
            raise
        revision: int = response.header.revision
        return revision

    async def delete(self, key: str, *, expect_mod_revision: int | None = None) -> int | None:
        check_key(key)
        compares = [] if expect_mod_revision is None else [Compare(key, expect_mod_revision)]
        response = await self._txn(compares, [Delete(key)], "delete")
        if response.responses[0].response_delete_range.deleted == 0:
            return None
        revision: int = response.header.revision
        return revision

    # Watch

    @property
    def watching(self) -> int:
        """How many watches are open (created on the server)."""
        return self._watching

    def watch(self, prefix: str, start_revision: int = 0) -> AsyncIterator[Event]:
        if start_revision < 0:
            raise StoreError(f"a start revision must be 0 or more, got {start_revision}")
        return self._watch(prefix, start_revision)

    async def _watch(self, prefix: str, start_revision: int) -> AsyncIterator[Event]:
        if self._closed:
            raise StoreError("the store is closed")
        key, end = self._bounds(prefix)
        endpoint = self.endpoints[self._current]
        call = self._stubs[self._current].watch.Watch()
        created = False
        try:
            try:
                await call.write(
                    rpc.WatchRequest(
                        create_request=rpc.WatchCreateRequest(
                            key=key, range_end=end, start_revision=start_revision, prev_kv=True
                        )
                    )
                )
                while True:
                    response = await call.read()
                    if response is grpc.aio.EOF:
                        raise StoreUnavailable(f"etcd {endpoint}: the watch stream ended")
                    if response.created and not created:
                        created = True
                        self._watching += 1
                    if response.compact_revision:
                        raise Compacted(start_revision, response.compact_revision)
                    if response.canceled:
                        raise StoreError(
                            f"etcd {endpoint}: watch canceled: {response.cancel_reason}"
                        )
                    for e in response.events:
                        yield self._event(e)
            except grpc.aio.AioRpcError as exc:
                raise self._fail(exc, "watch") from None
        finally:
            if created:
                self._watching -= 1
            await _end(call)

    def _event(self, e: Any) -> Event:
        prev = self._kv(e.prev_kv) if e.HasField("prev_kv") else None
        if e.type == rpc.Event.DELETE:
            kv = KeyValue(self._unkey(e.kv.key), b"", 0, e.kv.mod_revision, 0)
            return Event(EventType.DELETE, kv, prev)
        return Event(EventType.PUT, self._kv(e.kv), prev)

    # Leases

    async def grant(self, ttl: float) -> LeaseId:
        check_ttl(ttl)
        request = rpc.LeaseGrantRequest(TTL=max(1, math.ceil(ttl)))
        response = await self._call(
            "lease grant",
            lambda st: st.lease.LeaseGrant(request, timeout=self.timeout),
            retry=False,
        )
        if response.error:
            raise StoreError(f"etcd: lease grant: {response.error}")
        return LeaseId(response.ID)

    async def keepalive(self, lease: LeaseId) -> None:
        async def once(st: _Stubs) -> Any:
            call = st.lease.LeaseKeepAlive(timeout=self.timeout)
            try:
                await call.write(rpc.LeaseKeepAliveRequest(ID=lease))
                return await call.read()
            finally:
                await _end(call)

        response = await self._call("lease keepalive", once, retry=True)
        if response is grpc.aio.EOF or response.TTL <= 0:
            raise LeaseNotFound(lease)

    async def revoke(self, lease: LeaseId) -> int:
        request = rpc.LeaseRevokeRequest(ID=lease)
        try:
            response = await self._call(
                "lease revoke",
                lambda st: st.lease.LeaseRevoke(request, timeout=self.timeout),
                retry=False,
            )
        except StoreError as exc:
            if "requested lease not found" in str(exc):
                raise LeaseNotFound(lease) from None
            raise
        revision: int = response.header.revision
        return revision

    async def expire_leases(self) -> list[LeaseId]:
        """etcd expires leases itself; nothing to do here."""
        return []

    async def time_to_live(self, lease: LeaseId) -> float:
        """Seconds the lease has left (LeaseNotFound when it has expired or was revoked)."""
        request = rpc.LeaseTimeToLiveRequest(ID=lease)
        response = await self._call(
            "lease time to live",
            lambda st: st.lease.LeaseTimeToLive(request, timeout=self.timeout),
            retry=True,
        )
        if response.TTL <= 0:
            raise LeaseNotFound(lease)
        return float(response.TTL)

    # Compaction

    async def compact(self, revision: int) -> None:
        request = rpc.CompactionRequest(revision=revision)
        try:
            await self._call(
                "compact",
                lambda st: st.kv.Compact(request, timeout=self.timeout),
                retry=False,
            )
        except StoreError as exc:
            if "required revision has been compacted" in str(exc):
                return  # already compacted at or after it: nothing to do
            if "future revision" in str(exc):
                raise StoreError(
                    f"cannot compact at {revision}: it is a future revision for etcd"
                ) from None
            raise

    async def close(self) -> None:
        self._closed = True
        await asyncio.gather(*(ch.close() for ch in self._channels))
        await _grpc_settled()


async def _grpc_settled(within: float = 1.0) -> None:
    """Wait (a little) until grpc's own tasks for the streams cancelled here have seen their
    status: grpc delivers it from its poller a moment after ``cancel()``."""
    deadline = asyncio.get_running_loop().time() + within
    while asyncio.get_running_loop().time() < deadline:
        pending = [
            t
            for t in asyncio.all_tasks()
            if "_handle_status_once_received" in getattr(t.get_coro(), "__qualname__", "")
        ]
        if not pending:
            return
        await asyncio.sleep(0.005)


async def _end(call: Any) -> None:
    """Cancel a streaming call and wait until grpc has finished with it (no task left)."""
    call.cancel()
    with contextlib.suppress(Exception):
        await call.code()
