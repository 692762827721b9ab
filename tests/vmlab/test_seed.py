"""The seed disk without a VM: ``packaging/image/seed`` as a process (its argument checks, the
file system it writes, read back with e2fsprogs' debugfs), and the guest's reader
(``edgefleet-seed``, loaded from the image's rootfs) accepting what the tool writes and
refusing what it would not. Runs in the ordinary suite (no vmlab marker)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).parents[2]
SEED = REPO / "packaging" / "image" / "seed"
READER = (
    REPO / "packaging" / "image" / "rootfs" / "usr" / "lib" / "edgefleet-image" / "edgefleet-seed"
)
HASH = "sha256:" + "ab" * 32
pytestmark = pytest.mark.skipif(
    shutil.which("mke2fs") is None or shutil.which("debugfs") is None,
    reason="needs e2fsprogs (mke2fs, debugfs)",
)


def seed(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SEED), *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60
    )


def good(out: Path) -> list[str]:
    return ["--out", str(out), "--hub", "10.0.2.100:7443", "--token", "t0k.en", "--ca-hash", HASH]


def reader() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("edgefleet_seed_reader", str(READER))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--hub": "hub.example"}, "--hub: must be HOST:PORT"),
        ({"--hub": "hub.example:70000"}, "--hub: must be HOST:PORT"),
        ({"--token": "has space"}, "--token: missing, or not a token"),
        ({"--ca-hash": "sha256:abc"}, "--ca-hash: must be sha256: and 64"),
        ({"--ca-hash": "md5:" + "ab" * 16}, "--ca-hash: must be sha256: and 64"),
        ({"--root-hash": "sha256:" + "AB" * 32}, "--root-hash: must be sha256: and 64"),
        ({"--label": "site"}, "--label: must be KEY=VALUE"),
        ({"--label": "site.=a"}, "--label site.: the key must be"),
        ({"--label": "Bad_Prefix/k=a"}, "--label Bad_Prefix/k: the key's prefix"),
        ({"--label": "site=not ok"}, "--label site: the value must be"),
        ({"--edged-toml": "/nonexistent/edged.toml"}, "--edged-toml: no such file"),
        ({"--out": "/nonexistent/dir/seed.img"}, "--out: no such directory"),
    ],
)
def test_a_bad_argument_is_refused_naming_it(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    args = good(tmp_path / "seed.img")
    for flag, value in change.items():
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    out = seed(*args, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr, out.stderr
    assert not (tmp_path / "seed.img").exists()


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[inference\n")
    out = seed(
        "--out", str(tmp_path / "s.img"), "--hub", "x", "--token", "", "--ca-hash", "x",
        "--label", "a=1", "--label", "a=2", "--edged-toml", str(bad_toml), cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 2
    for flag in ("--hub:", "--token:", "--ca-hash:", "--label a: given twice", "not TOML"):
        assert flag in out.stderr, out.stderr


def test_writes_an_ext4_seed_the_guest_reader_accepts(tmp_path: Path) -> None:
    toml = tmp_path / "edged.toml"
    toml.write_text('[inference]\nlistenTcp = "127.0.0.1:8080"\n')
    img = tmp_path / "seed.img"
    args = [*good(img), "--root-hash", HASH, "--label", "site=lab", "--label", "acme.io/x=1"]
    out = seed(*args, "--edged-toml", str(toml), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert img.stat().st_size == 4 * 1024 * 1024
    assert img.stat().st_mode & 0o077 == 0  # the token is in it
    header = subprocess.run(
        ["dumpe2fs", "-h", str(img)], capture_output=True, text=True, check=True
    )
    assert "Filesystem volume name:   edgefleet-seed" in header.stdout

    def cat(name: str) -> str:
        got = subprocess.run(
            ["debugfs", "-R", f"cat {name}", str(img)], capture_output=True, text=True, check=True
        )
        return got.stdout

    doc = json.loads(cat("seed.json"))
    assert doc == {
        "format": 1,
        "hub": "10.0.2.100:7443",
        "token": "t0k.en",
        "caHash": HASH,
        "rootHash": HASH,
        "labels": {"site": "lab", "acme.io/x": "1"},
    }
    assert cat("edged.toml") == toml.read_text()
    assert reader().check(doc) == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hub": "nope"}, "seed.json: hub"),
        ({"token": ""}, "seed.json: token"),
        ({"token": "a\nEDGED_HUB=evil:1"}, "seed.json: token"),
        ({"caHash": "sha256:00"}, "seed.json: caHash"),
        ({"rootHash": 5}, "seed.json: rootHash"),
        ({"labels": {"site": "a b"}}, "seed.json: labels.site"),
        ({"labels": ["site=a"]}, "seed.json: labels"),
    ],
)
def test_the_guest_reader_refuses_a_bad_seed(change: dict[str, object], field: str) -> None:
    doc: dict[str, object] = {"format": 1, "hub": "h:1", "token": "t", "caHash": HASH}
    problems = reader().check({**doc, **change})
    assert any(p.startswith(field) for p in problems), problems
