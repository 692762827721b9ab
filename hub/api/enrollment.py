"""EnrollmentService: a device joins with a bootstrap token and a CSR from its identity key.

Served on the hub's enrollment port, which is TLS without client certificates (the device has
none yet; it pins the hub CA by hash instead). The order of checks makes bad input change
nothing: request fields, then the token (without using it up), then the CSR (signed by the
hub CA only if its self-signature verifies), then the name; only then is a single-use token
consumed and the device record written.

Labels: the token's labels win. A device may add labels of its own only where its token
allows it (not at all with ``no_device_labels``, only keys under ``device_label_prefix`` if set),
never a key the token sets to another value, and never a key reserved in ``[enrollment]
reservedLabels`` (those are for tokens and ``edgectl label`` alone, like Kubernetes'
NodeRestriction): :func:`enrollment_labels` decides, purely. The device record keeps which
keys the device asked for (``own_labels``): a Secret never follows those
(:mod:`hub.decide.labeltrust`).

Guessing: attempts are rate limited per source address and, for refused attempts, per token
id (:mod:`hub.api.ratelimit`): when a token id's refusals exceed its rate, addresses refused in
the last 10 minutes are held off it, while a device at another address (which has the
secret) still enrolls. Every refusal of a token looks the same from outside
(UNAUTHENTICATED, one message, the secret hashed and compared even for an unknown id), so
refusals do not tell which token ids exist; the hub's log says exactly why, and so does an
event on the token when the id exists.

TPM: a device whose EK certificate the hub verifies is offered an attestation key bound to
that EK, and the EK's hash (:func:`edgefleet.trust.tpmbinding.ek_sha256`) goes with the offer
into the device record (``ekSha256`` once the key is activated). One genuine TPM backs one
device record: a second enrollment with the same EK is ALREADY_EXISTS ``EkInUse``, naming
the record that holds it, unless its token was made with ``hub token create
--allow-shared-ek`` (:func:`shared_ek_refusal`, pure).
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path

import grpc
from cryptography import x509

from edgefleet import devicenames
from edgefleet.api.meta import label_key, label_value
from edgefleet.errors import (
    CompareFailed,
    CsrRejected,
    PkiError,
    StoreError,
    TokenError,
    TokenRefusal,
    TrustError,
)
from edgefleet.logs import get_logger
from edgefleet.v1 import enrollment_pb2, enrollment_pb2_grpc
from hub import pki
from hub.api.ratelimit import Rate, RateLimiter
from hub.config import EnrollmentConfig
from hub.decide.devices import Device
from hub.state import storekeys, tokens
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.store import Compare, Put, Store
from hub.state.trustroots import HubRoots
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

MAX_LABELS = 64
NAME_ATTEMPTS = 5
"""Names tried for a device enrolled without one whose derived name is taken."""

REFUSED = (
    "enrollment refused: the bootstrap token is not valid (unknown, wrong, expired or used "
    "up); ask the operator for a new one"
)
"""The one answer to every refused token (the hub's log and events say which it was)."""
RATE_LIMITED = "too many enrollment attempts; retry in {:.0f}s"
REFUSED_SOURCE_MEMORY_S = 600.0
MAX_REFUSED_SOURCES = 10_000


def is_reserved(key: str, reserved: Sequence[str]) -> bool:
    """Whether ``key`` is one of ``reserved`` or under one of its prefixes (ending in "/")."""
    return any(key.startswith(r) if r.endswith("/") else key == r for r in reserved)


def enrollment_labels(
    record: tokens.TokenRecord, requested: Mapping[str, str], reserved: Sequence[str]
) -> tuple[dict[str, str], list[str]]:
    """The labels a device enrolls with and every problem with what it asked for (pure).

    The token's labels always win; a request that would override one is a problem, not
    silently overridden, so the device learns why it is refused."""
    problems = []
    own = {k: v for k, v in requested.items() if record.labels.get(k) != v}
    if own and not record.device_labels:
        problems.append(
            f"labels: this bootstrap token does not let devices add labels "
            f"(asked for {', '.join(sorted(own))})"
        )
        own = {}
    for key, value in sorted(own.items()):
        if key in record.labels:
            problems.append(
                f"labels[{key!r}]: set to {record.labels[key]!r} by the bootstrap token; "
                f"a device cannot change it (asked for {value!r})"
            )
        elif is_reserved(key, reserved):
            problems.append(
                f"labels[{key!r}]: reserved for bootstrap tokens and edgectl label "
                "([enrollment] reservedLabels)"
            )
        elif record.device_label_prefix and not key.startswith(record.device_label_prefix):
            problems.append(
                f"labels[{key!r}]: this bootstrap token lets devices add only keys starting "
                f"with {record.device_label_prefix!r}"
            )
    return {**own, **record.labels}, problems


def source_of(peer: str) -> str:
    """The address part of a grpc peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1 : rest.find("]")]
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return peer


def check_request(request: enrollment_pb2.EnrollRequest) -> list[str]:
    """Every problem with the request's own fields (pure)."""
    problems = []
    if request.name and not devicenames.is_name(request.name):
        problems.append(
            f"name: must be a DNS label (lower-case letters, digits and '-', at most 63), "
            f"got {request.name!r}"
        )
    hostname_problem = devicenames.check_hostname(request.hostname)
    if hostname_problem is not None:
        problems.append(f"hostname: {hostname_problem}")
    if len(request.labels) > MAX_LABELS:
        problems.append(f"labels: at most {MAX_LABELS}, got {len(request.labels)}")
    for key, value in sorted(request.labels.items()):
        for convert, what in ((label_key, key), (label_value, value)):
            try:
                convert(what)
            except ValueError as exc:
                problems.append(f"labels[{key!r}]: {exc}")
    if not request.csr_pem:
        problems.append("csr_pem: required (a PEM CSR signed by the device identity key)")
    tpm_fields = (request.ek_certificate, request.ek_public, request.ak_public)
    if any(tpm_fields) and not all(tpm_fields):
        problems.append("ek_certificate, ek_public, ak_public: all three or none")
    return problems


EK_CA_DIR = "ek-cas"  # D/ek-cas/*.pem: the TPM manufacturers' EK-issuing CAs this hub trusts


def offer_attestation_key(
    ek_cas: Path, request: enrollment_pb2.EnrollRequest, *, now: float
) -> tuple[dict[str, str] | None, enrollment_pb2.EnrollResponse]:
    """The attestation-key part of enrollment: (the offer to keep in the device record, the
    response fields); ``ek_cas`` is the folder of EK-issuing CAs (``D/ek-cas/*.pem``). An AK
    that is not an attestation key is bad input (TrustError AttestationKeyInvalid/EkMismatch,
    raised); an EK certificate this hub cannot verify, or a hub without tpm2-pytss, leaves
    the device software-attested (``ak_refused`` says why)."""
    from edgefleet.trust import tpmbinding

    try:
        ak = tpmbinding.check_attestation_key(bytes(request.ak_public))
        cas = tpmbinding.load_ca_certificates(p.read_bytes() for p in sorted(ek_cas.glob("*.pem")))
        ek = tpmbinding.verify_ek_certificate(
            bytes(request.ek_certificate), cas, bytes(request.ek_public), now=now
        )
        _, challenge = tpmbinding.make_ak_challenge(ek, ak)
    except TrustError as exc:
        if exc.reason in ("AttestationKeyInvalid", "EkMismatch"):
            raise
        return None, enrollment_pb2.EnrollResponse(ak_refused=f"{exc.reason}: {exc}")
    offer = {
        "akPem": ak.pem,
        "secretSha256": challenge.secret_sha256,
        "ekSha256": tpmbinding.ek_sha256(bytes(request.ek_certificate)),
    }
    return offer, enrollment_pb2.EnrollResponse(
        ak_credential_blob=challenge.credential_blob,
        ak_encrypted_secret=challenge.encrypted_secret,
    )


def shared_ek_refusal(
    ek_sha256: str, devices: Iterable[Device], *, allowed: bool, name: str
) -> str | None:
    """Why a device ``name`` whose TPM has the EK ``ek_sha256`` may not be enrolled, or None
    (pure). One genuine TPM backs one device record: another record whose attestation key is
    bound to that EK, or offered with it and not activated yet, is a refusal unless the
    token allows it (``allowed``: ``hub token create --allow-shared-ek``)."""
    if not ek_sha256 or allowed:
        return None
    holders = sorted(
        d.name
        for d in devices
        if d.name != name
        and (d.ek_sha256 == ek_sha256 or (d.ak_offer or {}).get("ekSha256") == ek_sha256)
    )
    if not holders:
        return None
    return (
        f"EkInUse: the TPM of this device (EK sha256 {ek_sha256}) already backs device(s) "
        f"{', '.join(holders)}: one TPM, one device record. Delete the old record "
        f"(edgectl delete device {holders[0]}), or enroll with a token made with "
        "hub token create --allow-shared-ek"
    )


class EnrollmentServicer(enrollment_pb2_grpc.EnrollmentServiceServicer):
    """EnrollmentService (the module doc); hub.server builds it with what it uses."""

    def __init__(
        self,
        store: Store,
        cache: Cache,
        writer: DeviceWriter,
        projector: Projector,
        ca: pki.CertifiedKey,
        *,
        region: str,
        limits: EnrollmentConfig,
        device_lifetime_s: float,
        replica_addresses: Sequence[str],
        ek_cas: Path,
        clock: Callable[[], float],
    ) -> None:
        self.store = store  # the tokens, the device records
        self.cache = cache
        self.writer = writer
        self.projector = projector  # an enrolled device is projected
        self.ca = ca  # signs the device's certificate
        self.region = region
        self.limits = limits  # [enrollment]: the rates, the reserved labels
        self.device_lifetime_s = device_lifetime_s  # [certificates] deviceLifetime
        self.replica_addresses = tuple(replica_addresses)  # told to the device (hubAddresses)
        self.ek_cas = ek_cas  # D/ek-cas/: the TPM manufacturers' CAs (offer_attestation_key)
        self.clock = clock
        self.per_source = RateLimiter(Rate(limits.per_source_rate, limits.per_source_burst))
        self.per_token = RateLimiter(
            Rate(limits.per_token_failure_rate, limits.per_token_failure_burst)
        )
        self.refused_sources: OrderedDict[str, float] = OrderedDict()  # source -> last refusal

    def _recently_refused(self, source: str, now: float) -> bool:
        at = self.refused_sources.get(source)
        return at is not None and now - at < REFUSED_SOURCE_MEMORY_S

    async def _refuse(
        self, context: grpc.aio.ServicerContext, exc: TokenError, token_id: str, source: str
    ) -> None:
        now = self.clock()
        within_rate = self.per_token.allow(token_id, now)
        self.refused_sources[source] = now
        self.refused_sources.move_to_end(source)
        while len(self.refused_sources) > MAX_REFUSED_SOURCES:
            self.refused_sources.popitem(last=False)
        log.warning("enrollment refused", reason=exc.reason.value, token=token_id, source=source)
        # An event on a token that exists, at most at the token's refusal rate: no store writes
        # for made-up ids, nor a flood of them while a known id is being guessed.
        if exc.reason is not TokenRefusal.UNKNOWN and within_rate:
            self.writer.event("Token", token_id, "Warning", "EnrollmentRefused", str(exc))
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)

    def _name_for(self, request: enrollment_pb2.EnrollRequest, taken: Container[str] = ()) -> str:
        """The name asked for; else one from the hostname (edgefleet.devicenames), with a
        random suffix when a device holds it (or it is in ``taken``: found held in the
        store); else ``device-XXXXXXXX``."""
        if request.name:
            return request.name
        base = devicenames.name_from_hostname(request.hostname)
        if base is None:
            return f"device-{secrets.token_hex(4)}"
        name = base
        for _ in range(NAME_ATTEMPTS):
            if name not in self.cache.devices and name not in taken:
                return name
            name = devicenames.with_suffix(base, secrets.token_hex(devicenames.SUFFIX_CHARS // 2))
        return name  # taken too (astronomically unlikely): the store's compare decides

    async def _certify(
        self, context: grpc.aio.ServicerContext, request: enrollment_pb2.EnrollRequest, name: str
    ) -> x509.Certificate:
        """The device certificate for ``name`` from the request's CSR (INVALID_ARGUMENT when
        the CSR is refused)."""
        identity = pki.Identity(pki.Role.DEVICE, name, self.region)
        try:
            return pki.sign_device_csr(
                self.ca,
                request.csr_pem,
                identity,
                lifetime=timedelta(seconds=self.device_lifetime_s),
            )
        except (CsrRejected, PkiError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"csr_pem: {exc}")
            raise AssertionError("unreachable") from None

    async def Enroll(
        self, request: enrollment_pb2.EnrollRequest, context: grpc.aio.ServicerContext
    ) -> enrollment_pb2.EnrollResponse:
        """A store that fails (etcd without a leader, a member cut off) is UNAVAILABLE, which
        edged's enroll may try again, as the admin API answers; it was an unexpected error
        (UNKNOWN, a traceback logged) until the soak harness found it (docs/soak.md)."""
        try:
            return await self._enroll(request, context)
        except StoreError as exc:
            log.error("enrollment store failed", error=str(exc))
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"the hub's store failed: {exc}; try again (should the token then be "
                "refused, this attempt used it up: see edgectl get devices)",
            )
            raise AssertionError("unreachable: context.abort raises") from None

    async def _enroll(
        self, request: enrollment_pb2.EnrollRequest, context: grpc.aio.ServicerContext
    ) -> enrollment_pb2.EnrollResponse:
        now = self.clock()
        source = source_of(context.peer() or "")
        if not self.per_source.allow(source, now):
            log.warning("enrollment rate limited", source=source, limit="source")
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                RATE_LIMITED.format(max(1.0, self.per_source.retry_after(source, now))),
            )
        problems = check_request(request)
        try:
            token_id = tokens.token_id_of(request.token)
        except TokenError as exc:
            problems.append(f"token: {exc}")
        if problems:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        # A token id whose secret is being guessed is held off for the guessers, not for a
        # device at another address that has not been refused: it has the secret.
        if not self.per_token.would_allow(token_id, now) and self._recently_refused(source, now):
            log.warning("enrollment rate limited", source=source, token=token_id, limit="token")
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                RATE_LIMITED.format(max(1.0, self.per_token.retry_after(token_id, now))),
            )
        try:
            record = await tokens.validate(self.store, request.token, now=now)
        except TokenError as exc:
            await self._refuse(context, exc, token_id, source)
            raise AssertionError("unreachable") from None
        if record.for_region:  # a regional hub's token (hub.api.federation) enrolls no device
            await self._refuse(
                context,
                TokenError(
                    TokenRefusal.WRONG_PURPOSE,
                    f"bootstrap token {record.id} is for the regional hub {record.for_region}",
                ),
                token_id,
                source,
            )
        labels, label_problems = enrollment_labels(
            record, request.labels, self.limits.reserved_labels
        )
        if label_problems:
            log.warning("enrollment labels refused", token=record.id, problems=label_problems)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(label_problems))
        name = self._name_for(request)
        existing = self.cache.devices.get(name)
        if existing is not None:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS,
                f"a device named {name!r} is already enrolled; delete it first "
                f"(edgectl delete device {name}) or choose another --name",
            )
        certificate = await self._certify(context, request, name)
        offer: dict[str, str] | None = None
        tpm_answer = enrollment_pb2.EnrollResponse()
        if request.ak_public:
            try:
                offer, tpm_answer = offer_attestation_key(self.ek_cas, request, now=now)
            except TrustError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{exc.reason}: {exc}")
            shared = shared_ek_refusal(
                (offer or {}).get("ekSha256", ""),
                self.cache.devices.values(),
                allowed=record.allow_shared_ek,
                name=name,
            )
            if shared is not None:
                log.warning("enrollment refused", reason="EkInUse", token=record.id, device=name)
                await context.abort(grpc.StatusCode.ALREADY_EXISTS, shared)
        try:
            record = await tokens.consume(self.store, request.token, now=now)
        except TokenError as exc:  # used by a concurrent enrollment meanwhile
            await self._refuse(context, exc, token_id, source)
        taken: set[str] = set()
        for attempt in range(NAME_ATTEMPTS):
            device = Device(
                name,
                labels=labels,
                own_labels=frozenset(labels) - set(record.labels),  # the device asked for these
                certificate_serial=format(certificate.serial_number, "x"),
                public_key_pem=pki.public_key_pem(certificate),
                enrolled_at=now,
                ak_offer=offer,
            )
            how = f"enrolled with bootstrap token {record.id}"
            if not request.name and request.hostname:  # bounded by check_request
                how += f"; named after its hostname {request.hostname!r}"
            event = self.writer.prepare_event("Device", name, "Normal", "Enrolled", how)
            try:
                revision = await self.store.txn(
                    [Compare(storekeys.device_key(name), 0)],
                    [Put(storekeys.device_key(name), storekeys.dumps(device.to_json())), event.put],
                )
                break
            except CompareFailed:
                if request.name or attempt + 1 == NAME_ATTEMPTS:
                    await context.abort(
                        grpc.StatusCode.ALREADY_EXISTS,
                        f"a device named {name!r} was enrolled meanwhile",
                    )
                # a name the hub chose was taken meanwhile (another replica, a device with
                # the same hostname): another one, and a certificate for it
                taken.add(name)
                name = self._name_for(request, taken)
                certificate = await self._certify(context, request, name)
        self.cache.put_device(device)
        self.writer.observed(name, revision, device.to_json())
        self.writer.committed(event)
        if tpm_answer.ak_refused:
            self.writer.event(
                "Device", name, "Warning", "AttestationKeyRefused", tpm_answer.ak_refused
            )
        self.projector.mark([name])
        log.info(
            "device enrolled",
            device=name,
            token=record.id,
            source=source,
            tpm_offer=offer is not None,
        )
        response = enrollment_pb2.EnrollResponse(
            certificate_chain_pem=pki.certificate_pem(certificate),
            ca_certificate_pem=pki.certificate_pem(self.ca.certificate),
            trust_root=HubRoots(self.cache.trust_roots).enrollment_bytes(),
            device_name=name,
            hub_addresses=list(self.replica_addresses),
        )
        response.MergeFrom(tpm_answer)
        return response
