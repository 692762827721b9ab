"""``edgectl create secret``: the manifest its flags make, checked before the hub is asked
(pure; the command against a real hub is in tests/e2e/test_secrets.py)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from edgectl.errors import InputError, UsageError
from edgectl.secrets import secret_document


def test_files_and_literals_become_base64_values(tmp_path: Path) -> None:
    cert = tmp_path / "tls.crt"
    cert.write_bytes(b"\x00cert")
    doc = secret_document("tls", [str(cert), f"key={cert}"], ["token=abc=def"])
    assert doc["kind"] == "Secret" and doc["metadata"] == {"name": "tls"}
    assert doc["spec"]["data"] == {
        "tls.crt": base64.b64encode(b"\x00cert").decode(),
        "key": base64.b64encode(b"\x00cert").decode(),
        "token": base64.b64encode(b"abc=def").decode(),
    }


@pytest.mark.parametrize(
    ("files", "literals", "error", "message"),
    [
        ([], [], UsageError, "give at least one --from-file or --from-literal"),
        ([], ["novalue"], UsageError, "--from-literal: must be KEY=VALUE"),
        ([], ["a=1", "a=2"], UsageError, "--from-literal a: key 'a' is given twice"),
        (["missing.txt"], [], InputError, "--from-file missing.txt: cannot read"),
        ([], ["../x=1"], InputError, "invalid key"),
    ],
)  # fmt: skip
def test_bad_flags_are_named(
    files: list[str], literals: list[str], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        secret_document("tls", files, literals)
    assert message in str(info.value)
