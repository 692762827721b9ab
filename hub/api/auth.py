"""Authorization of gRPC calls by the caller's client certificate (mutual TLS).

The TLS handshake has already verified the certificate chain to the hub CA. Here the role and
name come out of the certificate's SPIFFE URI (:func:`hub.pki.identity_from_certificate`), the
role must be one the service allows, the region must be this hub's, and the serial must not be
revoked. grpc's Python API has no hook into the handshake for a revocation list, so a revoked
certificate completes the TLS handshake and is refused at its first call (and open streams of
that device are closed when it is revoked).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from edgefleet.errors import IdentityError
from hub import pki
from hub.pki import Identity, Role


@dataclass(frozen=True, slots=True)
class Caller:
    identity: Identity
    serial: str  # hex

    @property
    def name(self) -> str:
        return self.identity.name

    @property
    def role(self) -> Role:
        return self.identity.role


def caller_of(context: grpc.aio.ServicerContext, region: str) -> Caller:
    """The verified caller; raises IdentityError saying why there is none."""
    pems = context.auth_context().get("x509_pem_cert") or ()
    if not pems:
        raise IdentityError("the call carries no client certificate")
    cert = pki.load_certificate(pems[0])
    identity = pki.identity_from_certificate(cert)
    if identity.region != region:
        raise IdentityError(
            f"the certificate is for region {identity.region!r}, this hub serves {region!r}"
        )
    return Caller(identity, format(cert.serial_number, "x"))


async def authorize(
    context: grpc.aio.ServicerContext, *, region: str, revoked: dict[str, str], roles: set[Role]
) -> Caller:
    """The caller if it may call this service; otherwise the call is aborted with the reason."""
    try:
        caller = caller_of(context, region)
    except IdentityError as exc:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        raise AssertionError("unreachable") from None
    if caller.serial in revoked:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            f"certificate {caller.serial} of {caller.role.value} {caller.name} has been revoked",
        )
    if caller.role not in roles:
        allowed = " or ".join(sorted(r.value for r in roles))
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"a {caller.role.value} certificate may not call this service (needs {allowed})",
        )
    return caller
