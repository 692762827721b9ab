"""EnrollmentService: a device joins with a bootstrap token and a CSR from its identity key.

Served on the hub's enrollment port, which is TLS without client certificates (the device has
none yet; it pins the hub CA by hash instead). The order of checks makes bad input change
nothing: request fields, then the token (without using it up), then the CSR (signed by the
hub CA only if its self-signature verifies), then the name; only then is a single-use token
consumed and the device record written.
"""

from __future__ import annotations

import re
import secrets
from datetime import timedelta

import grpc

from edgefleet.api.meta import label_key, label_value
from edgefleet.errors import CompareFailed, CsrRejected, PkiError, TokenError, TokenRefusal
from edgefleet.logs import get_logger
from edgefleet.v1 import enrollment_pb2, enrollment_pb2_grpc
from hub import pki, storekeys, tokens
from hub.context import HubContext
from hub.devices import Device

log = get_logger(__name__)

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_LABELS = 64

_TOKEN_STATUS = {
    TokenRefusal.MALFORMED: grpc.StatusCode.INVALID_ARGUMENT,
    TokenRefusal.UNKNOWN: grpc.StatusCode.UNAUTHENTICATED,
    TokenRefusal.WRONG_SECRET: grpc.StatusCode.UNAUTHENTICATED,
    TokenRefusal.EXPIRED: grpc.StatusCode.UNAUTHENTICATED,
    TokenRefusal.ALREADY_USED: grpc.StatusCode.PERMISSION_DENIED,
}


def check_request(request: enrollment_pb2.EnrollRequest) -> list[str]:
    """Every problem with the request's own fields (pure)."""
    problems = []
    if request.name and not _NAME.fullmatch(request.name):
        problems.append(
            f"name: must be a DNS label (lower-case letters, digits and '-', at most 63), "
            f"got {request.name!r}"
        )
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
    return problems


class EnrollmentServicer(enrollment_pb2_grpc.EnrollmentServiceServicer):
    def __init__(self, ctx: HubContext) -> None:
        self.ctx = ctx

    async def Enroll(
        self, request: enrollment_pb2.EnrollRequest, context: grpc.aio.ServicerContext
    ) -> enrollment_pb2.EnrollResponse:
        ctx = self.ctx
        problems = check_request(request)
        if problems:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        now = ctx.clock()
        try:
            record = await tokens.validate(ctx.store, request.token, now=now)
        except TokenError as exc:
            log.warning("enrollment refused", reason=exc.reason.value)
            await context.abort(_TOKEN_STATUS[exc.reason], str(exc))
            raise AssertionError("unreachable") from None
        name = request.name or f"device-{secrets.token_hex(4)}"
        existing = ctx.cache.devices.get(name)
        if existing is not None:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS,
                f"a device named {name!r} is already enrolled; delete it first "
                f"(edgectl delete device {name}) or choose another --name",
            )
        identity = pki.Identity(pki.Role.DEVICE, name, ctx.region)
        try:
            certificate = pki.sign_device_csr(
                ctx.ca,
                request.csr_pem,
                identity,
                lifetime=timedelta(seconds=ctx.config.certificates.device_lifetime_s),
            )
        except (CsrRejected, PkiError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"csr_pem: {exc}")
            raise AssertionError("unreachable") from None
        try:
            record = await tokens.consume(ctx.store, request.token, now=now)
        except TokenError as exc:  # used by a concurrent enrollment meanwhile
            await context.abort(_TOKEN_STATUS[exc.reason], str(exc))
        device = Device(
            name,
            labels={**record.labels, **dict(request.labels)},
            certificate_serial=format(certificate.serial_number, "x"),
            public_key_pem=pki.public_key_pem(certificate),
            enrolled_at=now,
        )
        try:
            await ctx.store.put(
                storekeys.device_key(name),
                storekeys.dumps(device.to_json()),
                expect_mod_revision=0,
            )
        except CompareFailed:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS, f"a device named {name!r} was enrolled meanwhile"
            )
        ctx.cache.devices[name] = device
        ctx.writer.event(
            "Device", name, "Normal", "Enrolled", f"enrolled with bootstrap token {record.id}"
        )
        ctx.projector.mark([name])
        log.info("device enrolled", device=name, token=record.id)
        return enrollment_pb2.EnrollResponse(
            certificate_chain_pem=pki.certificate_pem(certificate),
            ca_certificate_pem=pki.certificate_pem(ctx.ca.certificate),
            trust_root=ctx.trust_root,
            device_name=name,
        )
