"""edgectl's connection to a hub: ``admin.toml`` (as ``hub init`` writes it) and a thin,
synchronous AdminService client over mutual TLS.

``admin.toml``, one hub::

    hub = "hub.example:7443"                 # HOST:PORT
    caCertificate = "/var/lib/edgefleet-hub/ca.crt"    # relative paths: relative to admin.toml
    certificate = "/var/lib/edgefleet-hub/admin.crt"
    key = "/var/lib/edgefleet-hub/admin.key"

``hub`` may be a list, ``hub = ["hub-a:7443", "hub-b:7443"]``: the replicas of one hub
(``hub init --replica-address`` writes it). edgectl tries the next one when a call finds one
unreachable before anything was sent, for reads and idempotent calls
(:data:`IDEMPOTENT`) on any UNAVAILABLE, and for writes that a replica refused because it
does not lead (nothing was done there).

or several hubs, as contexts (like a kubeconfig; ``edgectl config use-context NAME`` changes
``currentContext``, ``--context NAME`` picks one for a command)::

    currentContext = "eu"
    [contexts.eu]
    hub = "hub-eu.example:7443"
    caCertificate = "eu/ca.crt"
    certificate = "eu/admin.crt"
    key = "eu/admin.key"
    [contexts.us]
    ...

Every gRPC failure becomes a :class:`ClientError` carrying the status code's name and the hub's
message, printed by the CLI as one line (``error: INVALID_ARGUMENT: documents[0].spec...``).
A call that changes something and whose answer never came (deadline, connection lost after it
was sent) says "outcome unknown": it may or may not have been done.

Exit codes of edgectl: 0 done; 1 the hub refused (or the input is invalid); 2 usage or
config errors; 3 the hub cannot be reached — or stopped answering during a call that changes
something, when the outcome is unknown: the message says so and how to check
(:func:`outcome_unknown`), never "refused".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import orjson

from edgectl.errors import EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE, EdgectlError
from edgefleet.api.validating import Reader, non_empty_str
from edgefleet.configfiles import host_port, load_config_file, parse_config_document, table
from edgefleet.errors import ConfigError, Problem
from edgefleet.v1 import admin_pb2, admin_pb2_grpc

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_CHUNK_SIZE = 500
"""Objects per List call (``edgectl get --chunk-size``, as kubectl's): a list is read in pages,
each continuing the one before, all at the first page's revision (docs/admin.md)."""

_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
_READS = {"Get", "List", "ListEvents"}


DEFAULT_CONTEXT = "default"


MAX_HUBS = 16

IDEMPOTENT = frozenset(
    {"Get", "List", "ListEvents", "ListRevisions", "FetchTufMetadata", "DeviceLogs"}
    | {"Apply", "Delete", "Cordon", "Uncordon", "RevokeDevice", "RevokeRegion"}
)
"""Calls made again on the next replica after any UNAVAILABLE: reads, and writes whose second
application changes nothing more (apply of the same documents, delete, cordon, revoke)."""


@dataclass(frozen=True, slots=True)
class AdminConfig:
    hub: str
    ca_certificate: Path
    certificate: Path
    key: Path
    publisher_key: Path | None = None  # [publisher] key: what `edgectl models push` signs with
    # [publisher] agentKey: what `edgectl agent push` signs edged releases with
    agent_key: Path | None = None
    context: str = DEFAULT_CONTEXT
    hubs: tuple[str, ...] = ()
    """Every replica of the hub (``hub`` first); empty: ``hub`` alone."""

    @property
    def addresses(self) -> tuple[str, ...]:
        return self.hubs or (self.hub,)


@dataclass(frozen=True, slots=True)
class AdminConfigFile:
    """Every context of an admin.toml and the current one (``default`` for the one-hub form)."""

    contexts: Mapping[str, AdminConfig]
    current: str

    def select(self, name: str | None, *, source: str) -> AdminConfig:
        chosen = name or self.current or DEFAULT_CONTEXT
        if chosen not in self.contexts:
            known = ", ".join(sorted(self.contexts)) or "none"
            problem = Problem("context", f"no context {chosen!r} (contexts: {known})")
            raise ConfigError([problem], source=source)
        return self.contexts[chosen]


def _hub_fields(r: Reader, base: Path, context: str) -> AdminConfig:
    def path(name: str) -> Path:
        text = r.required(name, non_empty_str, "")
        return base / text if text else Path()

    publisher = table(r, "publisher")
    publisher_key = publisher.optional("key", non_empty_str, "")
    agent_key = publisher.optional("agentKey", non_empty_str, "")
    if isinstance(r.raw("hub"), list):  # the replicas of one hub
        hubs = r.list_of("hub", host_port, unique=True) or []
        if not hubs or len(hubs) > MAX_HUBS:
            r.problems.add(r.at("hub"), f"must list 1 to {MAX_HUBS} HOST:PORT addresses")
        hub = hubs[0] if hubs else ""
    else:
        hub, hubs = r.required("hub", host_port, ""), []
    return AdminConfig(
        hub=hub,
        hubs=tuple(hubs[:MAX_HUBS]) if len(hubs) > 1 else (),
        ca_certificate=path("caCertificate"),
        certificate=path("certificate"),
        key=path("key"),
        publisher_key=base / publisher_key if publisher_key else None,
        agent_key=base / agent_key if agent_key else None,
        context=context,
    )


def _admin_reader(base: Path) -> Callable[[Reader], AdminConfigFile]:
    """Reads admin.toml; relative paths are relative to ``base`` (the file's directory)."""

    def read(r: Reader) -> AdminConfigFile:
        if not r.has("contexts"):
            return AdminConfigFile({DEFAULT_CONTEXT: _hub_fields(r, base, DEFAULT_CONTEXT)}, "")
        contexts: dict[str, AdminConfig] = {}
        raw = r.raw("contexts")
        section = table(r, "contexts")
        for name in sorted(str(k) for k in raw) if isinstance(raw, Mapping) else []:
            context = section.section(name)
            if context is not None:
                contexts[name] = _hub_fields(context, base, name)
        current = r.required("currentContext", non_empty_str, "")
        if current and current not in contexts:
            r.problems.add("currentContext", f"no context {current!r} in [contexts]")
        return AdminConfigFile(contexts, current)

    return read


def parse_admin_config(
    doc: Mapping[str, Any], *, source: str, base: Path, context: str | None = None
) -> AdminConfig:
    """Validate an admin.toml document; ConfigError lists every problem with its field."""
    return parse_config_document(doc, _admin_reader(base), source=source).select(
        context, source=source
    )


def load_admin_file(path: Path) -> AdminConfigFile:
    hint = " (pass --config or set EDGECTL_CONFIG)"
    return load_config_file(path, _admin_reader(path.absolute().parent), hint=hint)


def load_admin_config(path: Path, context: str | None = None) -> AdminConfig:
    return load_admin_file(path).select(context, source=str(path))


class ClientError(EdgectlError):
    """A call failed: ``code`` is the gRPC status name (``INVALID_ARGUMENT``...)."""

    def __init__(self, code: str, message: str, exit_code: int = EXIT_REFUSED) -> None:
        self.code = code
        self.message = message
        self.exit_code = exit_code
        super().__init__(f"{code}: {message}")


_MAYBE_DONE = _UNREACHABLE | {
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
}
"""Failures after which a call that changes something may or may not have taken effect."""

_NEVER_SENT = (
    "failed to connect to all addresses",
    "connection refused",
    "dns resolution failed",
    "name resolution",
    "no route to host",
    "handshake failed",
    "does not lead",
    "no longer leads",  # a deposed leader's write, refused by its term's fence: not written
)
"""What gRPC says when no connection was made: then nothing reached the hub."""

CHECKS = {
    "Apply": 'edgectl apply --dry-run -f FILE ("unchanged" means it was applied) or '
    "edgectl get events",
    "Delete": "edgectl get KIND NAME",
    "Cordon": "edgectl get devices NAME",
    "Uncordon": "edgectl get devices NAME",
    "RevokeDevice": "edgectl get devices NAME (spec and taints) or edgectl get events",
    "RevokeRegion": "edgectl get events (a Revoked event of the region)",
    "CreateToken": "hub token list on the hub, or edgectl get events",
    "PushArtifact": "edgectl get models",
}
"""The methods that change something, and how an operator checks whether they did."""


def outcome_unknown(code: grpc.StatusCode, details: str, hub: str, method: str) -> bool:
    """Whether a failed call of ``method`` may still have taken effect (pure)."""
    if method not in CHECKS or code not in _MAYBE_DONE:
        return False
    lowered = details.lower()
    return not any(hint in lowered for hint in _NEVER_SENT)


def translate(code: grpc.StatusCode | None, details: str, hub: str, method: str) -> ClientError:
    """A failed call as edgectl reports it (pure): refused (1), unreachable (3), or — for a
    call that changes something and failed in transit — outcome unknown (3), with how to
    check."""
    code = code or grpc.StatusCode.UNKNOWN
    if outcome_unknown(code, details, hub, method):
        return ClientError(
            code.name,
            f"the hub at {hub} stopped answering during {method} ({details or 'no details'}): "
            f"the outcome is unknown, it may or may not have been done; check with "
            f"{CHECKS[method]}",
            EXIT_UNREACHABLE,
        )
    if code in _UNREACHABLE:
        return ClientError(code.name, f"cannot reach the hub at {hub}: {details}", EXIT_UNREACHABLE)
    return ClientError(code.name, details)


def try_next_replica(code: grpc.StatusCode | None, details: str, method: str) -> bool:
    """Whether a call that failed so may be made again on another replica (pure): on
    UNAVAILABLE, for a read or an idempotent call (:data:`IDEMPOTENT`), or for any call that
    never reached a hub or that a replica refused because it does not lead."""
    if code is not grpc.StatusCode.UNAVAILABLE:
        return False
    lowered = details.lower()
    return method in IDEMPOTENT or any(hint in lowered for hint in _NEVER_SENT)


def _translated(exc: grpc.RpcError, hub: str, method: str = "") -> ClientError:
    return translate(exc.code(), exc.details() or "", hub, method)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        message = f"{what}: cannot read {path}: {exc.strerror}"
        raise ClientError("CONFIG", message, EXIT_USAGE) from None


class AdminClient:
    """AdminService calls; every method raises ClientError on failure."""

    def __init__(self, config: AdminConfig, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(config.ca_certificate, "caCertificate"),
            private_key=_read(config.key, "key"),
            certificate_chain=_read(config.certificate, "certificate"),
        )
        self._credentials = credentials
        self._addresses = config.addresses
        self._index = 0
        self._timeout = timeout
        self._connect()

    def _connect(self) -> None:
        self._hub = self._addresses[self._index]
        self._channel = grpc.secure_channel(self._hub, self._credentials)
        self._stub = admin_pb2_grpc.AdminServiceStub(self._channel)  # type: ignore[no-untyped-call]

    def _next_replica(self, exc: grpc.RpcError, method: str, tried: int) -> bool:
        """Whether to make the failed call again on the next replica (then switched to it)."""
        if tried >= len(self._addresses) or not try_next_replica(
            exc.code(), exc.details() or "", method
        ):
            return False
        self._channel.close()
        self._index = (self._index + 1) % len(self._addresses)
        self._connect()
        return True

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, request: Any) -> Any:
        """Any AdminService method by name (for commands in their own modules)."""
        return self._call(method, request)

    def _call(self, method: str, request: Any) -> Any:
        tried = 1
        while True:
            try:
                return getattr(self._stub, method)(request, timeout=self._timeout)
            except grpc.RpcError as exc:
                if self._next_replica(exc, method, tried):
                    tried += 1
                    continue
                raise _translated(exc, self._hub, method) from None

    def apply(
        self, documents: list[bytes], *, dry_run: bool = False, check_resource_version: bool = False
    ) -> list[Any]:
        """Apply ``documents``; ``check_resource_version``: refused (ABORTED) when an object
        changed since the metadata.resourceVersion its document carries."""
        request = admin_pb2.ApplyRequest(
            documents=documents, dry_run=dry_run, check_resource_version=check_resource_version
        )
        return list(self._call("Apply", request).results)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        item = self._call("Get", admin_pb2.GetRequest(kind=kind, name=name))
        doc: dict[str, Any] = orjson.loads(item.json)
        return doc

    def list_objects(
        self, kind: str, selector: str = "", *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> tuple[list[dict[str, Any]], int]:
        """Every object of ``kind`` (matching ``selector``) and the revision the list was read
        at: pages of at most ``chunk_size`` (0: one response, refused by the hub when the list
        does not fit in one), each continuing the one before."""
        docs: list[dict[str, Any]] = []
        token = ""
        while True:
            request = admin_pb2.ListRequest(
                kind=kind, label_selector=selector, limit=chunk_size, continue_token=token
            )
            response = self._call("List", request)
            docs += [orjson.loads(i.json) for i in response.items]
            if not response.continue_token:
                return docs, int(response.resource_version)
            if response.continue_token == token or not response.items:
                raise ClientError(  # a hub that does not move on would loop for ever
                    "INTERNAL", f"the hub at {self._hub} gave the same page of {kind} again"
                )
            token = response.continue_token

    def delete(self, kind: str, name: str, *, force: bool = False) -> bool:
        request = admin_pb2.DeleteRequest(kind=kind, name=name, force=force)
        return bool(self._call("Delete", request).deleted)

    def cordon(self, name: str, *, cordoned: bool = True) -> None:
        self._call("Cordon" if cordoned else "Uncordon", admin_pb2.CordonRequest(device_name=name))

    def revoke(self, name: str) -> list[str]:
        response = self._call("RevokeDevice", admin_pb2.RevokeDeviceRequest(device_name=name))
        return list(response.serials)

    def revoke_region(self, region: str) -> list[str]:
        response = self._call("RevokeRegion", admin_pb2.RevokeRegionRequest(region=region))
        return list(response.serials)

    def device_logs(self, name: str, workload: str = "", tail: int = 0) -> list[str]:
        """A connected device's recent log lines, relayed by the hub (which waits up to 10 s
        for the device: this call waits longer than that)."""
        request = admin_pb2.DeviceLogsRequest(device_name=name, workload=workload, tail=tail)
        tried = 1
        while True:
            try:
                response = self._stub.DeviceLogs(request, timeout=max(self._timeout, 20.0))
                return list(response.lines)
            except grpc.RpcError as exc:
                if self._next_replica(exc, "DeviceLogs", tried):
                    tried += 1
                    continue
                raise _translated(exc, self._hub, "DeviceLogs") from None

    def events(self, kind: str = "", name: str = "", limit: int = 0) -> list[dict[str, Any]]:
        request = admin_pb2.ListEventsRequest(kind=kind, name=name, limit=limit)
        return [orjson.loads(e) for e in self._call("ListEvents", request).events]

    def watch(self, kind: str, resource_version: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(ADDED|MODIFIED|DELETED, object)`` until the caller stops iterating."""
        call = self._stub.Watch(
            admin_pb2.WatchRequest(kind=kind, resource_version=resource_version)
        )
        try:
            for event in call:
                yield admin_pb2.WatchEvent.Type.Name(event.type), orjson.loads(event.object.json)
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.CANCELLED:
                raise _translated(exc, self._hub) from None
        finally:
            call.cancel()

    def create_token(
        self,
        *,
        ttl_s: float = 0,
        single_use: bool = False,
        description: str = "",
        labels: Mapping[str, str] | None = None,
        no_device_labels: bool = False,
        device_label_prefix: str = "",
        for_region: str = "",
    ) -> Any:
        request = admin_pb2.CreateTokenRequest(
            single_use=single_use,
            description=description,
            labels=dict(labels or {}),
            no_device_labels=no_device_labels,
            device_label_prefix=device_label_prefix,
            for_region=for_region,
        )
        if ttl_s:
            request.ttl.FromTimedelta(timedelta(seconds=ttl_s))
        return self._call("CreateToken", request)
