"""Nothing half-written (issue 35): the end of a soak run is a power cut — every hub, edged and
worker killed -9 at once, etcd left up — and then every store, state file and artifact is
checked with the project's own loaders:

* the root's SQLite store: ``PRAGMA integrity_check``, then the hub's own load of its whole
  keyspace (``hub.state.cache.Cache.load``: every device, object, model, desired state,
  revision, rollout, placement record parsed as a hub starting would);
* the region's keyspace on etcd: the same load, and every artifact shared through it
  (``hub.state.sharedblobs``: each manifest's chunks present, their bytes hashing to its name);
* each edged's state files (``edged.agent.checking.check``, the smoke test a new release runs:
  config, desired state, baselines, hub state);
* every blob in every artifact store (each hub's ``blobs/``, each device's ``artifacts/``):
  its bytes hash to its name (what a worker checks before loading it);
* each lab VM (``--vm-devices``), its QEMU killed with the rest: booted again with edged
  masked, ``edged check`` and its artifacts' hashes in the guest (``soakvms.check_vm``).

Each check is one line of the result: ``{"what", "ok", "detail"}``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import psutil
from hubreplicatesting import NAMESPACE


def power_cut(fleet: Any) -> list[str]:
    """Kill -9 every hub, edged and worker at once (SIGCONT first: a stopped one dies too);
    what was killed."""
    pids: dict[str, int] = {}
    for i, e in enumerate(fleet.edged):
        if e.proc is not None and e.proc.poll() is None:
            try:
                for child in psutil.Process(e.proc.pid).children(recursive=True):
                    pids[f"dev-{i} worker {child.pid}"] = child.pid
            except psutil.Error:
                pass
            pids[f"dev-{i}"] = e.proc.pid
    for name, hub in (("root", fleet.root), ("eu-r0", fleet.replicas[0]),
                      ("eu-r1", fleet.replicas[1])):  # fmt: skip
        if hub is not None and hub.proc is not None and hub.proc.poll() is None:
            pids[name] = hub.proc.pid
    for k, vm in enumerate(getattr(fleet, "vms", [])):  # QEMU killed: the guest's power
        if vm.pid() is not None:
            pids[f"vm-{k}"] = vm.pid()
    for pid in pids.values():
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    for e in fleet.edged:
        if e.proc is not None:
            e.proc.wait(30)
    for vm in getattr(fleet, "vms", []):
        vm.cut()  # reaped
    for hub in (fleet.root, *fleet.replicas):
        if hub is not None and hub.proc is not None:
            hub.proc.wait(30)
    return sorted(pids)


def check_all(fleet: Any) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []

    def record(what: str, fn: Any) -> None:
        try:
            detail = fn()
            checks.append({"what": what, "ok": True, "detail": detail or ""})
        except Exception as exc:  # any failure is the finding, with its reason
            checks.append({"what": what, "ok": False, "detail": f"{type(exc).__name__}: {exc}"})

    root = fleet.root
    record("root store (SQLite integrity_check)", lambda: _sqlite_integrity(root.data / "hub.db"))
    record("root store (the hub's load)", lambda: asyncio.run(_load(None, root.data)))
    endpoints = ",".join(m.endpoint for m in fleet.etcd)
    url = f"etcd://{endpoints}{NAMESPACE}"
    record("region store on etcd (the hub's load)", lambda: asyncio.run(_load(url, root.data)))
    record("region's shared artifacts on etcd", lambda: asyncio.run(_shared_blobs(url, root.data)))
    for name, hub in (("root", root), ("eu-r0", fleet.replicas[0]), ("eu-r1", fleet.replicas[1])):
        record(f"{name} blobs", lambda hub=hub: _blobs(hub.data / "blobs" / "sha256"))
    for i, e in enumerate(fleet.edged):
        config = e.log_path.with_suffix(".toml")
        record(f"dev-{i} state files (edged check)", lambda e=e, c=config: _edged(c, e.data))
        record(f"dev-{i} artifacts", lambda e=e: _blobs(e.data / "artifacts" / "sha256"))
    for k, vm in enumerate(getattr(fleet, "vms", [])):
        from soakvms import check_vm

        record(f"vm-{k} state and artifacts, booted again (edged check in the guest)",
               lambda vm=vm: check_vm(vm))  # fmt: skip
    return checks


def _sqlite_integrity(path: Path) -> str:
    db = sqlite3.connect(path, timeout=30)
    try:
        rows = db.execute("PRAGMA integrity_check").fetchall()
    finally:
        db.close()
    if rows != [("ok",)]:
        raise AssertionError(f"integrity_check: {rows[:5]}")
    return "ok"


async def _load(url: str | None, data_dir: Path) -> str:
    from hub.state.cache import Cache
    from hub.state.store import open_store

    store = await open_store(url, data_dir=data_dir)
    try:
        cache = await Cache.load(store)
    finally:
        await store.close()
    return (
        f"{len(cache.devices)} devices, {len(cache.stored)} objects, "
        f"{len(cache.models)} models, "
        f"{sum(len(v) for v in cache.revisions.values())} revisions"
    )


async def _shared_blobs(url: str, data_dir: Path) -> str:
    from hub.state import storekeys
    from hub.state.sharedblobs import BLOBS, chunk_key
    from hub.state.store import open_store

    store = await open_store(url, data_dir=data_dir)
    try:
        kvs = (await store.range(BLOBS)).kvs
        manifests = [kv for kv in kvs if "/" not in kv.key[len(BLOBS) :]]
        for kv in manifests:
            sha = kv.key[len(BLOBS) :]
            doc = storekeys.loads(kv.value)
            digest = hashlib.sha256()
            for i in range(int(doc["chunks"])):
                part = await store.get(chunk_key(sha, i))
                if part is None:
                    raise AssertionError(f"{sha[:16]}: chunk {i} of {doc['chunks']} missing")
                digest.update(part.value)
            if digest.hexdigest() != sha:
                raise AssertionError(f"{sha[:16]}: the chunks hash to {digest.hexdigest()[:16]}")
    finally:
        await store.close()
    return f"{len(manifests)} artifacts"


def _blobs(directory: Path) -> str:
    if not directory.is_dir():
        return "none"
    bad, count = [], 0
    for path in sorted(directory.iterdir()):
        if path.name.startswith("."):
            continue
        count += 1
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        if digest.hexdigest() != path.name:
            bad.append(path.name[:16])
    if bad:
        raise AssertionError(f"{len(bad)} of {count} blobs do not hash to their names: {bad}")
    return f"{count} blobs"


def _edged(config: Path, data: Path) -> str:
    from edged.agent.checking import check

    result = check(config, data)
    if not result.ok:
        raise AssertionError(f"{result.reason}: {result.message}")
    return "ok"
