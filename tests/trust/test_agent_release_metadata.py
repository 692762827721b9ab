"""edged release metadata and files (edgefleet.trust.agentreleases), pure: real keys, real
tarballs in ``tmp_path`` (made by the real ``packaging/agent/build-release`` where the test is
about what it makes), python-tuf's Targets for the agent delegation. No hub, no clock read by
the code under test."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from trusttesting import Key

from edgefleet.errors import ArtifactError, TrustError
from edgefleet.trust import agentreleases, tufmeta
from edgefleet.trust.agentreleases import Platform
from edgefleet.trust.envelopes import ARTIFACT_TYPE, sign_envelope

REPO = Path(__file__).resolve().parents[2]
NOW = 1_900_000_000.0
X86 = Platform("x86_64", "cp311")


def tarball(out: Path, entries: dict[str, bytes], **kinds: Any) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, kind in kinds.items():
            info = tarfile.TarInfo(name.replace("__", "/"))
            info.type = kind
            info.linkname = "/etc/passwd"
            tar.addfile(info)
    return out


def entries(version: str = "0.2.1", plat: Platform = X86) -> dict[str, bytes]:
    return {
        "release.json": orjson.dumps(agentreleases.ReleaseManifest(version, plat).to_json()),
        f"lib/edgefleet-{version}.dist-info/METADATA": f"Name: edgefleet\nVersion: {version}\n"
        .encode(),
        "lib/edged/__init__.py": b"",
    }  # fmt: skip


def test_a_release_file_is_read_within_bounds_and_only_if_safe(tmp_path: Path) -> None:
    good = tarball(tmp_path / "good.tar.gz", entries())
    assert agentreleases.inspect_release(good) == agentreleases.ReleaseManifest("0.2.1", X86)
    cases = {
        "UnsafeReleasePath": [
            {**entries(), "../x": b""},
            {**entries(), "lib/../../x": b""},
            {**entries(), "/abs": b""},
            {**entries(), "etc/x": b""},
        ],
        "MalformedRelease": [
            {k: v for k, v in entries().items() if k != "release.json"},
            {**entries(), "release.json": b"{"},
            {**entries(), "release.json": orjson.dumps({"format": 2})},
            {**entries(), "lib/edgefleet-0.2.1.dist-info/METADATA": b"Version: 0.2.0\n"},
            {**entries(), "lib/edgefleet-0.1.0.dist-info/METADATA": b"\nVersion: 0.1.0\n"},
        ],
    }
    for reason, variants in cases.items():
        for i, variant in enumerate(variants):
            path = tarball(tmp_path / f"{reason}{i}.tar.gz", variant)
            with pytest.raises(ArtifactError) as info:
                agentreleases.inspect_release(path)
            assert info.value.reason == reason, (i, str(info.value))
    for kind in (tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE):
        path = tarball(tmp_path / f"k{kind!r}.tar.gz", entries(), lib__x=kind)
        with pytest.raises(ArtifactError, match="link or a special file"):
            agentreleases.inspect_release(path)
    (tmp_path / "junk.tar.gz").write_bytes(b"not gzip")
    with pytest.raises(ArtifactError, match="not a gzip'd tar"):
        agentreleases.inspect_release(tmp_path / "junk.tar.gz")
    with pytest.raises(ArtifactError) as info:
        agentreleases.inspect_release(good, max_bytes=10)
    assert info.value.reason == "ReleaseTooLarge"


def test_metadata_is_parsed_with_a_reason_naming_the_field(
    tmp_path: Path, keys: dict[str, Key]
) -> None:
    path = tarball(tmp_path / "r.tar.gz", entries())
    meta, env = agentreleases.sign_release(
        path, version="0.2.1", private_keys=[keys["pub1"].private], expires_in_s=86400, now=NOW
    )
    assert (meta.version, meta.platform, meta.file_name) == (
        "0.2.1", X86, "edged-0.2.1-x86_64-cp311.tar.gz"
    )  # fmt: skip
    assert meta.target == "agent/edged/0.2.1/edged-0.2.1-x86_64-cp311.tar.gz"
    assert agentreleases.decode_release(env.to_bytes())[1] == meta
    with pytest.raises(ArtifactError) as mismatch:
        agentreleases.sign_release(
            path, version="0.2.2", private_keys=[keys["pub1"].private], expires_in_s=1
        )
    assert mismatch.value.reason == "VersionMismatch"
    _, doc = agentreleases.build_release_metadata(path, version="0.2.1", expires_in_s=1, now=NOW)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"_type": "artifact"}, "_type"),
        ({"version": "../1"}, "version"),
        ({"platform": {"arch": "x86 64", "pythonAbi": "cp311"}}, "platform.arch"),
        ({"platform": {"arch": "x86_64", "pythonAbi": "py3"}}, "platform.pythonAbi"),
        ({"file": {**doc["file"], "name": "../../etc/x"}}, "file.name"),
        ({"file": {**doc["file"], "sha256": "ABC"}}, "file.sha256"),
        ({"file": {**doc["file"], "length": -1}}, "file.length"),
        ({"requires": {"grpcio": 1}}, "requires.grpcio"),
        ({"expires": "tomorrow"}, "expires"),
    ]
    for edit, field in bad:
        with pytest.raises(TrustError) as info:
            agentreleases.parse_release_metadata({**doc, **edit})
        assert field in str(info.value), (field, str(info.value))
    with pytest.raises(TrustError) as big:
        agentreleases.parse_release_metadata(
            {**doc, "file": {**doc["file"], "length": agentreleases.MAX_RELEASE_BYTES + 1}}
        )
    assert big.value.reason == "ReleaseTooLarge"
    # a model's payload type is not a release's, whatever the payload
    as_model = sign_envelope(ARTIFACT_TYPE, doc, [keys["pub1"].private])
    with pytest.raises(TrustError) as wrong:
        agentreleases.decode_release(as_model.to_bytes())
    assert wrong.value.reason == "WrongPayloadType"
    with pytest.raises(TrustError) as platform:
        agentreleases.check_platform(meta, Platform("aarch64", "cp311"))
    assert platform.value.reason == "WrongPlatform"
    with pytest.raises(TrustError) as expired:
        agentreleases.check_not_expired(meta, NOW + 86400)
    assert expired.value.reason == "MetadataExpired"


def test_the_agent_delegation_lists_releases_only_and_model_roles_never_do(
    keys: dict[str, Key],
) -> None:
    agent = tufmeta.Delegation("agent", (keys["pub1"].raw,), 1, (), agent=True)
    vision = tufmeta.Delegation("vision", (keys["pub2"].raw,), 1, ("*",))
    targets = tufmeta.build_targets([vision, agent], version=1, expires=NOW + 86400)
    roles = targets.delegations.roles  # type: ignore[union-attr]
    release = "agent/edged/0.2.1/edged-0.2.1-x86_64-cp311.tar.gz"
    assert roles["agent"].paths == ["agent/edged/*/*"]
    assert roles["agent"].is_delegated_path(release)
    assert not roles["agent"].is_delegated_path("agent/1.0/model.onnx")  # a model named agent
    assert not roles["vision"].is_delegated_path(release)  # "*" is one path component
    assert agentreleases.is_agent_role(roles["agent"].paths)
    assert not agentreleases.is_agent_role(roles["vision"].paths)
    assert not agentreleases.is_agent_role(["agent/edged/*/*", "*/*/*"])
    with pytest.raises(TrustError):  # an agent role signs no model names
        tufmeta.build_targets(
            [tufmeta.Delegation("a", (keys["pub1"].raw,), 1, ("*",), agent=True)],
            version=1,
            expires=NOW,
        )
    data = tufmeta.sign(targets, [])
    assert agentreleases.find_agent_role(data, keys["pub1"].raw) == "agent"
    with pytest.raises(TrustError) as none:
        agentreleases.find_agent_role(data, keys["pub2"].raw)
    assert none.value.reason == "NoDelegation"
    parsed = tufmeta.parse_agent_delegation(f"agent={keys['pub1'].pub_file}@1")
    assert (parsed.role, parsed.agent, parsed.paths) == ("agent", True, ["agent/edged/*/*"])
    for bad in ("agent", f"agent={keys['pub1'].pub_file}@0", f"root={keys['pub1'].pub_file}"):
        with pytest.raises(TrustError):
            tufmeta.parse_agent_delegation(bad)


def _build(out: Path, *extra: str, epoch: str = "0") -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, str(REPO / "packaging" / "agent" / "build-release"), "--out", str(out),
         *extra],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "SOURCE_DATE_EPOCH": epoch},
    )  # fmt: skip


def test_build_release_is_deterministic_self_contained_and_bounded(tmp_path: Path) -> None:
    a = _build(tmp_path / "a.tar.gz", "--version", "0.2.1")
    b = _build(tmp_path / "b.tar.gz", "--version", "0.2.1")
    assert a.returncode == 0 and b.returncode == 0, a.stderr
    size = (tmp_path / "a.tar.gz").stat().st_size
    assert f"edged 0.2.1 for {agentreleases.this_platform()}, {size} bytes" in a.stdout
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        manifest = orjson.loads(tar.extractfile("release.json").read())  # type: ignore[union-attr]
        meta = tar.extractfile("lib/edgefleet-0.2.1.dist-info/METADATA").read()  # type: ignore[union-attr]
    assert names == sorted(names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {(0, 0, "", "", 0)}
    assert "lib/edged/daemon.py" in names and "lib/edgefleet/trust/agentreleases.py" in names
    assert not [n for n in names if n.startswith(("lib/hub/", "lib/edgectl/", "lib/tests/"))]
    assert manifest["version"] == "0.2.1" and manifest["platform"] == (
        agentreleases.this_platform().to_json()
    )
    assert {"grpcio", "orjson", "onnxruntime", "tuf"} <= set(manifest["requires"])
    assert b"\nVersion: 0.2.1\n" in meta
    # the release runs the packages it carries and reports its own version
    lib = tmp_path / "x"
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        tar.extractall(lib, filter="data")
    import os

    out = subprocess.run(
        [sys.executable, "-c", "import edged, edgefleet.versioning as v; "
         "print(edged.__file__, v.installed_version())"],
        capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(lib / "lib")},
    )  # fmt: skip
    assert out.stdout.split() == [str(lib / "lib" / "edged" / "__init__.py"), "0.2.1"]
    # another SOURCE_DATE_EPOCH: other bytes (the hub refuses them under the same version)
    c = _build(tmp_path / "c.tar.gz", "--version", "0.2.1", epoch="1")
    assert c.returncode == 0
    assert (tmp_path / "c.tar.gz").read_bytes() != (tmp_path / "a.tar.gz").read_bytes()
    bad = _build(tmp_path / "d.tar.gz", "--version", "../1")
    assert bad.returncode != 0 and "version" in bad.stderr


def test_the_ceremony_delegates_agent_releases(
    tmp_path: Path, keys: dict[str, Key], capsys: pytest.CaptureFixture[str]
) -> None:
    """``edgectl trust tuf targets --delegate-agent``: the offline way to make, add or rotate
    the agent publisher key (give the targets again, the next version)."""
    from tuf.api.metadata import Targets

    from edgectl.cli import main as edgectl

    out = tmp_path / "targets.json"
    code = edgectl([
        "trust", "tuf", "targets", "--key", str(keys["root1"].key_file),
        "--delegate", f"lab={keys['pub2'].pub_file}:*",
        "--delegate-agent", f"agent={keys['pub1'].pub_file}+{keys['pub3'].pub_file}@2",
        "--version", "2", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    assert "agent (edged releases)" in capsys.readouterr().out
    targets, _ = tufmeta.parse(out.read_bytes(), Targets, what="targets")
    agent = targets.delegations.roles["agent"]
    assert (agent.paths, agent.threshold, len(agent.keyids)) == (["agent/edged/*/*"], 2, 2)
