"""The store's identity, ``hub backup``/``hub restore`` and the data directory's file modes, on
real files: ``hub init`` and ``hub serve`` run as the real console command (a refusal is the
process's exit and message), a real hub serving over mutual TLS (``hubserving.AdminHub``)
while a backup is taken, real SQLite files throughout."""

from __future__ import annotations

import asyncio
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from asynctesting import async_test
from hubserving import AdminHub, make_hub_dir

from edgefleet.launching import program_command
from edgefleet.v1 import admin_pb2
from hub.initializing import HubPaths
from hub.state import tokens
from hub.state.store.identity import MARKER_NAME, read_marker

PUBLIC = {
    "ca.crt",
    "hub.crt",
    "admin.crt",
    "trust-root.json",
    "publisher.pub",
    "agent-publisher.pub",
    "root.pub",
    "targets.pub",
}


def _hub(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        program_command("hub", *map(str, args)),
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _serve_refused(d: Path) -> str:
    """``hub serve`` on ``d``: it must refuse at once (exit 1), before listening."""
    out = _hub("serve", "--data-dir", d, "--listen", "127.0.0.1:0", timeout=30)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "hub serving" not in out.stdout
    return out.stderr


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_into_an_existing_open_directory_makes_it_private(tmp_path: Path) -> None:
    d = tmp_path / "hub"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    out = _hub("init", "--data-dir", d)
    assert out.returncode == 0, out.stderr
    assert _mode(d) == 0o700
    files = {p.name: _mode(p) for p in d.iterdir() if p.is_file()}
    assert {"hub.db", "hub.toml", MARKER_NAME, "ca.key", "admin.toml"} <= set(files)
    wrong = {n: oct(m) for n, m in files.items() if m != (0o644 if n in PUBLIC else 0o600)}
    assert wrong == {}


@async_test
async def test_the_database_files_stay_private_while_serving(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        await tokens.create_token(hub.ctx.store, now=time.time(), ttl=60)
        for suffix in ("", "-wal", "-shm"):
            assert _mode(paths.data_dir / f"hub.db{suffix}") == 0o600, suffix


def test_a_missing_empty_or_foreign_store_refuses_to_start(tmp_path: Path) -> None:
    d, other = tmp_path / "hub", tmp_path / "other"
    for where in (d, other):
        assert _hub("init", "--data-dir", where).returncode == 0
    marker = read_marker(d)
    assert marker is not None
    db = d / "hub.db"
    kept = tmp_path / "kept.db"
    shutil.copy(db, kept)

    db.unlink()
    message = _serve_refused(d)
    assert f"{db} is missing" in message and marker.store_id in message
    assert "hub restore" in message
    assert not db.exists()  # nothing made in its place

    db.write_bytes(b"")
    assert f"{db} is empty" in _serve_refused(d)

    shutil.copy(other / "hub.db", db)
    message = _serve_refused(d)
    assert "another hub's store" in message

    # token commands refuse too (they would have made a fresh database)
    db.unlink()
    out = _hub("token", "create", "--data-dir", d)
    assert out.returncode == 1 and "is missing" in out.stderr
    assert not db.exists()

    # the marker lost but the store intact: the store is the authority
    shutil.copy(kept, db)
    (d / MARKER_NAME).unlink()
    out = _hub("token", "list", "--data-dir", d)
    assert out.returncode == 0, out.stderr
    assert read_marker(d) == marker

    # neither: not a hub's data directory any more
    db.unlink()
    (d / MARKER_NAME).unlink()
    assert "not a hub data directory" in _serve_refused(d)


def test_backup_while_serving_and_restore_when_stopped(tmp_path: Path) -> None:
    paths = asyncio.run(make_hub_dir(tmp_path / "hub"))
    other = asyncio.run(make_hub_dir(tmp_path / "other"))
    backup = tmp_path / "backups" / "hub-1.db"
    backup.parent.mkdir()
    manifest = (
        b'{"apiVersion": "edgefleet.io/v1", "kind": "ModelDeployment", "metadata": '
        b'{"name": "%s"}, "spec": {"model": {"name": "m-%s", "version": "1.0.0"}, '
        b'"replicas": {"perDevice": 1}}}'
    )

    async def backup_while_serving() -> subprocess.CompletedProcess[str]:
        async with AdminHub(paths) as hub, hub.channel() as channel:  # online: the hub writes
            stub = hub.stub(channel)
            await stub.Apply(admin_pb2.ApplyRequest(documents=[manifest % (b"before", b"before")]))
            out = await asyncio.to_thread(
                _hub, "backup", "--data-dir", paths.data_dir, "--out", backup
            )
            await stub.Apply(admin_pb2.ApplyRequest(documents=[manifest % (b"after", b"after")]))
            return out

    out = asyncio.run(backup_while_serving())
    assert out.returncode == 0, out.stderr
    assert "backed up store" in out.stdout and _mode(backup) == 0o600

    out = _restore_under_a_serving_hub(paths.data_dir, backup)
    assert out.returncode == 1 and "in use (hub serve, pid" in out.stderr, out.stderr
    # another hub's backup is refused, and changes nothing
    out = _hub("restore", "--data-dir", other.data_dir, "--from", backup)
    assert out.returncode == 1 and "another hub's fleet" in out.stderr
    # garbage is refused
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    out = _hub("restore", "--data-dir", paths.data_dir, "--from", junk)
    assert out.returncode == 1 and "junk.db" in out.stderr

    out = _hub("restore", "--data-dir", paths.data_dir, "--from", backup)
    assert out.returncode == 0, out.stderr

    async def deployments(d: HubPaths) -> set[str]:
        async with AdminHub(d) as hub:
            return set(hub.ctx.cache.deployments)

    assert asyncio.run(deployments(paths)) == {"before"}
    assert asyncio.run(deployments(other)) == set()


def _restore_under_a_serving_hub(d: Path, backup: Path) -> subprocess.CompletedProcess[str]:
    server = subprocess.Popen(
        program_command("hub", "serve", "--data-dir", d, "--listen", "127.0.0.1:0",
                        "--enroll-listen", "127.0.0.1:0"),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        assert "hub serving" in server.stdout.readline()
        return _hub("restore", "--data-dir", d, "--from", backup)
    finally:
        server.terminate()
        server.wait(30)


if sys.platform != "linux":  # flock and file modes as on the devices' and hubs' systems
    pytestmark = pytest.mark.skip("Linux only")
