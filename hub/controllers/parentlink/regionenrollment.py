"""A regional hub's enrollment with its root (docs/federation.md), and the files it leaves.

:func:`enroll_with_parent` (``hub init --parent HOST:PORT[,HOST:PORT...] --token T
--parent-ca-hash PIN --region R``): the token-and-pin flow devices use, at each of the root's
addresses (its replicas) in turn until one answers. The root's enrollment port is read over
TLS without verification to get the chain it presents, whose CA must match the pin; then, over
TLS to that CA, ``EnrollHub(token, CSR, region)``. Written (0600 keys, atomically):
``D/parent.json`` (the root's addresses, its region; :func:`set_parent_addresses` changes the
addresses later), ``D/parent-ca.crt``, ``D/federation.{crt,key}`` (the hub-role client
certificate) and the fleet's trust roots as the root sent them (``D/trust-root.json``,
``D/trust-roots/``): the region carries the fleet's roots to its devices; it has no root or
publisher key of its own. :class:`ParentFiles` reads them back for the link
(:mod:`hub.controllers.parentlink.link`), which renews the certificate (:func:`renewal_due`,
:func:`make_csr`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from edgefleet import pinning
from edgefleet.configfiles import parse_host_port
from edgefleet.errors import EdgefleetError
from edgefleet.failover import address_list, split_addresses
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic
from edgefleet.pinning import parse_pin
from edgefleet.trust.documents import Root, parse_root
from edgefleet.trust.envelopes import ROOT_TYPE, decode_payload, parse_envelope_bytes
from edgefleet.v1 import federation_pb2, federation_pb2_grpc
from hub import pki
from hub.initializing import HubPaths
from hub.state.trustroots import HISTORY_DIR, ROOT_FILE

log = get_logger(__name__)

PARENT_FILE = "parent.json"
PARENT_CA_FILE = "parent-ca.crt"
FEDERATION_CERT_FILE = "federation.crt"
FEDERATION_KEY_FILE = "federation.key"


class FederationError(EdgefleetError):
    """Enrolling with a parent hub failed, or the parent's answer is unusable."""


def fleet_root_of(signed: bytes) -> Root | None:
    """The fleet trust root this hub holds, parsed (None: it holds none)."""
    if not signed:
        return None
    env = parse_envelope_bytes(signed, what="the fleet trust root")
    return parse_root(decode_payload(env, expected_type=ROOT_TYPE, what="the fleet trust root"))


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
    request = federation_pb2.EnrollHubRequest(
        token=token, csr_pem=make_csr(key, region), region=region
    )
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


def make_csr(key: Any, region: str) -> bytes:
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
