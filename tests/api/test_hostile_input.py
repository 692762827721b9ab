"""Hostile manifest files: bounded alias expansion, plain data only, 64-bit integers, finite
numbers; every problem is ``FILE:LINE: reason``, never a traceback. Tables, then properties
(hypothesis: arbitrary text and arbitrary documents give manifests or ValidationError and
nothing else; a few thousand inputs, 100,000 with EDGEFLEET_NIGHTLY=1), then the real
``edgectl apply`` on a billion-laughs file (a subprocess; memory and exit code checked).
Nothing faked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from propertytesting import examples

from edgefleet.api import load_documents, load_manifests, parse_manifest
from edgefleet.api.loading import MAX_EXPANDED_NODES
from edgefleet.errors import ValidationError

LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)  # 9^9 = 387 million strings from about 650 bytes


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (LAUGHS, f"f.yaml:6: more than {MAX_EXPANDED_NODES} values once aliases are expanded"),
        ("a: &a [*a]\n", "f.yaml:1: an alias refers to itself"),
        ("kind: x\nspec: !!binary aGVsbG8=\n", "f.yaml:2: the tag !!binary is not allowed"),
        ("s: !!set {a, b}\n", "f.yaml:1: the tag !!set is not allowed"),
        ("o: !!omap [a: 1]\n", "f.yaml:1: the tag !!omap is not allowed"),
        ("kind: !custom x\n", "f.yaml:1: the tag !custom is not allowed"),
        ("n: " + "9" * 5001 + "\n", 'f.yaml:1: the integer "999999999999999999999999"...'),
        ("n: 9223372036854775808\n", "f.yaml:1: the integer"),
        ("n: -9223372036854775809\n", "f.yaml:1: the integer"),
        ("\n\nr: {perDevice: .nan}\n", "f.yaml:3: .nan is not allowed"),
        ("r: -.inf\n", "f.yaml:1: -.inf is not allowed"),
        ('{"n": 123456789012345678901234}', "f.yaml:1: the integer"),
    ],
)
def test_hostile_yaml_table(text: str, problem: str) -> None:
    with pytest.raises(ValidationError) as err:
        load_documents(text, source="f.yaml")
    assert str(err.value).startswith(problem), str(err.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("n: 9223372036854775807\nm: -9223372036854775808\n", {"n": 2**63 - 1, "m": -(2**63)}),
        ("d: 2024-01-01\n", {"d": "2024-01-01"}),  # a date stays a string
        ("a: &x {k: v}\nb: *x\n", {"a": {"k": "v"}, "b": {"k": "v"}}),  # a few aliases: fine
        ("base: &b {x: 1}\nm: {<<: *b, y: 2}\n", {"base": {"x": 1}, "m": {"x": 1, "y": 2}}),
        ('{"n": NaN}', {"n": "NaN"}),  # not JSON, so YAML: a string (refused by validation)
    ],
)
def test_plain_yaml_still_loads(text: str, expected: dict[str, object]) -> None:
    assert load_documents(text, source="f.yaml") == [expected]


def test_nan_replicas_are_refused_by_name_not_as_missing() -> None:
    text = (
        "apiVersion: edgefleet.io/v1\nkind: ModelDeployment\nmetadata: {name: d}\n"
        "spec: {model: {name: m, version: '1'}, replicas: {perDevice: .nan}}\n"
    )
    with pytest.raises(ValidationError, match=r"f.yaml:4: \.nan is not allowed"):
        load_manifests(text, source="f.yaml")


# -- properties -------------------------------------------------------------------------------

_yamlish = st.text(
    alphabet=st.sampled_from(list("ab:-&*![]{},'\"\n #.|>0123456789~!%@`\t")), max_size=200
)


@examples(3000)
@given(st.one_of(_yamlish, st.text(max_size=200), st.binary(max_size=200)))
def test_any_text_loads_or_is_a_validation_error(text: str | bytes) -> None:
    try:
        docs = load_documents(text, source="f.yaml")
    except ValidationError as exc:
        assert str(exc).startswith("f.yaml")
        return
    assert all(isinstance(d, dict) for d in docs)
    json.dumps(docs)  # plain data: what edgectl sends as JSON


_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
)
_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
_field_names = st.sampled_from(
    ["model", "runtime", "replicas", "perDevice", "total", "placement", "nodeSelector",
     "probes", "rollout", "scaling", "power", "resources", "name", "version", "labels"]
)  # fmt: skip
_spec = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(_field_names, inner, max_size=5)
    ),
    max_leaves=25,
)


@examples(600)
@given(
    st.sampled_from(["ModelDeployment", "DeviceHealthPolicy", "SecurityBaseline", "Other", 3]),
    _value,
    _spec,
)
def test_any_document_is_a_manifest_or_a_validation_error(
    kind: object, metadata: object, spec: object
) -> None:
    doc = {"apiVersion": "edgefleet.io/v1", "kind": kind, "metadata": metadata, "spec": spec}
    try:
        parse_manifest(doc)
    except ValidationError as exc:
        assert exc.problems and all(str(p) for p in exc.problems)


def test_edgectl_apply_on_a_billion_laughs_file_stays_small_and_says_why(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "laughs.yaml"
    bad.write_text(LAUGHS)
    config = tmp_path / "admin.toml"  # never used: the file is refused before connecting
    (tmp_path / "x.pem").write_text("")
    config.write_text(
        'hub = "127.0.0.1:1"\ncaCertificate = "x.pem"\ncertificate = "x.pem"\nkey = "x.pem"\n'
    )
    # The child writes its own peak RSS, VmHWM of its own address space: RUSAGE_CHILDREN
    # here is the peak of every child the session reaped, and the child's ru_maxrss
    # starts from this (large, long-lived) worker's RSS, which exec carries over.
    peak = tmp_path / "maxrss"
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from edgectl.cli import main\n"
        "try:\n"
        "    code = main(sys.argv[2:])\n"
        "finally:\n"
        "    with open(sys.argv[1], 'w') as f:\n"
        "        f.write(next(line.split()[1] for line in open('/proc/self/status')\n"
        "                     if line.startswith('VmHWM:')))\n"
        "sys.exit(code)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(peak),
         "--config", str(config), "apply", "-f", str(bad)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.strip() == (
        f"error: {bad}:6: more than {MAX_EXPANDED_NODES} values once aliases are expanded"
    )
    assert "Traceback" not in out.stderr
    assert int(peak.read_text()) < 512 * 1024  # KiB
