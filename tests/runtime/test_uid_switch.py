"""A uid of its own per worker, enforced by this machine's kernel: real workers started as root
(as edged starts them) switch to the uid the allocator took, serve inference (real ONNX
Runtime, a tiny MLP), and try what ``EDGEFLEET_TEST_WORKER_PROBE`` lists once switched. The
uids, gids and groups are read from ``/proc/PID/status``; a denial is the kernel's.

Needs root (skipped otherwise, with the reason): only root can switch to another uid.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
import pytest
from workerprocess import Worker, launch_spec

from edged.runtime.framing import NO_HEADER_LENGTH, RESULT_PREFIX, U32, FrameType, encode_frame
from edged.runtime.identities import LOCK_DIR, WorkerUids, slot_key
from edged.runtime.launching import LaunchSpec, SandboxSpec
from edged.runtime.worker import TEST_PROBE_ENV
from edged.trust.identity import load_or_create_identity
from edged.trust.secrets import SecretVolumes, secret_dir, workload_dir
from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.sealing import public_key_of, seal_for_device

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root can give workers a uid")
SHM = Path("/dev/shm")
EACCES = "PermissionError: errno 13"


@pytest.fixture
def device(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """edged's data directory (0700) with two blobs, and two workloads' secrets on a tmpfs
    written by the real SecretVolumes (sealed to a real identity key, opened with it)."""
    data = tmp_path / "data"
    blobs = data / "artifacts" / "sha256"
    blobs.mkdir(parents=True)
    data.chmod(0o700)
    model = build_mlp(tmp_path / "model.onnx", TINY_MLP, seed=1)
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    blob = blobs / sha
    shutil.copyfile(model, blob)
    blob.chmod(0o444)
    samples = io.BytesIO()  # its validation set (validating.py), another blob of the store
    np.savez(samples, inputs=np.zeros((4, TINY_MLP[0]), np.float32), labels=np.zeros(4, np.int64))
    validation = blobs / hashlib.sha256(samples.getvalue()).hexdigest()
    validation.write_bytes(samples.getvalue())
    validation.chmod(0o444)
    other = blobs / ("0" * 64)
    other.write_bytes(b"another workload's model")
    other.chmod(0o444)
    root = SHM / f"edgefleet-uids-{uuid.uuid4().hex[:8]}"
    ident = load_or_create_identity(data, tpm="off")
    key = public_key_of(ident.public_key_pem())
    sealed = [
        seal_for_device(key, "dev", "s-a", 1, {"token": b"alpha"}),
        seal_for_device(key, "dev", "s-b", 1, {"token": b"bravo"}),
    ]
    volumes = SecretVolumes(root, data_dir=data, device_name="dev", worker_uids=True)
    assert volumes.update(sealed, {"a": ("s-a",), "b": ("s-b",)}) == {}
    yield {"data": data, "blob": blob, "other": other, "secrets": root, "validation": validation}
    for dirpath, dirnames, _ in os.walk(root):
        os.chmod(dirpath, 0o700)
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o700)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def uids() -> Iterator[WorkerUids]:
    held = WorkerUids()  # the default range, locked in systemd's directory
    yield held
    held.release_all()


def worker_spec(device: dict[str, Path], workload: str, uid: int, mode: str) -> LaunchSpec:
    blob = device["blob"]
    secret = f"s-{workload}"
    spec = launch_spec(blob, blob.name, SandboxSpec(mode=mode))
    return replace(
        spec,
        replica_id=f"{workload}-0",
        workload=workload,
        sandbox=SandboxSpec(
            mode=mode,
            separate_uid=True,
            read_dirs=(str(workload_dir(device["secrets"], workload)),),
        ),
        secret_dirs=(
            (f"/run/secrets/{secret}", str(secret_dir(device["secrets"], workload, secret))),
        ),
        uid=uid,
        validate=True,
        validation_path=str(device["validation"]),
        validation_sha256=device["validation"].name,
    )


def ids_of(pid: int) -> dict[str, list[int]]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Uid", "Gid", "Groups"):
            out[name] = [int(x) for x in rest.split()]
    return out


def infer(w: Worker) -> int:
    n = TINY_MLP[0]
    tensor = {"name": "input", "shape": [1, n], "datatype": "FP32", "data": [0.5] * n}
    body = orjson.dumps({"inputs": [tensor]})
    w.sock.sendall(encode_frame(FrameType.INFER, 7, U32.pack(NO_HEADER_LENGTH) + body))
    while True:
        ftype, req_id, payload = w.read_frame()
        if ftype == FrameType.RESULT and req_id == 7:
            return int(RESULT_PREFIX.unpack_from(payload, 0)[0])


@pytest.mark.parametrize("mode", ["landlock", "off"])
def test_two_workers_get_their_own_uids_read_only_their_own_and_serve(
    device: dict[str, Path], uids: WorkerUids, mode: str
) -> None:
    """With Landlock and without it (``off``: the uid alone keeps them apart)."""
    probe = [
        {"secret": "/run/secrets/s-a/token"},
        {"secret": "/run/secrets/s-b/token"},
        {"open": str(secret_dir(device["secrets"], "b", "s-b") / "token")},
        {"open": str(secret_dir(device["secrets"], "a", "s-a") / "token")},
        {"open": str(device["other"])},
        {"open": str(device["data"] / "identity" / "key.pem")},
    ]
    env = {TEST_PROBE_ENV: orjson.dumps(probe).decode()}
    uid_a = uids.acquire("a-0", slot_key("a", 0))
    uid_b = uids.acquire("b-0", slot_key("b", 0))
    assert uid_a != uid_b and (LOCK_DIR / str(uid_a)).exists()
    workers = [Worker(worker_spec(device, "a", uid_a, mode), env=env),
               Worker(worker_spec(device, "b", uid_b, mode), env=env)]  # fmt: skip
    try:
        metas = []
        for w, uid in zip(workers, (uid_a, uid_b), strict=True):
            kind, meta = w.first_frame()
            assert kind == "ready", meta
            metas.append(meta)
            assert ids_of(w.proc.pid) == {"Uid": [uid] * 4, "Gid": [uid] * 4, "Groups": []}
            sandbox = meta["sandbox"]
            assert sandbox["uid"] == uid and sandbox["gid"] == uid and sandbox["separateUid"]
            assert sandbox["problems"] == [], sandbox
            assert meta["validation"]["samples"] == 4, meta["validation"]  # read as its uid
            assert infer(w) == 200
        outcomes = [
            {f"{r['step']} {r['target']}": r["outcome"] for r in m["testProbe"]} for m in metas
        ]
        a, b = outcomes
        root = device["secrets"]
        assert a["secret /run/secrets/s-a/token"] == "ok"
        assert a["secret /run/secrets/s-b/token"] == "not mounted"
        assert a[f"open {root / 'b' / 's-b' / 'token'}"] == EACCES
        assert b["secret /run/secrets/s-b/token"] == "ok"
        assert b[f"open {root / 'a' / 's-a' / 'token'}"] == EACCES
        for o in outcomes:  # edged's data directory: not another blob, not its identity key
            assert o[f"open {device['other']}"] == EACCES
            assert o[f"open {device['data'] / 'identity' / 'key.pem'}"] == EACCES
    finally:
        for w in workers:
            w.close()
    # stopped: the uids are free again, and the same slot gets the same one back
    uids.release("a-0")
    assert not (LOCK_DIR / str(uid_a)).exists()
    assert uids.acquire("a-0", slot_key("a", 0)) == uid_a


def test_a_required_uid_that_cannot_be_had_fails_the_start(device: dict[str, Path]) -> None:
    spec = worker_spec(device, "a", -1, "landlock")
    spec = replace(
        spec,
        sandbox=replace(spec.sandbox, required=True),
        uid_problem="no uid of 70000-70001 is free",
    )
    w = Worker(spec)
    try:
        kind, doc = w.first_frame()
    finally:
        w.close()
    assert kind == "failed" and doc["reason"] == "SandboxUnavailable", doc
    assert "no uid of 70000-70001 is free" in doc["message"]


def test_without_a_uid_and_not_required_it_runs_and_says_why(device: dict[str, Path]) -> None:
    spec = replace(worker_spec(device, "a", -1, "landlock"), uid_problem="no uid is free")
    w = Worker(spec)
    try:
        kind, meta = w.first_frame()
    finally:
        w.close()
    assert kind == "ready", meta
    sandbox = meta["sandbox"]
    assert sandbox["separateUid"] is False and sandbox["uid"] == os.getuid()
    assert sandbox["problems"] == ["no uid of its own: no uid is free"]


SWITCH = """
import os, sys
from edged.runtime.privileges import capabilities, drop_to
uid = int(sys.argv[1])
drop_to(uid, uid)
caps = capabilities()
ok = (os.getresuid() == (uid,) * 3 and os.getresgid() == (uid,) * 3 and os.getgroups() == []
      and not (caps["CapPrm"] or caps["CapEff"] or caps["CapAmb"]))
for back in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.setgroups([0])):
    try:
        back()
        ok = False
    except PermissionError:
        pass
sys.exit(0 if ok else 2)
"""


def test_the_switch_leaves_no_way_back_to_root(uids: WorkerUids) -> None:
    """In a process of its own started as root: after ``drop_to`` every id is the new one, no
    group and no capability is left, and setuid(0), setgid(0) and setgroups fail."""
    import subprocess
    import sys

    from workerprocess import REPO

    from edged.runtime.privileges import DropFailed, drop_to

    uid = uids.acquire("t-0", slot_key("t", 0))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-c", SWITCH, str(uid)]
    done = subprocess.run(argv, check=False, env=env, cwd="/", timeout=60)
    assert done.returncode == 0
    with pytest.raises(DropFailed, match="refusing"):
        drop_to(0, 0)  # never "switch" to root (and the test process stays as it is)
