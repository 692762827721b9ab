"""An edged release's size, and what a device downloads for an upgrade (issue 32). Not a test.

Method (/work/shared/BENCHMARKS.md: a baseline measured in the same run):

* the release: ``packaging/agent/build-release`` on this checkout; its .tar.gz bytes, files and
  unpacked bytes;
* the baselines: the raw tree of the two packages it carries (``edgefleet/``, ``edged/``, every
  file as on disk here), and what a whole-package upgrade carries instead: those
  packages plus every third-party distribution of ``requires`` as installed here (the venv a
  Debian package ships; ``dist/*.deb`` is measured too when one was built);
* the download: a real hub (``hub init``, ``hub serve``), the release pushed with ``edgectl
  agent push``, a device enrolled with ``edged enroll``, and the device's real fetch
  (``edged.hublink.agentreleases.make_fetch``) over mutual TLS, counting every byte it
  receives: FetchArtifact (the release) and FetchTufMetadata (root, timestamp, snapshot, the
  targets and the agent role's targets). **cold**: the device's first TUF metadata with the
  upgrade; **warm**: a second release pushed and fetched, the device holding TUF metadata.

    .venv/bin/python bench/agentrelease.py [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import enroll_device, start_bench_hub  # noqa: E402


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def dist_bytes(name: str) -> int:
    files = metadata.distribution(name).files or []
    total = 0
    for f in files:
        try:
            total += Path(str(f.locate())).stat().st_size
        except OSError:
            pass
    return total


def build(out: Path, version: str, epoch: int = 0) -> Path:
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    subprocess.run(
        [sys.executable, str(REPO / "packaging" / "agent" / "build-release"),
         "--version", version, "--out", str(out)],
        check=True, capture_output=True, env=env, timeout=120,
    )  # fmt: skip
    return out


class Counting:
    """The hub link's fetcher, counting the bytes the device receives."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.artifact = 0
        self.tuf: dict[str, int] = {}

    async def metadata(self, name: str, max_length: int) -> bytes | None:
        data: bytes | None = await self.inner.metadata(name, max_length)
        self.tuf[name] = self.tuf.get(name, 0) + len(data or b"")
        return data

    async def __call__(self, sha: str, offset: int) -> AsyncIterator[tuple[int, bytes]]:
        async for at, data in self.inner(sha, offset):
            self.artifact += len(data)
            yield at, data


def fetch(device: Path, address: str, version: str, envelope: bytes) -> Counting:
    import grpc

    from edged.hublink.agentreleases import make_fetch
    from edged.hublink.linking import Fetcher
    from edged.trust.admitting import ArtifactGate
    from edged.trust.tufclient import TufClient
    from edgefleet.v1 import device_pb2, device_pb2_grpc

    async def go() -> Counting:
        creds = grpc.ssl_channel_credentials(
            (device / "hub" / "ca.crt").read_bytes(),
            (device / "identity" / "key.pem").read_bytes(),
            (device / "hub" / "device.crt").read_bytes(),
        )
        async with grpc.aio.secure_channel(address, creds) as channel:
            link = Counting(Fetcher(device_pb2_grpc.DeviceServiceStub(channel)))  # type: ignore[no-untyped-call]
            run = make_fetch(
                device,
                link=lambda: link,
                tuf=TufClient(device),
                gate=ArtifactGate(device, root_file=None, allow_unsigned=False),
            )
            await run(device_pb2.DesiredAgent(version=version, signed_metadata=envelope))
            return link

    return asyncio.run(go())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from edgefleet.launching import program_command
    from edgefleet.trust import agentreleases, signing

    work = Path(tempfile.mkdtemp(prefix="bench-agentrelease-"))
    release = build(work / "a.tar.gz", "9.0.0")
    manifest = agentreleases.inspect_release(release)
    size = release.stat().st_size
    import tarfile

    with tarfile.open(release) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
    unpacked = sum(m.size for m in members)
    raw = sum(tree_bytes(REPO / p) for p in ("edgefleet", "edged"))
    deps = sum(dist_bytes(n) for n in manifest.requires)
    debs = sorted((REPO / "dist").glob("*.deb")) if (REPO / "dist").exists() else []
    deb = debs[-1].stat().st_size if debs else None

    bench_hub = start_bench_hub(work)
    hub, hub_dir, address = bench_hub.hub, bench_hub.data, bench_hub.address
    try:

        def edgectl(*a: str) -> None:
            subprocess.run(
                program_command("edgectl", "--config", hub_dir / "admin.toml", *a),
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip

        edgectl("agent", "push", str(release), "--version", "9.0.0")
        device = work / "dev"
        enroll_device(bench_hub, device)
        key = [signing.load_private_key(hub_dir / "agent-publisher.key")]
        _, env1 = agentreleases.sign_release(
            release, version="9.0.0", private_keys=key, expires_in_s=86400
        )
        cold = fetch(device, address, "9.0.0", env1.to_bytes())
        second = build(work / "b.tar.gz", "9.0.1")
        edgectl("agent", "push", str(second), "--version", "9.0.1")
        _, env2 = agentreleases.sign_release(
            second, version="9.0.1", private_keys=key, expires_in_s=86400
        )
        warm = fetch(device, address, "9.0.1", env2.to_bytes())
    finally:
        hub.stop(15)

    def total(c: Counting) -> int:
        return c.artifact + sum(c.tuf.values())

    figures = {
        "release_bytes": size,
        "release_files": len(members),
        "release_unpacked_bytes": unpacked,
        "raw_tree_bytes": raw,
        "whole_package_bytes": raw + deps,
        "deb_bytes": deb,
        "cold_download_bytes": total(cold),
        "cold_tuf_bytes": sum(cold.tuf.values()),
        "warm_download_bytes": total(warm),
        "warm_tuf_bytes": sum(warm.tuf.values()),
        "warm_tuf_files": sorted(warm.tuf),
    }
    print(f"release (.tar.gz):            {size:>12,} bytes  ({len(members)} files, "
          f"{unpacked:,} bytes unpacked)")  # fmt: skip
    print(f"raw tree (edgefleet, edged):  {raw:>12,} bytes  release / raw = {size / raw:.3f}")
    print(f"whole package (tree + deps):  {raw + deps:>12,} bytes  release / whole = "
          f"{size / (raw + deps):.4f}")  # fmt: skip
    if deb is not None:
        print(f".deb ({debs[-1].name}):  {deb:>12,} bytes  release / deb = {size / deb:.3f}")
    else:
        print(".deb: not built here (packaging/deb/build needs PyPI); whole package stands in")
    print(
        f"device download, cold TUF:    {total(cold):>12,} bytes  (TUF {sum(cold.tuf.values()):,})"
    )
    print(f"device download, warm TUF:    {total(warm):>12,} bytes  (TUF "
          f"{sum(warm.tuf.values()):,}: {', '.join(sorted(warm.tuf))})")  # fmt: skip
    print(f"download / raw tree: {total(warm) / raw:.3f}; download / whole package: "
          f"{total(warm) / (raw + deps):.4f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
