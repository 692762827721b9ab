"""A hub on etcd through its real commands: ``hub init --store etcd://...``, ``hub serve``,
``hub token``, ``hub backup`` while serving and ``hub restore``; the store identity guards an
etcd namespace as it guards a SQLite file. Real etcd (the session's), real processes."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from etcdtesting import EtcdServer

from edgefleet.launching import program_command
from hub.state.store import EtcdStore
from hub.state.store.identity import IDENTITY_KEY, read_marker

pytestmark = pytest.mark.scenario  # several hub processes: more than 10 s on a busy machine


def _hub(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        program_command("hub", *map(str, args)),
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _tokens(d: Path) -> list[str]:
    out = _hub("token", "list", "--data-dir", d)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()[1:]


async def _delete(endpoint: str, namespace: str, key: str) -> None:
    store = await EtcdStore.open([endpoint], namespace=namespace)
    try:
        await store.delete(key)
    finally:
        await store.close()


def test_a_hub_on_etcd_inits_serves_backs_up_and_restores(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    url = f"etcd://{etcd_server.endpoint}{etcd_namespace}"
    d, other = tmp_path / "hub", tmp_path / "other"
    out = _hub("init", "--data-dir", d, "--store", url)
    assert out.returncode == 0, out.stderr
    assert tomllib.loads((d / "hub.toml").read_text())["store"] == url
    assert not (d / "hub.db").exists()
    marker = read_marker(d)
    assert marker is not None
    # a second hub in the same namespace is refused, and leaves nothing behind
    out = _hub("init", "--data-dir", other, "--store", url)
    assert out.returncode == 1 and "already holds a hub's store" in out.stderr, out.stderr
    assert not other.exists() or not any(other.iterdir())
    out = _hub("init", "--data-dir", other, "--store", f"{url}-other")
    assert out.returncode == 0, out.stderr
    # TLS flags without etcd are refused before anything is made
    out = _hub("init", "--data-dir", tmp_path / "x", "--etcd-ca", tmp_path / "ca.pem")
    assert out.returncode == 1 and "apply only to --store etcd://" in out.stderr

    assert _hub("token", "create", "--data-dir", d).returncode == 0
    assert len(_tokens(d)) == 2  # hub init's and this one

    backup = tmp_path / "hub-backup.db"
    server = subprocess.Popen(
        program_command("hub", "serve", "--data-dir", str(d), "--listen", "127.0.0.1:0",
                        "--enroll-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert "hub serving" in line, line + (server.stderr.read() if server.stderr else "")
        out = _hub("backup", "--data-dir", d, "--out", backup)  # while serving
        assert out.returncode == 0, out.stderr
        assert f"backed up store {marker.store_id}" in out.stdout
    finally:
        server.terminate()
        server.wait(30)

    assert _hub("token", "create", "--data-dir", d).returncode == 0
    assert len(_tokens(d)) == 3
    # another hub's backup is refused
    out = _hub("restore", "--data-dir", other, "--from", backup)
    assert out.returncode == 1 and "another hub's fleet" in out.stderr, out.stderr
    out = _hub("restore", "--data-dir", d, "--from", backup)
    assert out.returncode == 0, out.stderr
    assert len(_tokens(d)) == 2  # as at the backup

    # the identity lost from etcd: refused, and restorable
    asyncio.run(_delete(etcd_server.endpoint, etcd_namespace, IDENTITY_KEY))
    out = _hub("token", "list", "--data-dir", d)
    assert out.returncode == 1 and "has no store identity" in out.stderr, out.stderr
    assert _hub("restore", "--data-dir", d, "--from", backup).returncode == 0
    assert len(_tokens(d)) == 2

    # an etcd backup is a SQLite store file: a hub can move from etcd onto SQLite with it
    moved = tmp_path / "moved"
    shutil.copytree(d, moved)
    config = (moved / "hub.toml").read_text().replace(f'store = "{url}"', 'store = ""')
    (moved / "hub.toml").write_text(config)
    shutil.copy(backup, moved / "hub.db")
    assert len(_tokens(moved)) == 2
