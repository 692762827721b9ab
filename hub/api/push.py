"""Receiving a pushed artifact (AdminService ``PushArtifact``): verify, store, record.

The hub is not trusted to author models and never re-signs anything. It checks what a device
would check, so that junk is refused at the door rather than on every device:

1. the first message is a header carrying the publisher-signed metadata envelope;
2. the hub has a trust root (``D/trust-root.json``; FAILED_PRECONDITION otherwise) and the
   envelope verifies against it with the devices' own code (:mod:`edgefleet.trust.verifying`):
   well-formed, a threshold of artifacts-role signatures, not expired; with a TUF repository,
   the publisher's delegated targets list it and a threshold of that role's own keys signed
   the envelope (``SignerNotDelegated``: a publisher re-signs no other publisher's model);
3. versions are immutable: a (name, version) already pushed with other bytes is
   ALREADY_EXISTS, decided before any byte is read;
4. the chunks stream into the content-addressed blob store with the **signed length as a hard
   limit** (reading stops there) and the signed sha256 and exact length as verifiers, so a
   refused push leaves no blob; the model file must parse as ONNX (``NotAnOnnxModel``,
   :mod:`edgefleet.artifacts.onnxformat`); a model record is written only after the blob is
   committed;
5. the record (``/models/NAME/VERSION``: the envelope exactly as signed, sha256, length) goes
   and its event (``Pushed``, ``MetadataUpdated``) go to the store in one transaction, so a
   stored model always has its event; then the cache, and every device is projected again.

The same bytes again are ``stored=False``; a new model version is ``stored=True`` even when its
bytes were already held under another name (then ``reused_bytes``). The same bytes with newer signed
metadata (a higher ``metadataVersion``, e.g. re-signed to extend its expiry) replace the
record's envelope; older or equal metadata leaves it as it is.

:meth:`ArtifactReceiver.receive` raises :class:`PushRefused` (a gRPC status code and a
message); the AdminService method translates it with ``context.abort``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, BinaryIO, cast

import grpc

from edgefleet import configschemas
from edgefleet.artifacts.onnxformat import ParsesAsOnnx
from edgefleet.artifacts.storing import ArtifactStore, Verifier
from edgefleet.errors import ArtifactError, CompareFailed, EdgefleetError, TrustError
from edgefleet.logs import get_logger
from edgefleet.trust.documents import ArtifactMetadata, FileInfo, Root, parse_artifact
from edgefleet.trust.envelopes import ARTIFACT_TYPE, decode_payload, parse_envelope_bytes
from edgefleet.trust.verifying import (
    SignedFile,
    TrustState,
    verify_artifact_metadata,
    verify_initial_root,
)
from edgefleet.v1 import admin_pb2
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.sharedblobs import SharedBlobs
from hub.state.sharedtuf import MAX_SHARED_TARGETS_BYTES, SharedTuf, TufConflict
from hub.state.store import Compare, Put, Store
from hub.state.trustroots import HubRoots
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

READ_SIZE = 1 << 20
CHUNK_TIMEOUT_S = 60.0  # the longest wait for the next chunk before the push is given up

# Trust refusal reasons -> status codes. Anything else from the trust code (malformed
# envelopes or metadata, wrong payload type) is INVALID_ARGUMENT.
_TRUST_CODES = {
    "UnknownKey": grpc.StatusCode.PERMISSION_DENIED,
    "SignatureThresholdNotMet": grpc.StatusCode.PERMISSION_DENIED,
    "MetadataExpired": grpc.StatusCode.FAILED_PRECONDITION,
    "TufRelayed": grpc.StatusCode.FAILED_PRECONDITION,
}


class PushRefused(EdgefleetError):
    """A push was refused; ``code`` is the gRPC status to answer with, ``reason`` a CamelCase
    word (``UnknownKey``, ``LengthExceeded``, ``VersionExists``...). Nothing was stored."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        self.code = code
        self.reason = reason
        super().__init__(f"{reason}: {message}")


_TUF_CODES = {
    "UnknownRole": grpc.StatusCode.PERMISSION_DENIED,
    "PathNotDelegated": grpc.StatusCode.PERMISSION_DENIED,
    "UnknownKey": grpc.StatusCode.PERMISSION_DENIED,
    "SignatureThresholdNotMet": grpc.StatusCode.PERMISSION_DENIED,
    "SignerNotDelegated": grpc.StatusCode.PERMISSION_DENIED,
    "MetadataRollback": grpc.StatusCode.FAILED_PRECONDITION,
    "MetadataExpired": grpc.StatusCode.FAILED_PRECONDITION,
}


class ArtifactReceiver:
    """Receives pushed artifacts (the module doc) into the store, the cache and the blob
    store; hub.server builds it with what it uses."""

    def __init__(
        self,
        store: Store,
        cache: Cache,
        writer: DeviceWriter,
        blobs: ArtifactStore,
        *,
        tuf: Callable[[], TufRepository | RelayedTuf | None],
        tuf_shared: SharedTuf | None,
        shared_blobs: SharedBlobs | None,
    ) -> None:
        self.store = store
        self.cache = cache  # its trust roots verify the metadata; its models are what is held
        self.writer = writer
        self.blobs = blobs
        self.tuf = tuf  # the TUF repository held now (tufwatch, a region's relay replace it)
        self.tuf_shared = tuf_shared  # replicas: the repository's versions in the store
        self.shared_blobs = shared_blobs  # replicas: the bytes published in the store

    async def receive(
        self,
        requests: AsyncIterator[admin_pb2.PushArtifactRequest],
        *,
        now: float,
    ) -> admin_pb2.PushArtifactResponse:
        """Verify and store one pushed artifact (see the module doc); ``now`` fixes every time
        check of this push."""
        it = requests.__aiter__()
        try:
            first = await it.__anext__()
        except StopAsyncIteration:
            raise PushRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                "NoHeader",
                "the stream is empty: send a header first",
            ) from None
        if first.WhichOneof("message") != "header":
            raise PushRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                "NoHeader",
                "the first message must be a header, got "
                f"{first.WhichOneof('message') or 'nothing'}",
            )
        envelope_bytes = bytes(first.header.signed_metadata)
        meta, model_file, info = self._verify_header(envelope_bytes, now)
        delegated = self._verify_delegated(first.header, meta, now)
        what = f"{meta.name} {meta.version}"
        existing = self.cache.models.get((meta.name, meta.version))
        if existing is not None and existing.sha256 != info.sha256:
            raise _exists(what, existing.sha256, info.sha256)

        extras = {n: f for n, f in meta.files.items() if f.role != "model"}
        if self.shared_blobs is not None:  # replicas: the bytes must fit in the store
            for file_name, f in [(model_file, info), *extras.items()]:
                try:
                    self.shared_blobs.check_size(f"{what}: {file_name}", f.length)
                except ArtifactError as exc:
                    raise PushRefused(
                        grpc.StatusCode.FAILED_PRECONDITION, exc.reason, str(exc)
                    ) from None
        pushed = [
            d for d in {info.sha256, *(f.sha256 for f in extras.values())} if self.blobs.has(d)
        ]
        had = set(pushed)
        reader = ChunkReader(it, asyncio.get_running_loop())
        try:
            sha256 = await self._ingest(reader, meta, model_file, info, verify_onnx=True)
            stored_extras: dict[str, str] = {}
            while (fname := reader.begin_next_file()) is not None:
                extra = extras.get(fname)
                if extra is None or fname == model_file:
                    raise PushRefused(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "FileNotSigned",
                        f"{what}: {fname!r} is not an extra file of the signed metadata "
                        f"(it lists {', '.join(sorted(extras)) or 'none'})",
                    )
                if fname in stored_extras:
                    raise PushRefused(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "FileRepeated",
                        f"{what}: {fname} sent twice",
                    )
                stored_extras[fname] = await self._ingest(
                    reader, meta, fname, extra, verify_onnx=False
                )
            missing = sorted(set(extras) - set(stored_extras))
            if missing:
                raise PushRefused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "FileMissing",
                    f"{what}: the signed metadata lists {', '.join(missing)}, which were not sent",
                )
            if configschemas.FILE_NAME in stored_extras:  # a config schema edgefleet checks
                try:
                    raw = self.blobs.path_for(stored_extras[configschemas.FILE_NAME]).read_bytes()
                    configschemas.parse_schema(raw)
                except configschemas.SchemaError as exc:
                    raise PushRefused(
                        grpc.StatusCode.INVALID_ARGUMENT, "ConfigSchemaInvalid", f"{what}: {exc}"
                    ) from None
            if self.shared_blobs is not None:  # before the record: no replica lacks the bytes
                for digest in sorted({sha256, *stored_extras.values()}):
                    await self.shared_blobs.publish(digest)
            response = await self._record(
                meta,
                envelope_bytes,
                info,
                sha256,
                now,
                extras=stored_extras,
            )
            response.reused_bytes = response.stored and sha256 in had
            tuf = self.tuf()
            if delegated is not None and tuf is not None:
                try:
                    if self.tuf_shared is not None:  # replicas: through the store (sharedtuf)
                        await self.tuf_shared.publish_delegated(*delegated)
                    else:
                        tuf.store_delegated(*delegated)
                except TufConflict as exc:
                    raise PushRefused(grpc.StatusCode.ABORTED, "TufConflict", str(exc)) from None
                except TrustError as exc:
                    raise PushRefused(grpc.StatusCode.ABORTED, exc.reason, str(exc)) from None
                self.cache.trust_changed()  # every device's TUF metadata (hub.state.feed)
            return response
        except BaseException:
            for digest in {info.sha256, *(f.sha256 for f in extras.values())} - had:
                self._drop_unreferenced(digest)
            raise

    async def _ingest(
        self,
        reader: ChunkReader,
        meta: ArtifactMetadata,
        fname: str,
        info: FileInfo,
        *,
        verify_onnx: bool,
    ) -> str:
        """Stream one file of the push into the blob store, within its signed length and digest."""
        what = f"{meta.name} {meta.version}"
        verifiers: list[Verifier] = [SignedFile(info, what if verify_onnx else f"{what}: {fname}")]
        if verify_onnx:
            verifiers.append(ParsesAsOnnx())
        try:
            return await asyncio.to_thread(
                self.blobs.ingest_stream,
                cast("BinaryIO", reader),  # it only calls read(size)
                origin=f"pushed {fname}",
                name=meta.name,
                version=meta.version,
                verifiers=verifiers,
                max_bytes=info.length,
            )
        except PushRefused:
            raise
        except ArtifactError as exc:
            reason = "LengthExceeded" if exc.reason == "ArtifactTooLarge" else exc.reason
            message = (
                f"{what}: the pushed bytes of {fname} are longer than the signed length "
                f"{info.length}"
                if reason == "LengthExceeded"
                else str(exc)
            )
            raise PushRefused(grpc.StatusCode.INVALID_ARGUMENT, reason, message) from None

    def _verify_header(
        self, envelope_bytes: bytes, now: float
    ) -> tuple[ArtifactMetadata, str, FileInfo]:
        trust_root = HubRoots(self.cache.trust_roots).current
        if not trust_root:
            raise PushRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                "NoTrustRoot",
                "this hub has no trust root (D/trust-root.json), so it cannot check who signed "
                "the artifact: create one (hub init does by default) and restart the hub",
            )
        try:
            root: Root = verify_initial_root(
                parse_envelope_bytes(trust_root, what="the hub's trust root"),
                now,
                what="the hub's trust root",
            )
        except TrustError as exc:
            raise PushRefused(grpc.StatusCode.FAILED_PRECONDITION, exc.reason, str(exc)) from None
        try:
            env = parse_envelope_bytes(envelope_bytes, what="header.signed_metadata")
            meta = verify_artifact_metadata(
                root, env, now=now, state=TrustState(), what="header.signed_metadata"
            )
        except TrustError as exc:
            code = _TRUST_CODES.get(exc.reason, grpc.StatusCode.INVALID_ARGUMENT)
            raise PushRefused(code, exc.reason, str(exc)) from None
        model_file, info = meta.model_file()
        return meta, model_file, info

    def _verify_delegated(
        self, header: admin_pb2.ArtifactHeader, meta: ArtifactMetadata, now: float
    ) -> tuple[str, bytes, int] | None:
        """A hub with a TUF repository needs the publisher's delegated targets listing the
        pushed artifact (checked like a device would:
        :meth:`hub.state.tufrepo.TufRepository.check_delegated`); one without refuses them
        rather than ignore them. ``(role, bytes, version)`` to store once the artifact is, or
        None."""
        data = bytes(header.delegated_targets)
        role = str(header.delegated_role)
        tuf = self.tuf()
        if tuf is None:
            if data or role:
                raise PushRefused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "NoTufRepository",
                    "header.delegated_targets: this hub keeps no TUF repository (hub init "
                    "--no-tuf made none): not supported here",
                )
            return None
        if not data or not role:
            raise PushRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                "TargetsMissing",
                "header.delegated_targets: this hub keeps a TUF repository, so every artifact must "
                "come with its publisher's delegated targets listing it (edgectl models push signs "
                "them); devices refuse artifacts no publisher's targets list",
            )
        if self.tuf_shared is not None and len(data) > MAX_SHARED_TARGETS_BYTES:
            raise PushRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                "MetadataTooLarge",
                f"header.delegated_targets: {len(data)} bytes; hub replicas share them in the "
                f"store, at most {MAX_SHARED_TARGETS_BYTES} bytes",
            )
        try:
            version = tuf.check_delegated(
                role,
                data,
                meta,
                now=now,
                envelope=parse_envelope_bytes(
                    bytes(header.signed_metadata), what="header.signed_metadata"
                ),
            )
        except TrustError as exc:
            code = _TUF_CODES.get(exc.reason, grpc.StatusCode.INVALID_ARGUMENT)
            raise PushRefused(code, exc.reason, f"header.delegated_targets: {exc}") from None
        return (role, data, version) if version else None

    async def _record(
        self,
        meta: ArtifactMetadata,
        envelope: bytes,
        info: FileInfo,
        sha256: str,
        now: float,
        *,
        extras: dict[str, str],
    ) -> admin_pb2.PushArtifactResponse:
        what = f"{meta.name} {meta.version}"
        key = storekeys.model_key(meta.name, meta.version)
        record = storekeys.ModelRecord(
            meta.name, meta.version, sha256, info.length, envelope, now, extras
        )
        current = await self.store.get(key)
        if current is not None:
            old = storekeys.ModelRecord.from_json(storekeys.loads(current.value))
            if old.sha256 != sha256:
                raise _exists(what, old.sha256, sha256)
            if old.envelope == envelope or meta.metadata_version <= _metadata_version(old.envelope):
                self.cache.put_model(old)
                log.info("artifact unchanged", model=meta.name, version=meta.version)
                return admin_pb2.PushArtifactResponse(
                    sha256=sha256, length=info.length, stored=False, extras=old.extras
                )
            reason, message = "MetadataUpdated", f"{what}: newer signed metadata (same bytes)"
            record = replace(record, rollback_allowance=old.rollback_allowance)
        else:
            reason, message = "Pushed", f"{what} pushed (sha256 {sha256}, {info.length} bytes)"
        event = self.writer.prepare_event(
            storekeys.KIND_MODEL, f"{meta.name}-{meta.version}", "Normal", reason, message
        )
        try:
            await self.store.txn(
                [Compare(key, current.mod_revision if current is not None else 0)],
                [Put(key, storekeys.dumps(record.to_json())), event.put],
            )
        except CompareFailed:
            raise PushRefused(
                grpc.StatusCode.ABORTED,
                "ConcurrentPush",
                f"{what} was pushed by someone else at the same time; push again",
            ) from None
        self.cache.put_model(record)  # every device is projected again (hub.state.feed)
        self.writer.committed(event)
        log.info("artifact pushed", model=meta.name, version=meta.version, sha256=sha256)
        # a model version recorded for the first time is "pushed" even when its bytes were already
        # held under another name: "unchanged" would hide the new record (renewed metadata of a
        # version already recorded is not: same bytes, same version)
        return admin_pb2.PushArtifactResponse(
            sha256=sha256, length=info.length, stored=current is None, extras=extras
        )

    def _drop_unreferenced(self, sha256: str) -> None:
        if all(sha256 not in m.digests() for m in self.cache.models.values()):
            self.blobs.path_for(sha256).unlink(missing_ok=True)


def _exists(what: str, have: str, pushed: str) -> PushRefused:
    return PushRefused(
        grpc.StatusCode.ALREADY_EXISTS,
        "VersionExists",
        f"{what} was already pushed with sha256 {have}; these bytes have sha256 {pushed}. "
        "Versions are immutable: push a new version",
    )


def _metadata_version(envelope: bytes) -> int:
    env = parse_envelope_bytes(envelope, what="stored metadata")
    doc = decode_payload(env, expected_type=ARTIFACT_TYPE, what="stored metadata")
    return parse_artifact(doc).metadata_version


class ChunkReader:
    """A blocking ``read()`` over the request stream, for the store's ingest in a thread: each
    call fetches the next message on the event loop. Every message after the header must be
    a chunk or a ``file`` message, which ends the current file (:meth:`begin_next_file`)."""

    def __init__(
        self, it: AsyncIterator[admin_pb2.PushArtifactRequest], loop: asyncio.AbstractEventLoop
    ) -> None:
        self._it = it
        self._loop = loop
        self._buffer = b""
        self._done = False
        self._next_file: str | None = None  # a `file` message ended the current file

    async def _next(self) -> Any:
        try:
            return await self._it.__anext__()
        except StopAsyncIteration:
            return None

    def read(self, size: int = READ_SIZE) -> bytes:
        while not self._buffer and not self._done:
            future = asyncio.run_coroutine_threadsafe(self._next(), self._loop)
            try:
                msg = future.result(timeout=CHUNK_TIMEOUT_S)
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise PushRefused(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "PushStalled",
                    f"no chunk for {CHUNK_TIMEOUT_S:g} s",
                ) from None
            kind = msg.WhichOneof("message") if msg is not None else None
            if msg is None:
                self._done = True
            elif kind == "file":
                self._done = True
                self._next_file = str(msg.file.name)
            elif kind != "chunk":
                raise PushRefused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "UnexpectedMessage",
                    f"only chunks and files may follow the header, got {kind}",
                )
            else:
                self._buffer = bytes(msg.chunk)
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out

    def begin_next_file(self) -> str | None:
        """After a file is read to its end: the next file's name (None: the stream ended)."""
        while not self._done:  # bytes beyond the signed length were not read: refuse them
            if self.read():
                raise PushRefused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "LengthExceeded",
                    "more bytes were sent than the signed length of the file",
                )
        name, self._next_file = self._next_file, None
        if name is not None:
            self._done = False
        return name
