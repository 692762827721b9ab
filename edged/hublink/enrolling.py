"""``edged enroll``: join a hub with a bootstrap token.

1. The hub's CA is fetched from its enrollment port over TLS *without* verification, and
   accepted only if it matches the pin printed with the token (``--ca-hash sha256:<hex of the
   CA certificate's SubjectPublicKeyInfo>``, as kubeadm does). From then on every connection
   verifies the hub against that CA.
2. The device identity key (``D/identity/key.pem``, mode 0600; see edged.trust.identity) signs
   a CSR; the hub answers with a short-lived certificate, its CA and the fleet's trust roots.
   Without ``--name`` the request carries the hostname and the hub names the device after it
   (:mod:`edgefleet.devicenames`: made a DNS label, a suffix only when the name is taken).
3. Trust in the fleet's root is never taken from the hub (no trust on first use): the device
   starts from the root in its image (``trust.rootFile``) or from one pinned out of band
   (``--root-hash sha256:<hex of the root's payload digest>``, printed by ``edgectl trust root
   create`` and ``hub token create``); without either, enrollment refuses before it spends the
   token. The hub's roots must chain from that anchor (old and new root thresholds); a root of
   an accepted version with other content is a conflict, and enrollment fails.
4. Written atomically under ``D/hub/``: ``ca.crt``, ``device.crt``, ``link.json`` (hub
   addresses: those given, ``--hub A,B``, then the replicas the hub names in its answer;
   device name); the trust root goes through the trust gate (``D/trust/root.json``);
   the operator's ``--label``s go to ``D/labels.json`` (published by discovery).

The private key never leaves the device. grpc's Python API cannot use a TPM-held key for TLS,
so the identity (TLS) key is the file key. With a TPM (``trust.tpm``), enrollment also makes an
attestation key in it and the hub binds that key to the TPM's endorsement key (EK certificate
checked against the manufacturer CAs the hub trusts, then MakeCredential/ActivateCredential,
:mod:`edgefleet.trust.tpmbinding`): from then on the hub accepts only evidence with a quote
by that key. A hub that cannot verify the EK leaves the device software-attested.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.hublink.files import LinkFiles, hub_addresses, parse_address
from edged.trust.admitting import ArtifactGate
from edged.trust.tpmattesting import EnrollmentMaterial, TpmAttestationKey
from edgefleet import pinning
from edgefleet.errors import EdgefleetError, PkiError, TrustError
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic, write_json_atomic
from edgefleet.pinning import parse_pin
from edgefleet.trust.verifying import parse_root_pin

log = get_logger(__name__)


class EnrollError(EdgefleetError):
    """Enrollment failed; the message says why and what to do."""


def fetch_presented_chain(host: str, port: int, *, timeout: float = 10.0) -> list[bytes]:
    """The certificates (DER) the hub's enrollment port presents, read without verifying them."""
    try:
        return pinning.fetch_presented_chain(host, port, timeout=timeout)
    except OSError as exc:
        raise EnrollError(f"cannot reach the hub's enrollment port {host}:{port}: {exc}") from None


def pinned_ca(chain: list[bytes], pin: str) -> bytes:
    """The presented CA certificate matching ``pin``, as PEM; EnrollError if none does."""
    try:
        expected = parse_pin(pin)
    except PkiError:
        raise EnrollError(f"--ca-hash must look like sha256:<64 hex digits>, got {pin!r}") from None
    found = pinning.find_pinned(chain, expected)
    if found is None:
        raise EnrollError(
            "the hub presented no CA certificate matching --ca-hash "
            f"({len(chain)} certificates presented): wrong hub, or a machine in the middle"
        )
    return found


def trust_anchor(
    data_dir: Path, *, root_file: Path | None, root_hash: str | None, tpm: str = "off"
) -> tuple[ArtifactGate, str | None]:
    """The trust gate enrollment verifies the hub's roots with, and the pinned root digest
    (None when the device already trusts a root). Refuses (EnrollError) when the device has
    no root of its own — none accepted before, none in the image — and no ``--root-hash``."""
    from edged.trust.admitting import ArtifactGate

    pin = None
    if root_hash is not None:
        try:
            pin = parse_root_pin(root_hash)
        except TrustError:
            raise EnrollError(
                f"--root-hash must look like sha256:<64 hex digits>, got {root_hash!r}"
            ) from None
    from edged.trust.identity import resolve_tcti
    from edged.trust.tpmcounter import TpmCounter

    tcti = resolve_tcti(tpm)
    gate = ArtifactGate(
        data_dir,
        root_file=root_file,
        allow_unsigned=False,
        # an older trust state restored is refused; a new one (enrolling is deliberate)
        # starts at the TPM's count
        counter=TpmCounter(tcti) if tcti is not None else None,
        adopt_counter=True,
    )
    gate.refresh_root(time.time())  # the image's root, when there is one
    if gate.blocked is not None or (gate.root is None and gate.root_problem is not None):
        reason, message = gate.blocked or gate.root_problem or ("", "")
        raise EnrollError(f"the device's trust root is unusable: {reason}: {message}")
    if gate.root is None and pin is None:
        where = f" ({root_file} does not exist)" if root_file is not None else ""
        raise EnrollError(
            "no trust root to verify the hub's with: install the fleet's root in the image "
            f"(trust.rootFile{where}) or give --root-hash sha256:<hex> (printed by "
            "`edgectl trust root create` and `hub token create`); a root taken from the hub "
            "on trust alone would let that hub sign models"
        )
    return gate, pin


def accept_hub_roots(gate: ArtifactGate, pin: str | None, roots: bytes, *, now: float) -> None:
    """Accept the hub's roots into ``gate``: from the pin when the device had no root, else
    chained from the one it has; and a pin given beside an image root must name a root on
    the accepted chain. EnrollError when refused."""
    if not roots:
        if gate.root is None:
            raise EnrollError("the hub sent no trust root, and the device has none")
        return
    try:
        gate.accept_roots(roots, now, origin="the hub's trust root", anchor=pin)
    except TrustError as exc:
        raise EnrollError(f"the hub's trust root was refused: {exc.reason}: {exc}") from None
    if pin is not None and pin not in gate.state.root_digests.values():
        raise EnrollError(
            f"the hub's trust root was refused: RootPinMismatch: no accepted root has the "
            f"pinned digest sha256:{pin}"
        )


@dataclass(frozen=True, slots=True)
class Enrolled:
    device_name: str
    certificate_not_after: float
    attestation: str = "software"  # "tpm" once the hub bound the TPM attestation key


def attestation_key_material(data_dir: Path, tpm: str) -> EnrollmentMaterial | None:
    """A new attestation key in the TPM that ``tpm`` (trust.tpm) selects, and what the hub
    needs to bind it; None without a TPM. A TPM that cannot make one fails enrollment."""
    from edged.trust.identity import resolve_tcti
    from edged.trust.tpmattesting import TpmAttestationError, TpmAttestationKey

    tcti = resolve_tcti(tpm)
    if tcti is None:
        TpmAttestationKey.forget(data_dir)
        return None
    try:
        with TpmAttestationKey.create(data_dir, tcti) as key:
            return key.enrollment_material()
    except TpmAttestationError as exc:
        TpmAttestationKey.forget(data_dir)
        raise EnrollError(
            f'{exc} (set trust.tpm = "off" to enroll without TPM attestation)'
        ) from None


async def bind_attestation_key(
    data_dir: Path, tpm: str, resp: Any, *, hub: str, ca_pem: bytes
) -> str:
    """Activate the hub's credential with the TPM and send the secret back: "tpm" when the
    hub bound the key. Otherwise the device stays software-attested (the key is forgotten,
    the reason logged): enrollment itself has succeeded at the hub by then."""
    import grpc

    from edged.trust.identity import resolve_tcti
    from edged.trust.tpmattesting import (
        SealingKeyMaterial,
        TpmAttestationError,
        TpmAttestationKey,
        TpmSealingKey,
    )
    from edgefleet.trust.tpmbinding import sealing_qualifying_data
    from edgefleet.v1 import device_pb2, device_pb2_grpc

    if not resp.ak_credential_blob:
        log.warning("attestation key not bound", reason=resp.ak_refused or "no credential")
        TpmAttestationKey.forget(data_dir)
        return "software"
    tcti = resolve_tcti(tpm)
    assert tcti is not None

    def activate() -> tuple[bytes, SealingKeyMaterial | None]:
        key = TpmAttestationKey.load(data_dir, tcti)
        if key is None:
            raise TpmAttestationError("the attestation key file is gone")
        with key:
            secret = key.activate(bytes(resp.ak_credential_blob), bytes(resp.ak_encrypted_secret))
            # the key the hub seals TPM-only Secrets to, certified by the AK for this
            # enrollment (edgefleet.trust.tpmbinding.check_sealing_key); a TPM that cannot
            # make one still binds the AK (such Secrets are then not sent to this device)
            try:
                return secret, key.make_sealing_key(sealing_qualifying_data(secret))
            except TpmAttestationError as exc:
                log.warning("sealing key not made", error=str(exc))
                return secret, None

    TpmSealingKey.forget(data_dir)
    try:
        secret, sealing = await asyncio.to_thread(activate)
        identity_key = (data_dir / "identity" / "key.pem").read_bytes()
        creds = grpc.ssl_channel_credentials(
            root_certificates=ca_pem,
            private_key=identity_key,
            certificate_chain=bytes(resp.certificate_chain_pem),
        )
        async with grpc.aio.secure_channel(hub, creds) as channel:
            stub = device_pb2_grpc.DeviceServiceStub(channel)  # type: ignore[no-untyped-call]
            answer = await stub.ActivateAttestationKey(
                device_pb2.ActivateAttestationKeyRequest(
                    secret=secret,
                    **(
                        {
                            "sealing_key_public": sealing.public,
                            "sealing_key_attest": sealing.attest,
                            "sealing_key_signature_r": sealing.r,
                            "sealing_key_signature_s": sealing.s,
                        }
                        if sealing is not None
                        else {}
                    ),
                ),
                timeout=30,
            )
    except (TpmAttestationError, grpc.aio.AioRpcError, OSError) as exc:
        detail = (
            f"{exc.code().name}: {exc.details()}"
            if isinstance(exc, grpc.aio.AioRpcError)
            else str(exc)
        )
        log.error("attestation key not bound", error=detail)
        TpmAttestationKey.forget(data_dir)
        return "software"
    if sealing is not None and answer.sealing_key_recorded:
        sealing.save(data_dir)
    elif sealing is not None:
        log.warning("sealing key not recorded", reason=answer.sealing_key_refused or "old hub")
    return "tpm"


async def enroll(
    data_dir: Path,
    *,
    hub: str,
    token: str,
    labels: Mapping[str, str],
    name: str = "",
    hostname: str | None = None,
    ca_hash: str | None,
    root_file: Path | None = None,
    root_hash: str | None = None,
    enroll_address: str | None = None,
    tpm: str = "off",
    force: bool = False,
) -> Enrolled:
    import grpc

    from edged.trust.identity import FileIdentity, load_or_create_identity
    from edgefleet.v1 import enrollment_pb2, enrollment_pb2_grpc

    files = LinkFiles(data_dir)
    if files.link.exists() and not force:
        raise EnrollError(
            f"{data_dir} is already enrolled ({files.link}); use --force to enroll again"
        )
    given = hub_addresses([a.strip() for a in hub.split(",")])
    host, port = parse_address(given[0])
    ehost, eport = parse_address(enroll_address) if enroll_address else (host, port + 1)
    if ca_hash is None:
        raise EnrollError("--ca-hash is required (printed with the token by `hub token create`)")
    gate, anchor = trust_anchor(data_dir, root_file=root_file, root_hash=root_hash, tpm=tpm)
    try:
        chain = await asyncio.to_thread(fetch_presented_chain, ehost, eport)
    except EnrollError:
        if enroll_address or len(given) == 1:
            raise
        # the first replica is down: enroll at the next one that answers (nothing was sent)
        for other in given[1:]:
            host, port = parse_address(other)
            ehost, eport = host, port + 1
            try:
                chain = await asyncio.to_thread(fetch_presented_chain, ehost, eport)
                break
            except EnrollError:
                continue
        else:
            raise
        given = [other, *(a for a in given if a != other)]
    ca_pem = pinned_ca(chain, ca_hash)
    # The TLS identity is a file key (grpc cannot use a TPM key); the TPM, when trust.tpm
    # selects one, holds an attestation key bound to its endorsement key (tpmattesting.py).
    identity = load_or_create_identity(data_dir, tpm="off")
    try:
        assert isinstance(identity, FileIdentity)
        csr = identity.build_csr(name or "edgefleet-device")
    finally:
        identity.close()
    material = await asyncio.to_thread(attestation_key_material, data_dir, tpm)
    request = enrollment_pb2.EnrollRequest(token=token, csr_pem=csr, name=name, labels=dict(labels))
    if not name:  # the hub names it after its hostname (edgefleet.devicenames)
        request.hostname = socket.gethostname() if hostname is None else hostname
    if material is not None:
        request.ek_certificate = material.ek_certificate
        request.ek_public = material.ek_public
        request.ak_public = material.ak_public
    creds = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    try:
        async with grpc.aio.secure_channel(f"{ehost}:{eport}", creds) as channel:
            stub = enrollment_pb2_grpc.EnrollmentServiceStub(channel)  # type: ignore[no-untyped-call]
            try:
                resp = await stub.Enroll(request, timeout=30)
            except grpc.aio.AioRpcError as exc:
                raise EnrollError(
                    f"the hub refused enrollment: {exc.code().name}: {exc.details()}"
                ) from None
        accept_hub_roots(gate, anchor, bytes(resp.trust_root), now=time.time())
    except BaseException:
        TpmAttestationKey.forget(data_dir)  # nothing of a failed enrollment stays
        raise
    attestation = "software"
    if material is not None:
        attestation = await bind_attestation_key(
            data_dir, tpm, resp, hub=f"{host}:{port}", ca_pem=ca_pem
        )
    files.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(files.ca, bytes(resp.ca_certificate_pem), mode=0o644)
    write_atomic(files.certificate, bytes(resp.certificate_chain_pem), mode=0o644)
    write_json_atomic(data_dir / "labels.json", dict(sorted(labels.items())))
    not_after = files.certificate_not_after()
    try:  # the replicas the hub names, after the ones given here
        hubs = hub_addresses([f"{host}:{port}", *given[1:]], list(resp.hub_addresses))
    except ValueError as exc:
        log.warning("hub replica addresses ignored", error=str(exc))
        hubs = hub_addresses([f"{host}:{port}", *given[1:]])
    link: dict[str, object] = {"hub": hubs[0], "deviceName": resp.device_name}
    if len(hubs) > 1:
        link["hubs"] = hubs
    write_json_atomic(files.link, {**link, "enrolledAt": time.time()})
    log.info("enrolled", hub=f"{host}:{port}", device=resp.device_name, attestation=attestation)
    return Enrolled(resp.device_name, not_after, attestation)
