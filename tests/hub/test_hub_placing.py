"""Placement decisions as tables: pure functions, no hub, no store."""

from __future__ import annotations

from typing import Any

import pytest

from edgefleet.api import ModelDeployment, parse_manifest
from hub.decide.devices import Attestation, Device, DevicePhase, Health, TrustState
from hub.decide.placement import (
    TAINT_NOT_READY,
    TAINT_UNHEALTHY,
    TAINT_UNSCHEDULABLE,
    TAINT_UNTRUSTED,
    SecurityPolicy,
    lifecycle_phase,
    project,
    taints_for,
)


def deployment(name: str, **spec: Any) -> ModelDeployment:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": name, "version": "1.0.0"}, **spec},
    }
    dep = parse_manifest(doc)
    assert isinstance(dep, ModelDeployment)
    return dep


READY = Device("d1", labels={"site": "retail"}, phase=DevicePhase.READY, last_heartbeat=100.0)
PLAIN = deployment("plain")
RETAIL = deployment("retail", placement={"nodeSelector": {"site": "retail"}})
FACTORY = deployment("factory", placement={"nodeSelector": {"site": "factory"}})
NPU = deployment("npu", placement={"nodeSelector": {"accelerator": "npu"}})
TOLERANT = deployment(
    "tolerant", placement={"tolerations": [{"key": TAINT_UNHEALTHY, "operator": "Exists"}]}
)
ANYTHING = deployment("anything", placement={"tolerations": [{"operator": "Exists"}]})
EU = deployment("eu", placement={"regions": ["eu-frankfurt"]})
TOTAL = deployment("total", replicas={"total": 3})
ALL = [PLAIN, RETAIL, FACTORY, NPU, TOLERANT, ANYTHING, EU, TOTAL]
NONE: frozenset[str] = frozenset()


@pytest.mark.parametrize(
    ("device", "previous", "policy", "region", "expected"),
    [
        pytest.param(
            READY,
            NONE,
            SecurityPolicy(),
            "",
            {"plain", "retail", "tolerant", "anything"},
            id="ready",
        ),
        pytest.param(
            READY,
            NONE,
            SecurityPolicy(),
            "eu-frankfurt",
            {"plain", "retail", "tolerant", "anything", "eu"},
            id="region",
        ),
        pytest.param(
            READY.with_(reported_labels={"accelerator": "npu", "site": "factory"}),
            NONE,
            SecurityPolicy(),
            "",
            {"plain", "retail", "npu", "tolerant", "anything"},
            id="operator-labels-win-over-reported",
        ),
        pytest.param(
            READY.with_(cordoned=True), NONE, SecurityPolicy(), "", {"anything"}, id="cordoned-new"
        ),
        pytest.param(
            READY.with_(cordoned=True),
            frozenset({"plain", "retail"}),
            SecurityPolicy(),
            "",
            {"plain", "retail", "anything"},
            id="cordoned-keeps-existing",
        ),
        pytest.param(
            READY.with_(phase=DevicePhase.NOT_READY),
            frozenset({"plain"}),
            SecurityPolicy(),
            "",
            {"plain", "anything"},
            id="not-ready-keeps",
        ),
        pytest.param(
            READY.with_(health=Health(False, ("cpu temperature 91C > 85C",))),
            frozenset({"plain"}),
            SecurityPolicy(),
            "",
            {"tolerant", "anything"},
            id="unhealthy-evicts",
        ),
        pytest.param(
            READY,
            frozenset({"plain"}),
            SecurityPolicy(require_attestation=True),
            "",
            {"anything"},
            id="unattested-under-baseline",
        ),
        pytest.param(
            READY.with_(attestation=Attestation(TrustState.TRUSTED)),
            NONE,
            SecurityPolicy(require_attestation=True),
            "",
            {"plain", "retail", "tolerant", "anything"},
            id="trusted-under-baseline",
        ),
        pytest.param(
            READY.with_(attestation=Attestation(TrustState.UNTRUSTED, ("measurement changed",))),
            NONE,
            SecurityPolicy(),
            "",
            {"plain", "retail", "tolerant", "anything"},
            id="untrusted-without-baseline",
        ),
        pytest.param(
            READY.with_(revoked=True),
            frozenset({"plain"}),
            SecurityPolicy(),
            "",
            {"anything"},
            id="revoked",
        ),
    ],
)
def test_project(
    device: Device,
    previous: frozenset[str],
    policy: SecurityPolicy,
    region: str,
    expected: set[str],
) -> None:
    got = project(device, ALL, previous=previous, policy=policy, region=region)
    assert set(got.names) == expected
    assert list(got.names) == sorted(got.names)
    assert set(got.excluded) | set(got.names) == {d.metadata.name for d in ALL}


def test_reasons_name_the_cause() -> None:
    got = project(
        READY.with_(attestation=Attestation(TrustState.UNTRUSTED, ("nonce is stale",))),
        ALL,
        previous=NONE,
        policy=SecurityPolicy(require_attestation=True),
    )
    assert "site='factory'" in got.excluded["factory"] and "'retail'" in got.excluded["factory"]
    assert "accelerator" in got.excluded["npu"] and "missing" in got.excluded["npu"]
    assert TAINT_UNTRUSTED in got.excluded["plain"] and "nonce is stale" in got.excluded["plain"]
    assert "scheduler" in got.excluded["total"]


@pytest.mark.parametrize(
    ("device", "policy", "keys"),
    [
        (READY, SecurityPolicy(), []),
        (Device("new"), SecurityPolicy(), [TAINT_NOT_READY]),
        (READY.with_(cordoned=True), SecurityPolicy(), [TAINT_UNSCHEDULABLE]),
        (READY.with_(health=Health(False, ())), SecurityPolicy(), [TAINT_UNHEALTHY]),
        (READY, SecurityPolicy(require_attestation=True), [TAINT_UNTRUSTED]),
    ],
)
def test_taints(device: Device, policy: SecurityPolicy, keys: list[str]) -> None:
    assert [t.key for t in taints_for(device, policy)] == keys


@pytest.mark.parametrize(
    ("last", "now", "phase"),
    [
        (None, 50.0, DevicePhase.PENDING),
        (100.0, 100.0, DevicePhase.READY),
        (100.0, 140.0, DevicePhase.READY),
        (100.0, 140.1, DevicePhase.NOT_READY),
    ],
)
def test_lifecycle(last: float | None, now: float, phase: DevicePhase) -> None:
    got, again = lifecycle_phase(Device("d", last_heartbeat=last), now=now, grace_s=40.0)
    assert got is phase
    assert again > 0


def test_device_json_round_trip() -> None:
    d = READY.with_(
        health=Health(False, ("x",)),
        attestation=Attestation(TrustState.TRUSTED, (), 5.0, None),
        facts={"arch": "arm64"},
        generation_acked=7,
    )
    assert Device.from_json(d.to_json()) == d


def test_require_tpm_places_only_on_tpm_attested_devices() -> None:
    """placement.requireTpm: a software-attested device (no AK bound to its EK) or one whose
    TPM attestation is not trusted does not get the deployment, with the reason; a
    TPM-attested one does (a device cannot claim it with a label of its own)."""
    from hub.decide.placement import TPM_LABEL

    tpm = deployment("tpm", placement={"requireTpm": True})
    assert tpm.to_dict()["spec"]["placement"] == {"requireTpm": True}
    assert "requireTpm" not in deployment("p").to_dict()["spec"].get("placement", {})
    software = READY.with_(attestation=Attestation(TrustState.TRUSTED), labels={TPM_LABEL: "true"})
    bound = READY.with_(attestation_key_pem="-----BEGIN PUBLIC KEY-----\n...")
    trusted = bound.with_(attestation=Attestation(TrustState.TRUSTED))
    untrusted = bound.with_(attestation=Attestation(TrustState.UNTRUSTED, ("NoTpmQuote: x",)))
    policy = SecurityPolicy()
    out = project(software, [tpm, PLAIN], previous=NONE, policy=policy)
    assert out.names == ("plain",)
    assert out.excluded["tpm"] == (
        "placement.requireTpm: the device is software-attested (no TPM attestation key bound "
        "to its endorsement key)"
    )
    assert project(trusted, [tpm], previous=NONE, policy=policy).names == ("tpm",)
    out = project(untrusted, [tpm], previous=frozenset({"tpm"}), policy=policy)
    assert out.names == ()  # taken off a device whose TPM attestation fails
    assert "not trusted (NoTpmQuote: x)" in out.excluded["tpm"]


def test_a_secret_requiring_a_tpm_keeps_its_deployments_off_devices_without_one() -> None:
    """A deployment mounting a Secret with spec.requireTpm: the reason for a software-attested
    device and for one whose TPM attestation fails; none for a TPM-attested one; and the
    scheduler places it as one with placement.requireTpm."""
    from hub.decide.placement import secret_tpm_mismatch, with_secret_tpm

    software = READY.with_(attestation=Attestation(TrustState.TRUSTED))
    bound = READY.with_(attestation_key_pem="-----BEGIN PUBLIC KEY-----\n...")
    no_sealing_key = bound.with_(attestation=Attestation(TrustState.TRUSTED))
    trusted = no_sealing_key.with_(sealing_key_pem="-----BEGIN PUBLIC KEY-----\n...")
    untrusted = trusted.with_(attestation=Attestation(TrustState.UNTRUSTED, ("NoTpmQuote: x",)))
    tpm = frozenset({"vault", "hsm"})
    assert secret_tpm_mismatch(["plain", "vault"], tpm, software) == (
        "secret vault requires a TPM (spec.requireTpm): the device is software-attested (no "
        "TPM attestation key bound to its endorsement key), so the secret is never sent to it"
    )
    assert secret_tpm_mismatch(["vault"], tpm, untrusted) == (
        "secret vault requires a TPM (spec.requireTpm): the device's TPM attestation is not "
        "trusted (NoTpmQuote: x)"
    )
    assert secret_tpm_mismatch(["vault"], tpm, no_sealing_key) == (
        "secret vault requires a TPM (spec.requireTpm): the hub holds no TPM sealing key of "
        "this device (enrolled before sealing keys, or its key was refused: enroll it again)"
    )
    assert secret_tpm_mismatch(["vault"], tpm, trusted) is None
    assert secret_tpm_mismatch(["plain"], tpm, software) is None
    mounting = deployment("m", secrets=[{"name": "vault", "mountPath": "/s/vault"}])
    placed = with_secret_tpm(mounting, tpm)
    assert placed.spec.placement.require_tpm and not mounting.spec.placement.require_tpm
    assert with_secret_tpm(PLAIN, tpm) is PLAIN
    assert with_secret_tpm(mounting, frozenset()) is mounting
