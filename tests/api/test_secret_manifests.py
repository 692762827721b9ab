"""The Secret kind, spec.secrets of a deployment, and the refusal of embedded keys (pure)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from edgefleet.api import ModelDeployment, Secret, parse_manifest
from edgefleet.api.secrets import MAX_SECRET_BYTES, embedded_key_problems
from edgefleet.errors import ValidationError

VALUE = "s3cr3t-value-never-shown"
PEM_KEY = (
    "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n"
    "-----END PRIVATE KEY-----\n"
)


def _secret(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "Secret",
        "metadata": {"name": "s"},
        "spec": spec,
    }


def _deployment(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "d"},
        "spec": {"model": {"name": "m", "version": "1.0.0"}, **spec},
    }


def _problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as info:
        parse_manifest(doc)
    return [f"{p.path}: {p.message}" for p in info.value.problems]


def test_a_secret_takes_base64_and_text_and_shows_only_its_keys() -> None:
    s = parse_manifest(
        _secret(
            {
                "data": {"tls.key": base64.b64encode(b"\x00\x01").decode()},
                "stringData": {"token": VALUE},
            }
        )
    )
    assert isinstance(s, Secret)
    assert s.data == {"tls.key": b"\x00\x01", "token": VALUE.encode()}
    assert s.redacted()["spec"] == {"keys": ["tls.key", "token"]}
    assert VALUE not in repr(s) and VALUE not in str(s.redacted())
    assert parse_manifest(s.to_dict()) == s  # the full canonical form reads back equal


def test_a_secret_may_hold_a_private_key() -> None:
    s = parse_manifest(_secret({"stringData": {"tls.key": PEM_KEY}}))
    assert isinstance(s, Secret)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, ": a Secret needs at least one value in data or stringData"),
        ({"data": {"k": "not base64!"}}, "spec.data.k: must be base64 (the value is not shown)"),
        ({"stringData": {"..data": "x"}}, 'spec.stringData["..data"]: invalid key'),
        ({"stringData": {"a/b": "x"}}, 'spec.stringData["a/b"]: invalid key'),
        ({"data": {"k": "eA=="}, "stringData": {"k": "x"}},
         "spec.stringData.k: is also in spec.data"),
        ({"stringData": {"k": "x" * (MAX_SECRET_BYTES + 1)}}, "spec: its values take"),
        ({"stringData": {f"k{i}": "x" for i in range(65)}}, "spec: at most 64 keys, got 65"),
        ({"keys": ["a"], "stringData": {"a": "x"}},
         "spec.keys: is shown by the hub, not applied"),
        ({"stringData": {"k": "x"}, "datta": {}},
         'spec.datta: unknown field (did you mean "data"?)'),
    ],
)  # fmt: skip
def test_bad_secrets_name_the_field_and_never_the_value(
    spec: dict[str, Any], expected: str
) -> None:
    problems = _problems(_secret(spec))
    assert any(p.startswith(expected) or expected in p for p in problems), problems
    for p in problems:
        assert "not base64!" not in p and "x" * 20 not in p


def test_a_deployment_mounts_secrets() -> None:
    d = parse_manifest(_deployment(secrets=[{"name": "tls", "mountPath": "/secrets/tls"}]))
    assert isinstance(d, ModelDeployment)
    assert [(m.name, m.mount_path) for m in d.spec.secrets] == [("tls", "/secrets/tls")]
    assert d.to_dict()["spec"]["secrets"] == [{"name": "tls", "mountPath": "/secrets/tls"}]
    assert parse_manifest(d.to_dict()) == d
    plain = parse_manifest(_deployment())
    assert "secrets" not in plain.to_dict()["spec"]  # canonical forms of older manifests stay


@pytest.mark.parametrize(
    ("secrets", "expected"),
    [
        ([{"name": "tls", "mountPath": "relative"}],
         "spec.secrets[0].mountPath: must be an absolute path"),
        ([{"name": "tls", "mountPath": "/a/../b"}],
         "spec.secrets[0].mountPath: must be a normalised"),
        ([{"name": "Bad_Name", "mountPath": "/a"}],
         "spec.secrets[0].name: must be a Secret's name"),
        ([{"name": "a", "mountPath": "/a"}, {"name": "a", "mountPath": "/b"}],
         "spec.secrets[1].name: is already mounted by spec.secrets[0]"),
        ([{"name": "a", "mountPath": "/a"}, {"name": "b", "mountPath": "/a"}],
         "spec.secrets[1].mountPath: is already used by spec.secrets[0]"),
        ([{"name": f"s{i}", "mountPath": f"/s{i}"} for i in range(17)], "spec.secrets: at most 16"),
    ],
)  # fmt: skip
def test_bad_mounts_name_the_field(secrets: list[dict[str, str]], expected: str) -> None:
    problems = _problems(_deployment(secrets=secrets))
    assert any(p.startswith(expected) for p in problems), problems


def test_an_embedded_private_key_is_refused_with_its_path() -> None:
    doc = _deployment()
    doc["metadata"]["annotations"] = {"tls": PEM_KEY}
    assert _problems(doc) == [
        "metadata.annotations.tls: embeds a PEM block (private key): private keys and "
        "certificates are never put in manifests; keep them in a Secret and mount it "
        "(spec.secrets)"
    ]


def test_an_embedded_certificate_anywhere_in_any_kind_is_refused() -> None:
    cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    baseline = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "SecurityBaseline",
        "metadata": {"name": "b", "labels": {"a": "b"}, "annotations": {"note": f"x {cert}"}},
    }
    problems = _problems(baseline)
    assert problems[0].startswith("metadata.annotations.note: embeds a PEM block (certificate)")


def test_a_base64_encoded_pem_block_is_refused_too() -> None:
    for prefix in ("", "x", "xy"):  # each alignment of the marker in the encoded text
        encoded = base64.b64encode((prefix + PEM_KEY).encode()).decode()
        found = embedded_key_problems({"kind": "ModelDeployment", "spec": {"x": [encoded]}})
        assert [p.path for p in found] == ["spec.x[0]"], prefix
        assert "base64-encoded PEM block" in found[0].message


def test_a_secrets_own_values_are_not_looked_at_but_its_metadata_is() -> None:
    doc = _secret({"stringData": {"k": PEM_KEY}})
    assert embedded_key_problems(doc) == []
    doc["metadata"]["annotations"] = {"k": PEM_KEY}
    assert [p.path for p in embedded_key_problems(doc)] == ["metadata.annotations.k"]


def test_a_secret_may_require_a_tpm_and_says_so_without_its_values() -> None:
    s = parse_manifest(_secret({"stringData": {"token": VALUE}, "requireTpm": True}))
    assert isinstance(s, Secret) and s.require_tpm
    assert s.redacted()["spec"] == {"keys": ["token"], "requireTpm": True}
    assert parse_manifest(s.to_dict()) == s
    plain = parse_manifest(_secret({"stringData": {"token": VALUE}}))
    assert isinstance(plain, Secret) and not plain.require_tpm
    # the stored document of a Secret that does not require one is as it was before the field
    assert plain.redacted()["spec"] == {"keys": ["token"]}
    assert _problems(_secret({"stringData": {"k": "x"}, "requireTpm": "yes"})) == [
        'spec.requireTpm: must be true or false, got "yes"'
    ]
