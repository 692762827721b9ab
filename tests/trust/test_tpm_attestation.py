"""TPM attestation that means something, end to end: a real software TPM (swtpm) manufactured by
``swtpm_setup`` with an EK certificate from a local CA, a real hub (``hub init``, SQLite, gRPC
with real certificates on loopback) that trusts that CA, and edged's real enrollment and
challenge answering. What is faked: nothing; the attacker's moves are made with the same TPM.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from hubserving import AdminHub, make_hub_dir
from swtpmek import Tpm, ek_swtpm

from edged.hublink.enrolling import enroll
from edged.trust.attesting import ChallengeAnswerer
from edged.trust.tpmattesting import AK_FILE, TpmAttestationKey
from edgefleet.errors import TrustError
from edgefleet.trust import tpmbinding
from edgefleet.trust.evidence import Policy, verify_evidence
from edgefleet.trust.signing import create_root, generate_key_pair
from edgefleet.trust.verifying import root_digest
from edgefleet.v1 import device_pb2, device_pb2_grpc, enrollment_pb2, enrollment_pb2_grpc
from hub import pki
from hub.controllers.attestation import Challenge, assess
from hub.decide.devices import TrustState
from hub.state import tokens
from hub.state.trustroots import HubRoots, install_roots

POLICY = Policy(
    allowed_code=None,
    allowed_config=None,
    trust_root=None,
    allowed_models=None,
    check_trust_root=False,
)


@pytest.fixture(scope="module")
def tpm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tpm]:
    """swtpm with an RSA EK certificate made by swtpm_setup and a local CA (tests/swtpmek.py);
    fails (does not skip) when swtpm is missing."""
    with ek_swtpm(tmp_path_factory.mktemp, other_ca=True) as t:
        yield t


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


@dataclass
class Fleet:
    hub: AdminHub
    pin: str


async def _hub(tmp_path: Path, ek_ca: Path | None) -> AdminHub:
    paths = await make_hub_dir(tmp_path / "hub")
    if ek_ca is not None:
        (paths.data_dir / "ek-cas").mkdir()
        shutil.copy(ek_ca, paths.data_dir / "ek-cas" / "manufacturer.pem")
    return AdminHub(paths)


def _root(tmp_path: Path) -> tuple[bytes, str]:
    generate_key_pair(tmp_path / "root")
    env = create_root(root_keys=[tmp_path / "root.key"], artifact_keys=[tmp_path / "root.pub"])
    return env.to_bytes(), f"sha256:{root_digest(env)}"


async def _enroll(
    hub: AdminHub, data: Path, pin: str, tcti: str, *, allow_shared_ek: bool = False
) -> Any:
    shared = {"allow_shared_ek": True} if allow_shared_ek else {}
    token, _ = await tokens.create_token(hub.ctx.store, now=time.time(), ttl=600, **shared)
    return await enroll(
        data,
        hub=f"127.0.0.1:{hub.port}",
        enroll_address=f"127.0.0.1:{hub.enroll_port}",
        token=token,
        labels={},
        name=data.name,
        ca_hash=pki.ca_pin(hub.ctx.ca.certificate),
        root_file=data.parent / "no-image-root.json",
        root_hash=pin,
        tpm=tcti,
    )


def _evidence(data: Path, tcti: str, nonce: bytes) -> bytes:
    answerer = ChallengeAnswerer(
        data, config_path=None, trust_root_path=data / "trust" / "root.json",
        model_digests=lambda: [], tpm=tcti,
    )  # fmt: skip
    return answerer._answer(nonce)


def test_an_ek_bound_key_makes_the_device_tpm_attested_and_only_its_quotes_count(
    tpm: Tpm, tmp_path: Path
) -> None:
    root, pin = _root(tmp_path)

    async def main() -> None:
        async with await _hub(tmp_path, tpm.ca) as hub:
            install_roots(hub.ctx.cache, HubRoots((root,)))
            result = await _enroll(hub, tmp_path / "cam-1", pin, tpm.tcti)
            assert result.attestation == "tpm"
            await hub.ctx.writer.flush()
            device = hub.ctx.cache.devices["cam-1"]
            assert device.attestation_key_pem.startswith("-----BEGIN PUBLIC KEY")
            assert device.ak_offer is None
            assert [e["reason"] for e in hub.ctx.cache.events][-1] == "AttestationKeyBound"

            nonce = os.urandom(32)
            evidence = await asyncio.to_thread(_evidence, tmp_path / "cam-1", tpm.tcti, nonce)
            doc = orjson.loads(evidence)
            assert doc["tpm"]["format"] == "ak-quote/v1" and sorted(doc["tpm"]["pcrs"]) == [
                str(i) for i in range(8)
            ]
            verdict = verify_evidence(
                doc, expected_nonce=nonce, identity_public_key=device.public_key_pem,
                policy=POLICY, now=time.time(), attestation_key=device.attestation_key_pem,
            )  # fmt: skip
            assert (verdict.trusted, verdict.tpm_attested) == (True, True), verdict.reasons
            got = assess(
                device, Challenge(nonce, time.time()), evidence=evidence,
                policy=POLICY, now=time.time(), timeout_s=30,
            )  # fmt: skip
            assert got.state is TrustState.TRUSTED, got.reasons

            def reasons(ev: dict[str, Any]) -> list[str]:
                v = verify_evidence(
                    ev, expected_nonce=nonce, identity_public_key=device.public_key_pem,
                    policy=POLICY, now=time.time(), attestation_key=device.attestation_key_pem,
                )  # fmt: skip
                assert not v.trusted and not v.tpm_attested
                return [r.split(":")[0] for r in v.reasons]

            # Measured-boot reference values (a baseline's allowedPcrValues): the quoted PCRs
            # must be among them.
            good = {i: frozenset({doc["tpm"]["pcrs"][str(i)]}) for i in (0, 7)}
            pinned = dataclasses.replace(POLICY, allowed_pcrs=good)
            v = verify_evidence(
                doc, expected_nonce=nonce, identity_public_key=device.public_key_pem,
                policy=pinned, now=time.time(), attestation_key=device.attestation_key_pem,
            )  # fmt: skip
            assert (v.trusted, v.tpm_attested) == (True, True), v.reasons
            other = dataclasses.replace(POLICY, allowed_pcrs={0: frozenset({"ab" * 32})})
            v = verify_evidence(
                doc, expected_nonce=nonce, identity_public_key=device.public_key_pem,
                policy=other, now=time.time(), attestation_key=device.attestation_key_pem,
            )  # fmt: skip
            assert [r.split(":")[0] for r in v.reasons] == ["PcrNotAllowed"], v.reasons
            # a device without an EK-bound key cannot prove PCR values at all
            v = verify_evidence(
                {k: x for k, x in doc.items() if k != "tpm"}, expected_nonce=nonce,
                identity_public_key=device.public_key_pem, policy=pinned, now=time.time(),
            )  # fmt: skip
            assert [r.split(":")[0] for r in v.reasons] == ["PcrNotAttested"], v.reasons

            # From now on only quotes: the same device answering without one is refused.
            no_quote = copy.deepcopy(doc)
            del no_quote["tpm"]
            assert reasons(no_quote) == ["NoTpmQuote"]
            # A quote by another key of the same TPM, one that was never EK-bound.
            other = tmp_path / "other-key"
            with TpmAttestationKey.create(other, tpm.tcti) as key:
                from edgefleet.trust.evidence import statement_digest

                forged = copy.deepcopy(doc)
                forged["tpm"] = key.quote(statement_digest(doc["statement"]))
            assert reasons(forged) == ["QuoteSignatureInvalid"]
            # The genuine quote replayed under other measurements (the statement re-signed by
            # the identity key, which root on the device holds).
            replayed = copy.deepcopy(doc)
            replayed["statement"]["measurements"]["models"] = ["ab" * 32]
            assert "QuoteNonceMismatch" in reasons(replayed)
            # The old kind of quote (PCR 23, signed by the identity key) does not count.
            old = copy.deepcopy(doc)
            old["tpm"] = {"pcr": 23, "pcrValue": "00" * 32, "attest": "", "r": "1", "s": "1"}
            assert reasons(old) == ["QuoteMalformed"]

    run(main())


def test_an_ek_certificate_from_an_untrusted_ca_leaves_the_device_software_attested(
    tpm: Tpm, tmp_path: Path
) -> None:
    root, pin = _root(tmp_path)

    async def main() -> None:
        async with await _hub(tmp_path, tpm.other_ca) as hub:
            install_roots(hub.ctx.cache, HubRoots((root,)))
            result = await _enroll(hub, tmp_path / "cam-2", pin, tpm.tcti)
            assert result.attestation == "software"
            assert not (tmp_path / "cam-2" / AK_FILE).exists()  # nothing half-bound kept
            await hub.ctx.writer.flush()
            device = hub.ctx.cache.devices["cam-2"]
            assert (device.attestation_key_pem, device.ak_offer) == ("", None)
            event = hub.ctx.cache.events[-1]
            assert event["reason"] == "AttestationKeyRefused"
            assert "EkCertificateUntrusted" in event["message"]

    run(main())


def test_a_wrong_secret_withdraws_the_offer(tpm: Tpm, tmp_path: Path) -> None:
    """A device that cannot activate the credential (its key is not in the TPM the EK
    certificate names) is refused, and the offer is gone: no second guess."""
    root, _ = _root(tmp_path)
    data = tmp_path / "cam-3"

    async def main() -> None:
        from edged.trust.identity import load_or_create_identity

        async with await _hub(tmp_path, tpm.ca) as hub:
            install_roots(hub.ctx.cache, HubRoots((root,)))
            with TpmAttestationKey.create(data, tpm.tcti) as key:
                material = key.enrollment_material()
            identity = load_or_create_identity(data, tpm="off")
            csr = identity.build_csr("cam-3")
            token, _ = await tokens.create_token(hub.ctx.store, now=time.time(), ttl=600)
            ca = hub.paths.ca_certificate.read_bytes()
            async with grpc.aio.secure_channel(
                f"127.0.0.1:{hub.enroll_port}", grpc.ssl_channel_credentials(ca)
            ) as ch:
                resp = await enrollment_pb2_grpc.EnrollmentServiceStub(ch).Enroll(
                    enrollment_pb2.EnrollRequest(
                        token=token, csr_pem=csr, name="cam-3",
                        ek_certificate=material.ek_certificate, ek_public=material.ek_public,
                        ak_public=material.ak_public,
                    ),
                    timeout=30,
                )  # fmt: skip
            assert resp.ak_credential_blob and hub.ctx.cache.devices["cam-3"].ak_offer
            creds = grpc.ssl_channel_credentials(
                ca, (data / "identity" / "key.pem").read_bytes(), resp.certificate_chain_pem
            )
            async with grpc.aio.secure_channel(f"127.0.0.1:{hub.port}", creds) as ch:
                stub = device_pb2_grpc.DeviceServiceStub(ch)
                for code in (
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.FAILED_PRECONDITION,
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await stub.ActivateAttestationKey(
                            device_pb2.ActivateAttestationKeyRequest(secret=os.urandom(32)),
                            timeout=30,
                        )
                    assert err.value.code() is code
            device = hub.ctx.cache.devices["cam-3"]
            assert (device.attestation_key_pem, device.ak_offer) == ("", None)

    run(main())


def test_what_is_not_an_attestation_key_or_not_the_certified_ek_is_refused(tpm: Tpm) -> None:
    from tpm2_pytss import ESAPI, ESYS_TR, TPM2B_PUBLIC, TPM2B_SENSITIVE_CREATE, TPMA_OBJECT

    with TpmAttestationKey.create(Path(tpm.ca).parent / "k", tpm.tcti) as key:
        material = key.enrollment_material()
    cas = tpmbinding.load_ca_certificates([tpm.ca.read_bytes()])
    tpmbinding.verify_ek_certificate(
        material.ek_certificate, cas, material.ek_public, now=time.time()
    )
    for bad_cas in ([], tpmbinding.load_ca_certificates([tpm.other_ca.read_bytes()])):
        with pytest.raises(TrustError) as info:
            tpmbinding.verify_ek_certificate(
                material.ek_certificate, bad_cas, material.ek_public, now=time.time()
            )
        assert info.value.reason == "EkCertificateUntrusted"
    with pytest.raises(TrustError) as info:  # valid certificate, someone else's EK
        ek = TPM2B_PUBLIC.unmarshal(material.ek_public)[0]
        ek.publicArea.unique.rsa = bytes(256)
        tpmbinding.verify_ek_certificate(
            material.ek_certificate, cas, bytes(ek.marshal()), now=time.time()
        )
    assert info.value.reason == "EkMismatch"
    # An unrestricted signing key (it would sign any digest, so any "quote").
    esapi = ESAPI(tpm.tcti)
    try:
        template = TPM2B_PUBLIC.parse(
            "ecc256:ecdsa-sha256",
            objectAttributes=TPMA_OBJECT.SIGN_ENCRYPT | TPMA_OBJECT.FIXEDTPM
            | TPMA_OBJECT.FIXEDPARENT | TPMA_OBJECT.SENSITIVEDATAORIGIN
            | TPMA_OBJECT.USERWITHAUTH,
        )  # fmt: skip
        handle, public, *_ = esapi.create_primary(TPM2B_SENSITIVE_CREATE(), template, ESYS_TR.OWNER)
        esapi.flush_context(handle)
    finally:
        esapi.close()
    with pytest.raises(TrustError) as info:
        tpmbinding.check_attestation_key(bytes(public.marshal()))
    assert info.value.reason == "AttestationKeyInvalid" and "restricted" in str(info.value)
    assert tpmbinding.check_attestation_key(material.ak_public).pem.startswith("-----BEGIN")


def test_a_failed_enrollment_keeps_no_attestation_key(tpm: Tpm, tmp_path: Path) -> None:
    from edged.hublink.enrolling import EnrollError

    root, _ = _root(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    _, other_pin = _root(other)

    async def main() -> None:
        async with await _hub(tmp_path, tpm.ca) as hub:
            install_roots(hub.ctx.cache, HubRoots((root,)))
            with pytest.raises(EnrollError) as err:  # the hub's root is not the pinned one
                await _enroll(hub, tmp_path / "cam-4", other_pin, tpm.tcti)
            assert "RootPinMismatch" in str(err.value)
            assert not (tmp_path / "cam-4" / AK_FILE).exists()
            assert not (tmp_path / "cam-4" / "hub" / "link.json").exists()

    run(main())


def test_edgeds_measurements_in_a_static_pcr_are_replayed_and_checked(
    tpm: Tpm, tmp_path: Path
) -> None:
    """trust.measurementPcr: edged's code digest and each model in use are extended into PCR
    15 (reset only by a reboot) before the quote; the hub replays the event log against the
    quoted value and checks every event. A log that lost an event, or was deleted while the
    PCR kept its extends, does not replay; code the reference values do not allow, extended
    once since boot, keeps the device untrusted."""
    from edged.trust.attesting import MeasurementLog

    root, pin = _root(tmp_path)
    model = "cd" * 32
    log_path = tmp_path / "run" / "measurements.json"

    async def main() -> None:
        async with await _hub(tmp_path, tpm.ca) as hub:
            install_roots(hub.ctx.cache, HubRoots((root,)))
            result = await _enroll(hub, tmp_path / "cam-m", pin, tpm.tcti)
            assert result.attestation == "tpm"
            await hub.ctx.writer.flush()
            device = hub.ctx.cache.devices["cam-m"]
            data = tmp_path / "cam-m"

            def answer(nonce: bytes) -> dict[str, Any]:
                answerer = ChallengeAnswerer(
                    data, config_path=None, trust_root_path=data / "trust" / "root.json",
                    model_digests=lambda: [model], tpm=tpm.tcti,
                    measurement=MeasurementLog(log_path, 15),
                )  # fmt: skip
                return dict(orjson.loads(answerer._answer(nonce)))

            def verdict(doc: dict[str, Any], nonce: bytes, policy: Policy = POLICY) -> Any:
                return verify_evidence(
                    doc, expected_nonce=nonce, identity_public_key=device.public_key_pem,
                    policy=policy, now=time.time(), attestation_key=device.attestation_key_pem,
                )  # fmt: skip

            nonce = os.urandom(32)
            doc = await asyncio.to_thread(answer, nonce)
            tpm_part = doc["tpm"]
            assert tpm_part["measurementPcr"] == 15 and sorted(tpm_part["pcrs"], key=int) == [
                *(str(i) for i in range(8)),
                "15",
            ]
            code = doc["statement"]["measurements"]["code"]
            assert tpm_part["eventLog"] == [
                {"kind": "code", "sha256": code},
                {"kind": "model", "sha256": model},
            ]
            v = verdict(doc, nonce)
            assert (v.trusted, v.tpm_attested) == (True, True), v.reasons
            # a second answer extends nothing new: the same log replays to the same value
            nonce2 = os.urandom(32)
            again = await asyncio.to_thread(answer, nonce2)
            assert again["tpm"]["pcrs"]["15"] == tpm_part["pcrs"]["15"]
            assert verdict(again, nonce2).trusted

            def reasons(d: dict[str, Any], n: bytes, policy: Policy = POLICY) -> list[str]:
                return [r.split(":")[0] for r in verdict(d, n, policy).reasons]

            dropped = copy.deepcopy(doc)
            dropped["tpm"]["eventLog"] = dropped["tpm"]["eventLog"][:1]
            assert reasons(dropped, nonce) == ["EventLogMismatch"]
            strict = dataclasses.replace(POLICY, allowed_code=frozenset({"ab" * 32}))
            assert reasons(doc, nonce, strict) == ["EventNotAllowed", "CodeNotAllowed"]
            bad_pcr = copy.deepcopy(doc)
            bad_pcr["tpm"]["measurementPcr"] = 23  # resettable by software: refused
            assert reasons(bad_pcr, nonce) == ["QuoteMalformed"]
            # the log deleted while the PCR keeps its extends (not a reboot): no replay
            log_path.unlink()
            nonce3 = os.urandom(32)
            lost = await asyncio.to_thread(answer, nonce3)
            assert reasons(lost, nonce3) == ["EventLogMismatch"]

    run(main())


def test_a_secret_requiring_a_tpm_is_sealed_to_a_key_only_that_tpm_opens(
    tpm: Tpm, tmp_path: Path
) -> None:
    """At enrollment the device makes a sealing key in its TPM (ECDH, never leaves it) and the
    EK-bound attestation key certifies it for this enrollment; the hub records it and seals
    requireTpm Secrets to it. The device opens one by ECDH in the TPM; the identity file key
    does not open it (a copy of key.pem and of D/state/secrets.json is not enough), and a
    certification of another key, for another enrollment or by another key is refused."""
    from edged.trust.identity import load_or_create_identity
    from edged.trust.secrets import SecretVolumes
    from edged.trust.tpmattesting import SEALING_KEY_FILE, TpmSealingKey
    from edgefleet.sealing import SealError, new_key, open_from_hub, public_key_of, seal_at_rest
    from hub.state.secrets import SecretKeys, SecretRecord, key_id, seal_for

    root, pin = _root(tmp_path)
    data = tmp_path / "cam-s"

    async def main() -> str:
        async with await _hub(tmp_path, tpm.ca) as hub:
            install_roots(hub.ctx.cache, HubRoots((root,)))
            result = await _enroll(hub, data, pin, tpm.tcti)
            assert result.attestation == "tpm"
            await hub.ctx.writer.flush()
            device = hub.ctx.cache.devices["cam-s"]
            assert device.sealing_key_pem and device.attestation_key_pem
            assert [e["reason"] for e in hub.ctx.cache.events][-1] == "AttestationKeyBound"
            assert "TPM sealing key recorded" in hub.ctx.cache.events[-1]["message"]
            return device.sealing_key_pem

    sealing_pem = run(main())
    assert (data / SEALING_KEY_FILE).stat().st_mode & 0o777 == 0o600
    with TpmSealingKey(data, tpm.tcti) as key:
        assert key.public_key_pem().decode() == sealing_pem

    # the hub seals a requireTpm secret to it (what hub/api/devicesync.py does for this device)
    at_rest = new_key()
    record = SecretRecord(
        "vault", 1, ("token",), seal_at_rest(at_rest, "vault", 1, {"token": b"tpm-only"}),
        key_id=key_id(at_rest),
    )  # fmt: skip
    identity = load_or_create_identity(data, tpm="off")
    (sealed,) = seal_for(
        "cam-s", public_key_of(identity.public_key_pem()), [("vault", 1)], {"vault": record},
        SecretKeys(at_rest), tpm_secrets={"vault"}, tpm_key=public_key_of(sealing_pem.encode()),
    )  # fmt: skip
    assert sealed.require_tpm
    # the identity file key does not open it
    with pytest.raises(SealError):
        open_from_hub(identity.exchange, public_key_of(identity.public_key_pem()), "cam-s", sealed)
    # the device opens it in its TPM and writes the file
    vols = SecretVolumes(
        tmp_path / "secrets", data_dir=data, device_name="cam-s", allow_non_tmpfs=True,
        tpm=tpm.tcti,
    )  # fmt: skip
    assert vols.update([sealed], {"w": ("vault",)}) == {}
    assert (tmp_path / "secrets" / "w" / "vault" / "token").read_bytes() == b"tpm-only"
    # without the TPM selected (trust.tpm off), refused with the reason
    off = SecretVolumes(
        tmp_path / "secrets-off", data_dir=data, device_name="cam-s", allow_non_tmpfs=True
    )
    assert "trust.tpm ('off') selects none" in off.update([sealed], {"w": ("vault",)})["w"]

    # the hub's check refuses what is not a certified sealing key of this enrollment
    ak = TpmAttestationKey.load(data, tpm.tcti)
    assert ak is not None
    with ak:
        material = ak.make_sealing_key(tpmbinding.sealing_qualifying_data(b"s" * 32))
        other_key = ak.make_sealing_key(tpmbinding.sealing_qualifying_data(b"s" * 32))
        ak_pem = ak.public.to_pem().decode()
        ak_public = bytes(ak.public.marshal())
    good = (material.public, material.attest, material.r, material.s)
    assert tpmbinding.check_sealing_key(
        *good, ak_pem=ak_pem, qualifying_data=tpmbinding.sealing_qualifying_data(b"s" * 32)
    )
    refusals = {
        "another enrollment": (good, tpmbinding.sealing_qualifying_data(b"t" * 32), ak_pem),
        "another key certified": (
            (other_key.public, *good[1:]),
            tpmbinding.sealing_qualifying_data(b"s" * 32),
            ak_pem,
        ),
        "not a sealing key": (
            (ak_public, *good[1:]), tpmbinding.sealing_qualifying_data(b"s" * 32), ak_pem
        ),
        "a signature by another key": (
            good, tpmbinding.sealing_qualifying_data(b"s" * 32), identity.public_key_pem().decode()
        ),
    }  # fmt: skip
    for what, (parts, qualifying, signer) in refusals.items():
        with pytest.raises(TrustError) as info:
            tpmbinding.check_sealing_key(
                bytes(parts[0]), *parts[1:], ak_pem=signer, qualifying_data=qualifying
            )
        assert info.value.reason == "SealingKeyInvalid", what


def test_a_baseline_that_requires_the_measurement_pcr(tpm: Tpm, tmp_path: Path) -> None:
    """requireMeasurementPcr: a TPM-attested device whose quote carries no measurement PCR
    and event log (trust.measurementPcr off) is Untrusted (MeasurementPcrRequired), one that
    extends and whose log replays stays Trusted, and one without an EK-bound attestation key
    is Untrusted as under requireTpm. The verifier as a table, then the hub's own attestation
    path (a baseline applied through AdminService, the controller judging real evidence)."""
    from edged.trust.attesting import LoadMeasurer, MeasurementLog
    from edgefleet.v1 import admin_pb2
    from hub.server import attestation_controller

    root, pin = _root(tmp_path)
    data = tmp_path / "cam-r"
    log_path = tmp_path / "run-r" / "measurements.json"
    measured_policy = dataclasses.replace(POLICY, require_tpm=True, require_measurement_pcr=True)

    measurement = MeasurementLog(log_path, 13)

    def answer(nonce: bytes, *, measured: bool) -> bytes:
        answerer = ChallengeAnswerer(
            data, config_path=None, trust_root_path=data / "trust" / "root.json",
            model_digests=lambda: ["ef" * 32], tpm=tpm.tcti,
            measurement=measurement if measured else None,
        )  # fmt: skip
        return answerer._answer(nonce)

    async def main() -> None:
        async with await _hub(tmp_path, tpm.ca) as hub:
            install_roots(hub.ctx.cache, HubRoots((root,)))
            result = await _enroll(hub, data, pin, tpm.tcti)
            assert result.attestation == "tpm"
            await hub.ctx.writer.flush()
            device = hub.ctx.cache.devices["cam-r"]

            def reasons(evidence: bytes, nonce: bytes, **kw: Any) -> list[str]:
                v = verify_evidence(
                    orjson.loads(evidence), expected_nonce=nonce,
                    identity_public_key=device.public_key_pem, policy=measured_policy,
                    now=time.time(), **kw,
                )  # fmt: skip
                assert v.trusted == (not v.reasons)
                return [r.split(":")[0] for r in v.reasons]

            # the model measured when its worker started (edged's LoadMeasurer), sharing the
            # log with the answers: the quote then extends only the code
            measurer = LoadMeasurer(data, tpm=tpm.tcti, measurement=measurement)
            assert await asyncio.to_thread(measurer.measure, "ef" * 32)
            n1, n2 = os.urandom(32), os.urandom(32)
            plain = await asyncio.to_thread(answer, n1, measured=False)
            extended = await asyncio.to_thread(answer, n2, measured=True)
            code = orjson.loads(extended)["statement"]["measurements"]["code"]
            assert orjson.loads(extended)["tpm"]["eventLog"] == [
                {"kind": "model", "sha256": "ef" * 32},
                {"kind": "code", "sha256": code},
            ]
            ak = {"attestation_key": device.attestation_key_pem}
            # what a device without an EK-bound key sends: the signed statement, no quote
            software = orjson.dumps({k: x for k, x in orjson.loads(plain).items() if k != "tpm"})
            table = [
                # (evidence, nonce, attestation key, reasons)
                (plain, n1, ak, ["MeasurementPcrRequired"]),  # TPM-attested, no PCR/log
                (extended, n2, ak, []),  # extends, the log replays
                (software, n1, {}, ["NoTpmQuote"]),  # no EK-bound key: as requireTpm
            ]
            for evidence, nonce, key, want in table:
                assert reasons(evidence, nonce, **key) == want
            # the same quote without that baseline: trusted (nothing else changed)
            v = verify_evidence(
                orjson.loads(plain), expected_nonce=n1, identity_public_key=device.public_key_pem,
                policy=POLICY, now=time.time(), attestation_key=device.attestation_key_pem,
            )  # fmt: skip
            assert (v.trusted, v.tpm_attested) == (True, True), v.reasons

            # through the hub: the baseline applied like edgectl apply, the controller judging
            baseline = {
                "apiVersion": "edgefleet.io/v1", "kind": "SecurityBaseline",
                "metadata": {"name": "measured"}, "spec": {"requireMeasurementPcr": True},
            }  # fmt: skip
            async with hub.channel() as ch:
                await hub.stub(ch).Apply(admin_pb2.ApplyRequest(documents=[orjson.dumps(baseline)]))
            await hub.ctx.writer.flush()
            controller = attestation_controller(hub.ctx)
            policy = controller.policy_for("cam-r")
            assert policy.require_tpm and policy.require_measurement_pcr
            assert hub.ctx.cache.security_policy().require_attestation
            for measured, state, first in (
                (False, TrustState.UNTRUSTED, "MeasurementPcrRequired: "),
                (True, TrustState.TRUSTED, None),
            ):
                nonce = os.urandom(32)
                controller.outstanding["cam-r"] = Challenge(nonce, hub.ctx.clock())
                evidence = await asyncio.to_thread(answer, nonce, measured=measured)
                controller.on_evidence("cam-r", nonce, evidence)
                att = hub.ctx.cache.devices["cam-r"].attestation
                assert att.state is state, att.reasons
                if first is not None:
                    assert att.reasons[0].startswith(first), att.reasons
                    assert "trust.measurementPcr" in att.reasons[0]

    run(main())


def test_one_tpm_backs_one_device_record_unless_the_operator_allows_it(
    tpm: Tpm, tmp_path: Path
) -> None:
    """Issue 29, item 9 (related): the hub records the EK's hash with the device, and a second
    device record on the same genuine TPM is refused with the reason and the way out; a token
    made with ``--allow-shared-ek`` lets it in."""
    from edged.hublink.enrolling import EnrollError

    root, pin = _root(tmp_path)

    async def main() -> None:
        async with await _hub(tmp_path, tpm.ca) as hub:
            install_roots(hub.ctx.cache, HubRoots((root,)))
            first = await _enroll(hub, tmp_path / "cam-a", pin, tpm.tcti)
            assert first.attestation == "tpm"
            await hub.ctx.writer.flush()

            with pytest.raises(EnrollError) as err:
                await _enroll(hub, tmp_path / "cam-b", pin, tpm.tcti)
            said = str(err.value)
            assert "EkInUse" in said and "cam-a" in said and "--allow-shared-ek" in said, said
            assert "cam-b" not in hub.ctx.cache.devices  # nothing written
            ek = hub.ctx.cache.devices["cam-a"].ek_sha256
            assert len(ek) == 64 and ek in said
            assert hub.ctx.cache.devices["cam-a"].to_json()["ekSha256"] == ek

            second = await _enroll(hub, tmp_path / "cam-c", pin, tpm.tcti, allow_shared_ek=True)
            assert second.attestation == "tpm"
            await hub.ctx.writer.flush()
            assert hub.ctx.cache.devices["cam-c"].ek_sha256 == ek
            # the decision itself, pure: a pending offer on that EK counts too
            from hub.api.enrollment import shared_ek_refusal

            devices = list(hub.ctx.cache.devices.values())
            assert shared_ek_refusal(ek, devices, allowed=False, name="cam-d") is not None
            assert shared_ek_refusal(ek, devices, allowed=True, name="cam-d") is None
            assert shared_ek_refusal("ab" * 32, devices, allowed=False, name="cam-d") is None
            assert shared_ek_refusal("", devices, allowed=False, name="cam-d") is None

    run(main())
