"""Attestation on the hub. Real: the device side (an ``Attester`` over a file identity, real
P-256 signatures), the pure verifier, a hub data directory made by ``hub init`` with real
SQLite, the hub's sessions, writer and projector. Faked: the clock (a ``FakeClock`` on
``ctx.clock``); the gRPC stream is left out (``DeviceServicer`` only forwards evidence to
``on_evidence`` and challenges from the session, and is tested with the hub link)."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from asynctesting import async_test
from hubtesting import FakeClock

from edged.trust.attesting import Attester
from edged.trust.identity import load_or_create_identity
from edgefleet.trust.evidence import Policy
from hub.controllers.attestation import (
    Challenge,
    assess,
    challenge_due,
    reference_policy,
)
from hub.decide.devices import Attestation, Device, TrustState
from hub.initializing import init_hub
from hub.server import attestation_controller, build_context
from hub.state import storekeys as objects
from hub.trustsetup import quickstart_trust

NOW = 1_900_000_000.0
CODE = "c" * 64
MODEL = "a" * 64
NONCE = b"n" * 32
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def attester(tmp_path_factory: pytest.TempPathFactory) -> Attester:
    identity = load_or_create_identity(tmp_path_factory.mktemp("device"), tpm="off")
    return Attester(identity, code_digest=CODE)


@pytest.fixture(scope="module")
def device(attester: Attester) -> Device:
    return Device("cam-1", public_key_pem=attester._identity.public_key_pem().decode())


@pytest.fixture(scope="module")
def impostor(tmp_path_factory: pytest.TempPathFactory) -> Attester:
    identity = load_or_create_identity(tmp_path_factory.mktemp("impostor"), tpm="off")
    return Attester(identity, code_digest=CODE)


def _answer(a: Attester, nonce: bytes = NONCE, *, at: float = NOW, models: Any = (MODEL,)) -> bytes:
    return orjson.dumps(
        a.answer(nonce, now=at, config_path=None, trust_root_path=None, model_digests=models)
    )


POLICY = reference_policy(
    [{"spec": {"allowedCodeDigests": [f"sha256:{CODE}"], "allowedModelDigests": [MODEL]}}],
    trust_root=b"",
    owed_models=(),
)
CHALLENGE = Challenge(NONCE, NOW - 1)
TRUSTED = Attestation(TrustState.TRUSTED, (), NOW - 300, None)


# -- the decision, as a table --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("case", "state", "reason"),
    [
        ("good answer", TrustState.TRUSTED, None),
        ("stale nonce", TrustState.UNTRUSTED, "NonceMismatch"),
        ("signed by another key", TrustState.UNTRUSTED, "BadSignature"),
        ("code changed", TrustState.UNTRUSTED, "CodeNotAllowed"),
        ("model not in the baseline", TrustState.UNTRUSTED, "ModelNotAllowed"),
        ("model the device is owed", TrustState.TRUSTED, None),
        ("device clock far behind", TrustState.TRUSTED, None),
        ("device clock 6 s fast", TrustState.TRUSTED, None),
        ("time is not a number", TrustState.UNTRUSTED, "EvidenceMalformed"),
        ("answered after the timeout", TrustState.UNTRUSTED, "EvidenceLate"),
        ("not JSON", TrustState.UNTRUSTED, "EvidenceMalformed"),
        ("no challenge outstanding", TrustState.UNTRUSTED, "NoChallenge"),
        ("no answer yet", TrustState.TRUSTED, None),
        ("no answer in time", TrustState.UNTRUSTED, "NoAnswer"),
    ],
)
def test_assess(
    case: str,
    state: TrustState,
    reason: str | None,
    attester: Attester,
    impostor: Attester,
    device: Device,
) -> None:
    dev = device.with_(attestation=TRUSTED)
    challenge: Challenge | None = CHALLENGE
    policy: Policy = POLICY
    now = NOW
    evidence: bytes | None = {
        "good answer": lambda: _answer(attester),
        "stale nonce": lambda: _answer(attester, b"o" * 32),
        "signed by another key": lambda: _answer(impostor),
        "code changed": lambda: _answer(Attester(attester._identity, code_digest="d" * 64)),
        "model not in the baseline": lambda: _answer(attester, models=["b" * 64]),
        "model the device is owed": lambda: _answer(attester, models=["b" * 64]),
        "device clock far behind": lambda: _answer(attester, at=NOW - 86400),
        "device clock 6 s fast": lambda: _answer(attester, at=NOW + 6),
        "time is not a number": lambda: _answer(attester, at=float("nan")),
        "answered after the timeout": lambda: _answer(attester),
        "not JSON": lambda: b"\xff",
        "no challenge outstanding": lambda: _answer(attester),
        "no answer yet": lambda: None,
        "no answer in time": lambda: None,
    }[case]()
    if case == "model the device is owed":
        policy = reference_policy(
            [{"spec": {"allowedModelDigests": [MODEL]}}],
            trust_root=b"",
            owed_models={"b" * 64},
        )
    if case == "no challenge outstanding":
        challenge = None
    if case in ("no answer in time", "answered after the timeout"):
        now = NOW + TIMEOUT + 1
    got = assess(dev, challenge, evidence=evidence, policy=policy, now=now, timeout_s=TIMEOUT)
    assert got.state is state, got.reasons
    if reason is None:
        assert got.reasons == ()
    else:
        assert any(r.startswith(f"{reason}: ") for r in got.reasons), got.reasons
    if case == "no answer yet":
        assert got == replace(TRUSTED, challenged_at=CHALLENGE.sent_at)
    elif evidence is not None or case == "no answer in time":
        assert (got.verified_at, got.challenged_at) == (now, None)


def test_reference_policy() -> None:
    root = b"the root"
    open_policy = reference_policy([], trust_root=root, owed_models=["x"])
    assert open_policy == Policy(
        allowed_code=None,
        allowed_config=None,
        trust_root=hashlib.sha256(root).hexdigest(),
        allowed_models=None,
        check_trust_root=True,
    )
    two = reference_policy(
        [
            {"spec": {"allowedCodeDigests": ["sha256:AA"], "requireAttestation": True}},
            {"spec": {"allowedCodeDigests": ["bb"], "allowedModelDigests": ["sha256:cc"]}},
            {"kind": "SecurityBaseline"},  # no spec: contributes nothing
        ],
        trust_root=b"",
        owed_models=["dd"],
    )
    assert two.allowed_code == {"aa", "bb"}
    assert two.allowed_config is None
    assert two.allowed_models == {"cc", "dd"}
    assert not two.check_trust_root


def test_a_baseline_that_requires_a_tpm(attester: Attester, device: Device) -> None:
    """requireTpm: a software-attested device is Untrusted (and, as requireTpm implies
    requireAttestation, tainted NoExecute)."""
    from hub.state.cache import Cache

    baseline = {"spec": {"requireTpm": True}}
    policy = reference_policy([baseline], trust_root=b"", owed_models=())
    assert policy.require_tpm
    got = assess(
        device.with_(attestation=TRUSTED),
        CHALLENGE,
        evidence=_answer(attester),
        policy=policy,
        now=NOW,
        timeout_s=TIMEOUT,
    )
    assert got.state is TrustState.UNTRUSTED and got.reasons[0].startswith("NoTpmQuote: ")
    cache = Cache()
    cache.put_object(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "SecurityBaseline",
            "metadata": {"name": "tpm"},
            "spec": {"requireTpm": True},
        },
        1,
    )
    assert cache.security_policy().require_attestation


def test_a_baseline_that_requires_the_measurement_pcr(attester: Attester, device: Device) -> None:
    """requireMeasurementPcr implies requireTpm: a software-attested device is Untrusted
    (NoTpmQuote) and tainted NoExecute (the TPM-attested cases, with real quotes from swtpm:
    tests/trust/test_tpm_attestation.py)."""
    from hub.state.cache import Cache

    policy = reference_policy(
        [{"spec": {"requireMeasurementPcr": True}}], trust_root=b"", owed_models=()
    )
    assert policy.require_tpm and policy.require_measurement_pcr
    tpm_only = reference_policy([{"spec": {"requireTpm": True}}], trust_root=b"", owed_models=())
    assert not tpm_only.require_measurement_pcr
    got = assess(
        device.with_(attestation=TRUSTED),
        CHALLENGE,
        evidence=_answer(attester),
        policy=policy,
        now=NOW,
        timeout_s=TIMEOUT,
    )
    assert got.state is TrustState.UNTRUSTED and got.reasons[0].startswith("NoTpmQuote: ")
    cache = Cache()
    cache.put_object(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "SecurityBaseline",
            "metadata": {"name": "measured"},
            "spec": {"requireMeasurementPcr": True},
        },
        1,
    )
    assert cache.security_policy().require_attestation


@pytest.mark.parametrize(
    ("verified_at", "connected", "outstanding", "due"),
    [
        (None, True, False, True),  # never attested: at once
        (NOW - 299, True, False, False),
        (NOW - 300, True, False, True),
        (None, False, False, False),  # not connected
        (None, True, True, False),  # already waiting for an answer
    ],
)
def test_challenge_due(
    verified_at: float | None, connected: bool, outstanding: bool, due: bool
) -> None:
    current = Attestation(TrustState.TRUSTED, (), verified_at, None)
    assert (
        challenge_due(current, connected=connected, outstanding=outstanding, now=NOW, period_s=300)
        is due
    )


# -- the controller on a real hub context ----------------------------------------------------------
@pytest.fixture
def hub_dir(tmp_path: Path) -> Path:
    d = tmp_path / "hub"
    asyncio.run(init_hub(d, region="eu-dublin", trust_setup=quickstart_trust))
    return d


@async_test
async def test_controller_challenges_trusts_and_times_out(
    hub_dir: Path, attester: Attester, device: Device
) -> None:
    ctx = await build_context(hub_dir)
    clock = FakeClock(NOW)
    ctx.clock = clock
    try:
        ctx.writer.update(device)
        ctx.cache.put_object(
            {
                "apiVersion": "edgefleet.io/v1",
                "kind": "SecurityBaseline",
                "metadata": {"name": "fleet"},
                "spec": {"requireAttestation": True, "allowedCodeDigests": [f"sha256:{CODE}"]},
            },
            1,
        )
        controller = attestation_controller(ctx)
        session = ctx.sessions.open(device.name, "01")
        # The device keeps the same root with other formatting (compact, a trailing newline):
        # roots compare by payload digest, so this is no TrustRootMismatch.
        root_file = hub_dir / "device-root.json"
        root_file.write_bytes(orjson.dumps(orjson.loads(ctx.trust_root)) + b"\n")
        assert root_file.read_bytes() != ctx.trust_root

        def answer(nonce: bytes, code: str = CODE) -> bytes:
            a = Attester(attester._identity, code_digest=code)
            return orjson.dumps(
                a.answer(
                    nonce,
                    now=clock(),
                    config_path=None,
                    trust_root_path=root_file,
                    model_digests=[],
                )
            )

        controller.scan()
        (nonce,) = session.challenges
        assert len(nonce) == 32
        assert ctx.cache.devices[device.name].attestation.challenged_at == NOW
        controller.scan()  # an outstanding challenge is not repeated
        assert len(session.challenges) == 1
        controller.on_evidence(device.name, nonce, answer(nonce))
        att = ctx.cache.devices[device.name].attestation
        assert (att.state, att.reasons, att.verified_at) == (TrustState.TRUSTED, (), NOW)
        assert ctx.cache.events[-1]["reason"] == "Trusted"

        # a period later: a new challenge, answered with changed code
        session.challenges.clear()
        clock.advance(ctx.config.attestation.period_s)
        controller.scan()
        (second,) = session.challenges
        assert second != nonce
        controller.on_evidence(device.name, second, answer(second, code="e" * 64))
        att = ctx.cache.devices[device.name].attestation
        assert att.state is TrustState.UNTRUSTED
        assert att.reasons == (f"CodeNotAllowed: edged code digest {'e' * 64}",)
        assert ctx.cache.events[-1]["type"] == "Warning"

        # a late answer to the first nonce: still Untrusted, with the verifier's reason
        controller.on_evidence(device.name, nonce, answer(nonce))
        assert any(
            r.startswith("NonceMismatch")
            for r in ctx.cache.devices[device.name].attestation.reasons
        )

        # a period later again: challenged, never answers -> NoAnswer after the timeout
        session.challenges.clear()
        clock.advance(ctx.config.attestation.period_s)
        controller.scan()
        third = session.challenges[0]
        controller.on_evidence(device.name, third, answer(third))
        assert ctx.cache.devices[device.name].attestation.state is TrustState.TRUSTED
        session.challenges.clear()
        clock.advance(ctx.config.attestation.period_s)
        controller.scan()
        assert session.challenges
        clock.advance(ctx.config.attestation.timeout_s - 1)
        controller.scan()
        assert ctx.cache.devices[device.name].attestation.state is TrustState.TRUSTED
        clock.advance(2)
        controller.scan()
        att = ctx.cache.devices[device.name].attestation
        assert att.state is TrustState.UNTRUSTED
        assert att.reasons == ("NoAnswer: no evidence within 30s of the challenge",)
        assert [e["reason"] for e in ctx.cache.events] == [
            "Trusted",
            "Untrusted",
            "Untrusted",
            "Trusted",
            "Untrusted",
        ]

        # written to the store (real SQLite)
        await ctx.writer.flush()
        kv = await ctx.store.get(objects.device_key(device.name))
        assert kv is not None
        stored = Device.from_json(objects.loads(kv.value))
        assert stored.attestation == att
    finally:
        await ctx.store.close()


def test_pcr_reference_values_join_across_baselines_and_need_a_quote(
    attester: Attester, device: Device
) -> None:
    """Reference values of two baselines are joined per PCR; a software-attested device
    cannot prove PCR values, so a baseline that pins them makes it Untrusted."""
    policy = reference_policy(
        [
            {"spec": {"allowedPcrValues": {"0": ["AA" * 32]}}},
            {"spec": {"allowedPcrValues": {"0": ["bb" * 32], "7": ["cc" * 32]}}},
        ],
        trust_root=b"",
        owed_models=(),
    )
    assert policy.allowed_pcrs == {0: frozenset({"aa" * 32, "bb" * 32}), 7: frozenset({"cc" * 32})}
    got = assess(
        device.with_(attestation=TRUSTED), CHALLENGE, evidence=_answer(attester),
        policy=policy, now=NOW, timeout_s=TIMEOUT,
    )  # fmt: skip
    assert got.state is TrustState.UNTRUSTED
    assert [r.split(":")[0] for r in got.reasons] == ["PcrNotAttested"]
