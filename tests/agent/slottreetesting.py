"""Release trees built from this checkout (the same code with another version), as
packaging/agent/build-release lays them out: ``release.json``, ``lib/edged``,
``lib/edgefleet``, ``lib/edgefleet-VERSION.dist-info``; installed straight into a slot, or
packed into a release tarball."""

from __future__ import annotations

import json
import platform
import shutil
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def build_tree(root: Path, version: str, *, patch: Callable[[Path], None] | None = None) -> Path:
    lib = root / "lib"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("edged", "edgefleet"):
        shutil.copytree(REPO / package, lib / package, ignore=ignore)
    info = lib / f"edgefleet-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: edgefleet\nVersion: {version}\n")
    abi = f"cp{sys.version_info.major}{sys.version_info.minor}"
    (root / "release.json").write_text(
        json.dumps({
            "format": 1, "name": "edged", "version": version,
            "platform": {"arch": platform.machine(), "pythonAbi": abi}, "requires": {},
        })
    )  # fmt: skip
    if patch is not None:
        patch(lib)
    return root


def install_tree(data: Path, slot: str, version: str, **kw: object) -> Path:
    root = build_tree(data / "agent" / "slots" / slot, version, **kw)  # type: ignore[arg-type]
    (root / "installed.json").write_text(json.dumps({"version": version}))
    return root


def pack_tree(tree: Path, out: Path) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        tar.add(tree / "release.json", "release.json")
        tar.add(tree / "lib", "lib")
    return out
