"""Release tarballs for the installer's tests: a valid tree of a fake edged, or one with a
chosen attack inside, and the VerifiedRelease the fetch would hand over for it."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged.agent.installing import Platform
from edged.hublink.agentreleases import VerifiedRelease

DEVICE = Platform("x86_64", "cp311")


def release_json(version: str, **kw: Any) -> dict[str, Any]:
    return {
        "format": 1,
        "name": "edged",
        "version": version,
        "platform": {"arch": DEVICE.arch, "pythonAbi": DEVICE.python_abi},
        "requires": {"grpcio": "1.0"},
        **kw,
    }


def add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def build_release(
    path: Path,
    version: str = "0.2.1",
    *,
    doc: dict[str, Any] | None = None,
    extra: Callable[[tarfile.TarFile], None] | None = None,
    main: bytes = b"print('edged')\n",
) -> VerifiedRelease:
    with tarfile.open(path, "w:gz") as tar:
        add_file(tar, "release.json", json.dumps(doc or release_json(version)).encode())
        add_file(tar, "lib/edged/__init__.py", b"")
        add_file(tar, "lib/edged/__main__.py", main)
        if extra is not None:
            extra(tar)
    data = path.read_bytes()
    return VerifiedRelease(
        path=path,
        version=version,
        arch=DEVICE.arch,
        python_abi=DEVICE.python_abi,
        sha256=hashlib.sha256(data).hexdigest(),
        length=len(data),
        requires={"grpcio": "1.0"},
    )


def have(versions: dict[str, str]) -> Callable[[str], str | None]:
    return versions.get
