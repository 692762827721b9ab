"""The pure parts of AdminService, as tables: SecurityBaseline validation, apply document
parsing and outcomes (label selectors: tests/core/test_selecting.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from edgefleet.api import baselines
from edgefleet.errors import ValidationError
from hub.decide import apply


def _baseline(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "SecurityBaseline",
        "metadata": {"name": "fleet"},
        "spec": spec,
    }


DIGEST = "sha256:" + "AB" * 32


def test_baseline_is_canonical() -> None:
    parsed = baselines.parse_security_baseline(
        _baseline(requireAttestation=True, allowedModelDigests=[DIGEST])
    )
    assert parsed.to_dict()["spec"] == {
        "requireAttestation": True,
        "requireTpm": False,
        "allowedCodeDigests": [],
        "allowedConfigDigests": [],
        "allowedModelDigests": [DIGEST.lower()],
        "allowedPcrValues": {},
    }
    assert baselines.parse_security_baseline(parsed.to_dict()) == parsed
    assert baselines.requires_attestation(parsed.to_dict())
    pcrs = baselines.parse_security_baseline(
        _baseline(allowedPcrValues={0: ["AB" * 32], "7": ["cd" * 32, "01" * 32]})
    )
    assert pcrs.to_dict()["spec"]["allowedPcrValues"] == {
        "0": ["ab" * 32],
        "7": ["01" * 32, "cd" * 32],
    }
    assert baselines.parse_security_baseline(pcrs.to_dict()) == pcrs
    # requireMeasurementPcr: written only when set (stored baselines keep their form); it
    # implies requireTpm and requireAttestation
    measured = baselines.parse_security_baseline(_baseline(requireMeasurementPcr=True))
    assert measured.spec.require_measurement_pcr
    assert measured.to_dict()["spec"]["requireMeasurementPcr"] is True
    assert "requireMeasurementPcr" not in parsed.to_dict()["spec"]
    assert baselines.parse_security_baseline(measured.to_dict()) == measured
    assert baselines.requires_tpm(measured.to_dict())
    assert baselines.requires_attestation(measured.to_dict())
    assert not baselines.requires_measurement_pcr(parsed.to_dict())


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"requireAttestation": 1}, "spec.requireAttestation: must be true or false"),
        ({"requireMeasurementPcr": "yes"}, "spec.requireMeasurementPcr: must be true or false"),
        ({"allowedCodeDigests": "sha256:x"}, "spec.allowedCodeDigests: must be a list"),
        ({"allowedConfigDigests": ["md5:00"]}, "spec.allowedConfigDigests[0]: must be"),
        ({"allowedModelDigests": [DIGEST, DIGEST]}, "spec.allowedModelDigests[1]: duplicates"),
        ({"requireAtestation": True}, "spec.requireAtestation: unknown field (did you mean"),
        ({"allowedPcrValues": ["00"]}, "spec.allowedPcrValues: must be a mapping"),
        ({"allowedPcrValues": {"8": ["00" * 32]}}, "spec.allowedPcrValues.8: a PCR index 0-7"),
        ({"allowedPcrValues": {0: []}}, "spec.allowedPcrValues.0: must be a non-empty list"),
        ({"allowedPcrValues": {"7": ["zz"]}}, "spec.allowedPcrValues.7[0]: must be 64"),
        ({"allowedPcrValues": {"7": ["AB" * 32, "ab" * 32]}}, "spec.allowedPcrValues.7[1]: dup"),
    ],
)
def test_baseline_problems(spec: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as info:
        baselines.parse_security_baseline(_baseline(**spec))
    assert any(str(p).startswith(problem) for p in info.value.problems), info.value.problems


def test_documents_are_numbered_and_outcomes_compare_canonical_forms() -> None:
    doc = _baseline(requireAttestation=False)
    [parsed] = apply.parse_documents([orjson.dumps(doc)])
    assert apply.outcome_of(parsed.manifest, None) is apply.Outcome.CREATED
    assert apply.outcome_of(parsed.manifest, parsed.manifest) is apply.Outcome.UNCHANGED
    changed = {**parsed.manifest, "spec": {**parsed.manifest["spec"], "requireAttestation": True}}
    assert apply.outcome_of(parsed.manifest, changed) is apply.Outcome.CONFIGURED
    with pytest.raises(ValidationError) as info:
        apply.parse_documents([orjson.dumps(doc), b'{"a": 1, "a": 2}', b"\xff"])
    assert [str(p) for p in info.value.problems] == [
        "documents[1]: invalid JSON: duplicate key 'a'",
        "documents[2]: is not UTF-8 text (byte 0)",
    ]


def test_baseline_sandbox_and_network_are_canonical_and_optional() -> None:
    parsed = baselines.parse_security_baseline(
        _baseline(requireSandbox=True, network={"egress": [{"port": 8080}, {"port": 53}]})
    )
    spec = parsed.to_dict()["spec"]
    assert spec["requireSandbox"] is True
    assert spec["network"] == {"egress": [{"port": 53}, {"port": 8080}]}
    assert baselines.parse_security_baseline(parsed.to_dict()) == parsed
    plain = baselines.parse_security_baseline(_baseline()).to_dict()["spec"]
    assert "requireSandbox" not in plain and "network" not in plain  # older forms unchanged


def test_baseline_egress_rules_name_addresses() -> None:
    """A rule may say which addresses its port is reached on: one address (kept as a /32
    network) or a network, IPv4 or IPv6; rules are kept sorted, port-only rules first."""
    manifest = baselines.parse_security_baseline(
        _baseline(
            network={
                "egress": [
                    {"port": 8080, "cidr": "127.0.0.1"},
                    {"port": 443},
                    {"port": 8080, "cidr": "fd00::/8"},
                    {"port": 8080},
                ]
            }
        )
    )
    assert manifest.spec.to_dict()["network"] == {
        "egress": [
            {"port": 443},
            {"port": 8080},
            {"port": 8080, "cidr": "127.0.0.1/32"},
            {"port": 8080, "cidr": "fd00::/8"},
        ]
    }
    assert manifest.spec.network is not None and manifest.spec.network.egress_addresses
    assert baselines.parse_security_baseline(manifest.to_dict()) == manifest


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"requireSandbox": "yes"}, "spec.requireSandbox: must be true or false"),
        ({"network": {"egress": [{"port": 0}]}}, "spec.network.egress[0].port: must be"),
        ({"network": {"egress": [{"port": 80}, {"port": 80}]}}, "spec.network.egress[1].port"),
        (
            {"network": {"egress": [{"host": "sensor.local", "port": 8080}]}},
            "spec.network.egress[0].host: not supported yet: host names are not resolved",
        ),
        (
            {"network": {"egress": [{"address": "127.0.0.1", "port": 8080}]}},
            "spec.network.egress[0].address: not a field of an egress rule: give the addresses "
            "in cidr",
        ),
        (
            {"network": {"egress": [{"cidr": "10.1.2.3/8", "port": 8080}]}},
            "spec.network.egress[0].cidr: must be an IP address or network such as 10.0.0.0/8: "
            "10.1.2.3/8 has host bits set",
        ),
        (
            {"network": {"egress": [{"cidr": "sensor", "port": 8080}]}},
            "spec.network.egress[0].cidr",
        ),
        ({"network": {"egress": [{"cidr": 7, "port": 8080}]}}, "spec.network.egress[0].cidr"),
        (
            {
                "network": {
                    "egress": [
                        {"cidr": "127.0.0.1", "port": 80},
                        {"cidr": "127.0.0.1/32", "port": 80},
                    ]
                }
            },
            "spec.network.egress[1].port: port 80 on 127.0.0.1/32 is listed twice",
        ),
        ({"network": {"egres": []}}, "spec.network.egres: unknown field"),
    ],
)
def test_baseline_network_problems(spec: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as info:
        baselines.parse_security_baseline(_baseline(**spec))
    assert any(str(p).startswith(problem) for p in info.value.problems), info.value.problems


KEY_A, KEY_B = "a" * 64, "B" * 64


def test_baseline_publishers_are_canonical_and_keep_the_document_order() -> None:
    parsed = baselines.parse_security_baseline(
        _baseline(
            publishers=[
                {"keys": [KEY_B, KEY_A], "deployments": ["vision-*", "cam?"]},
                {"keys": [KEY_A], "deploymentLabels": {"team": "audio"}},
            ]
        )
    )
    rules = parsed.spec.publishers
    assert rules is not None and rules[0].keys == ("b" * 64, KEY_A)  # field paths follow it
    assert parsed.to_dict()["spec"]["publishers"] == [
        {"keys": [KEY_A, "b" * 64], "deployments": ["cam?", "vision-*"]},
        {"keys": [KEY_A], "deploymentLabels": {"team": "audio"}},
    ]
    assert baselines.parse_security_baseline(parsed.to_dict()).to_dict() == parsed.to_dict()
    assert rules[0].covers("vision-front", {}) and rules[0].covers("cam1", {})
    assert not rules[0].covers("camera", {}) and not rules[0].covers("audio", {"team": "audio"})
    assert rules[1].covers("x", {"team": "audio", "a": "b"}) and not rules[1].covers("x", {})
    # absent: says nothing of publishers; [] is "no publisher for any deployment"
    assert baselines.parse_security_baseline(_baseline()).spec.publishers is None
    empty = baselines.parse_security_baseline(_baseline(publishers=[]))
    assert empty.spec.publishers == () and empty.to_dict()["spec"]["publishers"] == []


@pytest.mark.parametrize(
    ("publishers", "problem"),
    [
        ({"keys": [KEY_A]}, "spec.publishers[0]: must say which deployments"),
        ({"keys": [], "deployments": ["x"]}, "spec.publishers[0].keys: must name at least one"),
        (
            {"keys": ["sha256:" + KEY_A], "deployments": ["x"]},
            "spec.publishers[0].keys[0]: must be a key id",
        ),
        ({"keys": [KEY_A, KEY_A], "deployments": ["x"]}, "spec.publishers[0].keys[1]: duplicates"),
        ({"keys": [KEY_A], "deployments": ["vision/*"]}, "spec.publishers[0].deployments[0]: must"),
        ({"keys": [KEY_A], "deployments": ["[a-z]*"]}, "spec.publishers[0].deployments[0]: must"),
        ({"keys": [KEY_A], "deployments": ["Det"]}, "spec.publishers[0].deployments[0]: must"),
        ({"keys": [KEY_A], "deployments": [""]}, "spec.publishers[0].deployments[0]: must"),
        (
            {"keys": [KEY_A], "deploymentLabels": {"team": 3}},
            "spec.publishers[0].deploymentLabels.team",
        ),
        (
            {"keys": [KEY_A], "deployments": ["x"], "roles": ["v"]},
            "spec.publishers[0].roles: unknown",
        ),
    ],
)
def test_baseline_publisher_problems(publishers: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as info:
        baselines.parse_security_baseline(_baseline(publishers=[publishers]))
    assert problem in str(info.value)


def test_unknown_publisher_keys_are_refused_with_their_field_path() -> None:
    doc = orjson.dumps(_baseline(publishers=[{"keys": [KEY_A, KEY_B], "deployments": ["*"]}]))
    other = orjson.dumps({"apiVersion": "edgefleet.io/v1", "kind": "SecurityBaseline",
                          "metadata": {"name": "b"}, "spec": {}})  # fmt: skip
    with pytest.raises(ValidationError) as info:
        apply.check_publisher_keys([other, doc], frozenset({KEY_A}))
    assert [p.path for p in info.value.problems] == ["documents[1].spec.publishers[0].keys[1]"]
    assert "is not a publisher key of this hub" in str(info.value)
    apply.check_publisher_keys([other, doc], frozenset({KEY_A, "b" * 64}))
