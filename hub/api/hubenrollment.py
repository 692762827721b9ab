"""HubEnrollmentService (the root hub's enrollment port, server TLS): a regional hub joins the
root (docs/federation.md).

A bootstrap token made for a region (``hub token create --for-region R``; a device token
cannot enroll a hub nor a region token a device), a CSR; the answer is a hub-role certificate
``spiffe://edgefleet/<root region>/hub/<region>`` from the root CA, the root CA and the fleet's
trust roots. The region's record ``/regions/R`` (its certificate serial) is written with its
``Enrolled`` event in one transaction; enrolling a region again replaces the serial, so the
older certificate is refused from then on (:mod:`hub.state.regions`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

import grpc

from edgefleet.api.meta import dns_label
from edgefleet.errors import CompareFailed, CsrRejected, PkiError, TokenError
from edgefleet.logs import get_logger
from edgefleet.v1 import federation_pb2, federation_pb2_grpc
from hub import pki
from hub.api.enrollment import REFUSED, source_of
from hub.api.ratelimit import Rate, RateLimiter
from hub.config import EnrollmentConfig
from hub.initializing import HUB_NAME
from hub.pki import Role
from hub.state import storekeys, tokens
from hub.state.cache import Cache
from hub.state.regions import Regions, RegionState, region_key
from hub.state.store import Compare, Put, Store
from hub.state.writer import DeviceWriter

log = get_logger(__name__)


class HubEnrollmentServicer(federation_pb2_grpc.HubEnrollmentServiceServicer):
    """A regional hub joins the root (module doc)."""

    def __init__(
        self,
        store: Store,
        cache: Cache,
        writer: DeviceWriter,
        ca: pki.CertifiedKey,
        regions: Regions,
        *,
        region: str,
        limits: EnrollmentConfig,
        region_lifetime_s: float,
        replica_addresses: Sequence[str],
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.cache = cache
        self.writer = writer
        self.ca = ca
        self.regions = regions
        self.region = region  # this hub's own
        self.region_lifetime = timedelta(seconds=region_lifetime_s)
        self.replica_addresses = tuple(replica_addresses)
        self.clock = clock
        self.per_source = RateLimiter(Rate(limits.per_source_rate, limits.per_source_burst))

    async def EnrollHub(
        self, request: federation_pb2.EnrollHubRequest, context: grpc.aio.ServicerContext
    ) -> federation_pb2.EnrollHubResponse:
        now = self.clock()
        source = source_of(context.peer() or "")
        if not self.per_source.allow(source, now):
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "too many enrollments; retry later"
            )
        problems: list[str] = []
        try:
            dns_label(request.region)
        except ValueError as exc:
            problems.append(f"region: {exc}")
        if request.region in (self.region, HUB_NAME):
            problems.append(f"region: {request.region!r} is this hub's own region or name")
        if len(request.csr_pem) > 16 * 1024:
            problems.append("csr_pem: at most 16 KiB")
        try:
            token_id = tokens.token_id_of(request.token)
        except TokenError as exc:
            problems.append(f"token: {exc}")
        if problems:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        try:
            record = await tokens.validate(self.store, request.token, now=now)
        except TokenError as exc:
            log.warning(
                "hub enrollment refused", reason=exc.reason.value, token=token_id, source=source
            )
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)
            raise AssertionError("unreachable") from None
        if record.for_region != request.region:
            log.warning(
                "hub enrollment refused",
                reason="WrongPurpose",
                token=token_id,
                region=request.region,
            )
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)
        identity = pki.Identity(Role.HUB, request.region, self.region)
        try:
            certificate = pki.sign_child_hub_csr(
                self.ca, request.csr_pem, identity, lifetime=self.region_lifetime
            )
        except (CsrRejected, PkiError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"csr_pem: {exc}")
            raise AssertionError("unreachable") from None
        try:
            await tokens.consume(self.store, request.token, now=now)
        except TokenError:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)
        state = RegionState(
            request.region,
            format(certificate.serial_number, "x"),
            now,
            not_after=certificate.not_valid_after_utc.timestamp(),
        )
        event = self.writer.prepare_event(
            "Region",
            request.region,
            "Normal",
            "Enrolled",
            f"regional hub enrolled with token {record.id}",
        )
        key = region_key(request.region)
        existing = await self.store.get(key)
        try:
            await self.store.txn(
                [Compare(key, existing.mod_revision if existing else 0)],
                [Put(key, storekeys.dumps(state.to_json())), event.put],
            )
        except CompareFailed:
            await context.abort(
                grpc.StatusCode.ABORTED, f"region {request.region} enrolled meanwhile"
            )
        old = self.regions.regions.get(request.region)
        if old is not None:
            state.stored, state.link = old.stored, old.link  # its last report stays shown
            state.stored_devices = old.stored_devices
            if old.stream is not None:
                old.stream.set()  # its certificate is superseded
        self.regions.regions[request.region] = state
        self.writer.committed(event)
        log.info("region enrolled", region=request.region, token=record.id, source=source)
        return federation_pb2.EnrollHubResponse(
            certificate_chain_pem=pki.certificate_pem(certificate),
            ca_certificate_pem=pki.certificate_pem(self.ca.certificate),
            trust_roots=list(self.cache.trust_roots),
            root_region=self.region,
            hub_addresses=list(self.replica_addresses),
        )
