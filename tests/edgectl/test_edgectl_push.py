"""``edgectl models push``, run as the real console command (a subprocess) against a real
grpc.aio server with mutual TLS on loopback: a hub data directory made by ``hub init`` (its
admin.toml, admin certificate and quickstart publisher key), real SQLite, a real blob store.
The AdminService here is a minimal one of this test's own around ``hub.api.push`` (the real one
is built apart)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from asynctesting import async_test

from edgefleet.demo import build_mlp
from edgefleet.trust import signing
from edgefleet.v1 import admin_pb2, admin_pb2_grpc
from hub.api.push import PushRefused
from hub.initializing import init_hub
from hub.trustsetup import quickstart_trust
from hub.wiring import HubParts, artifact_receiver, build_context

EDGECTL = [sys.executable, "-c", "import sys; from edgectl.cli import main; sys.exit(main())"]


class _Servicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, ctx: HubParts) -> None:
        self.receiver = artifact_receiver(ctx)

    async def PushArtifact(
        self,
        request_iterator: AsyncIterator[admin_pb2.PushArtifactRequest],
        context: grpc.aio.ServicerContext,
    ) -> admin_pb2.PushArtifactResponse:
        try:
            return await self.receiver.receive(request_iterator, now=time.time())
        except PushRefused as exc:
            await context.abort(exc.code, str(exc))
            raise AssertionError("unreachable") from None


@pytest.fixture
def hub_dir(tmp_path: Path) -> Path:
    d = tmp_path / "hub"
    asyncio.run(init_hub(d, region="eu-dublin", trust_setup=quickstart_trust))
    return d


@asynccontextmanager
async def _serve(d: Path) -> AsyncIterator[tuple[HubParts, Path]]:
    """The hub's AdminService on a free port; yields the context and an admin.toml for it."""
    ctx = await build_context(d)
    paths = ctx.paths
    server = grpc.aio.server()
    admin_pb2_grpc.add_AdminServiceServicer_to_server(_Servicer(ctx), server)
    port = server.add_secure_port(
        "127.0.0.1:0",
        grpc.ssl_server_credentials(
            [(paths.hub_key.read_bytes(), paths.hub_certificate.read_bytes())],
            root_certificates=paths.ca_certificate.read_bytes(),
            require_client_auth=True,
        ),
    )
    await server.start()
    admin = d / "admin-test.toml"
    admin.write_text(
        paths.admin_config.read_text().replace('"localhost:7443"', f'"localhost:{port}"')
    )
    try:
        yield ctx, admin
    finally:
        await server.stop(None)
        await ctx.writer.flush()
        await ctx.store.close()


async def _edgectl(*args: str | Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *EDGECTL,
        *map(str, args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _model(tmp: Path, name: str = "mlp.onnx", size: int = 700_000) -> Path:
    """A real ONNX model of about ``size`` bytes (an MLP 64 -> hidden -> 10)."""
    return build_mlp(tmp / name, (64, max(2, size // 300), 10), seed=sum(name.encode()))


@async_test
async def test_push_signs_with_the_publisher_key_of_admin_toml_then_is_unchanged(
    hub_dir: Path, tmp_path: Path
) -> None:
    model = _model(tmp_path)
    sha = signing.describe_file(model, "model")["sha256"]
    async with _serve(hub_dir) as (ctx, admin):
        push = ("models", "push", model, "--name", "mlp", "--version", "1.0", "--config", admin)
        code, out, err = await _edgectl(*push)
        assert code == 0, err
        assert out == f"model/mlp 1.0 pushed (sha256 {sha}, {model.stat().st_size} bytes)\n"
        # not a terminal: plain progress lines on stderr, the last one when done
        assert err.splitlines()[-1].startswith("model/mlp 1.0: 100% ")
        assert "\r" not in err
        assert ctx.blobs.path_for(sha).read_bytes() == model.read_bytes()
        assert ctx.cache.models[("mlp", "1.0")].sha256 == sha
        code, out, err = await _edgectl(*push)
        assert code == 0, err
        assert out == f"model/mlp 1.0 unchanged (sha256 {sha}, {model.stat().st_size} bytes)\n"


@async_test
async def test_a_new_name_on_stored_bytes_is_pushed_reusing_them_and_unchanged_only_when_held(
    hub_dir: Path, tmp_path: Path
) -> None:
    model = _model(tmp_path, size=20_000)
    sha = signing.describe_file(model, "model")["sha256"]
    size = model.stat().st_size
    facts = f"(sha256 {sha}, {size} bytes)"
    async with _serve(hub_dir) as (ctx, admin):
        for name, version, said in [
            ("mlp", "1.0", f"model/mlp 1.0 pushed {facts}"),
            ("mlp-copy", "1.0", f"model/mlp-copy 1.0 pushed, reusing the stored bytes of the "
             f"same model file {facts}"),
            ("mlp", "1.1", f"model/mlp 1.1 pushed, reusing the stored bytes of the same model "
             f"file {facts}"),
            ("mlp-copy", "1.0", f"model/mlp-copy 1.0 unchanged {facts}"),
        ]:  # fmt: skip
            code, out, err = await _edgectl(
                "models", "push", model, "--name", name, "--version", version, "--config", admin
            )
            assert (code, out) == (0, said + "\n"), err
        assert sorted(ctx.cache.models) == [("mlp", "1.0"), ("mlp", "1.1"), ("mlp-copy", "1.0")]
        assert ctx.blobs.digests() == {sha}  # one copy of the bytes
        pushed = [e["object"]["name"] for e in ctx.cache.events if e["reason"] == "Pushed"]
        assert pushed == ["mlp-1.0", "mlp-copy-1.0", "mlp-1.1"]


@async_test
async def test_push_shows_a_bar_on_a_terminal(hub_dir: Path, tmp_path: Path) -> None:
    import pty

    model = _model(tmp_path, size=3 << 20)
    async with _serve(hub_dir) as (_, admin):
        primary, secondary = pty.openpty()
        try:
            proc = await asyncio.create_subprocess_exec(
                *EDGECTL, "models", "push", str(model), "--name", "big", "--version", "1",
                "--config", str(admin), stdout=asyncio.subprocess.PIPE, stderr=secondary,
            )  # fmt: skip
            out, _ = await proc.communicate()
            os.close(secondary)
            secondary = -1
            seen = b""
            while True:
                try:
                    data = os.read(primary, 65536)
                except OSError:  # EIO: the terminal's other side is closed
                    break
                if not data:
                    break
                seen += data
        finally:
            os.close(primary)
            if secondary >= 0:
                os.close(secondary)
    assert proc.returncode == 0, seen
    assert out.decode().startswith("model/big 1 pushed")
    text = seen.decode()
    assert "\r\x1b[K" in text  # redrawn in place
    assert "[" + "#" * 24 + "] 100% 3.0 MiB/3.0 MiB" in text and "MiB/s in " in text


@pytest.mark.parametrize(
    ("done", "total", "elapsed", "bar", "line"),
    [
        (0, 100 << 20, 0.0, False, "  0% 0 B/100.0 MiB 0 B/s ETA -"),
        (50 << 20, 100 << 20, 5.0, False, " 50% 50.0 MiB/100.0 MiB 10.0 MiB/s ETA 5s"),
        (25 << 20, 100 << 20, 100.0, True,
         "[######..................]  25% 25.0 MiB/100.0 MiB 256.0 KiB/s ETA 5m00s"),
        (1 << 30, 1 << 30, 4000.0, False, "100% 1.0 GiB/1.0 GiB 262.1 KiB/s in 1h06m"),
        (512, 512, 0.5, True, "[########################] 100% 512 B/512 B 1.0 KiB/s in 0s"),
    ],
)  # fmt: skip
def test_progress_lines(done: int, total: int, elapsed: float, bar: bool, line: str) -> None:
    from edgectl.progress import describe

    assert describe(done, total, elapsed, bar=bar) == line


@async_test
async def test_push_of_metadata_signed_elsewhere(hub_dir: Path, tmp_path: Path) -> None:
    model = _model(tmp_path, size=1000)
    _, env = _signed_elsewhere(hub_dir, tmp_path, model)
    async with _serve(hub_dir) as (ctx, admin):
        base = ("models", "push", model, "--config", admin, "--name", "mlp")
        code, out, err = await _edgectl(
            *base, "--version", "2.0", "--metadata", tmp_path / "signed.json"
        )
        assert code == 0, err
        assert out.startswith("model/mlp 2.0 pushed")
        assert ctx.cache.models[("mlp", "2.0")].envelope == env.to_bytes()


def _signed_elsewhere(hub_dir: Path, tmp_path: Path, model: Path) -> tuple[Path, Any]:
    return signing.sign_artifact(
        model,
        name="mlp",
        version="2.0",
        keys=[hub_dir / "publisher.key"],
        out=tmp_path / "signed.json",
    )


@async_test
async def test_push_refusals(hub_dir: Path, tmp_path: Path) -> None:
    # (two edgectl processes per test: each test has 5 s, and the machine may be busy)
    model = _model(tmp_path, size=1000)
    signing.generate_key_pair(tmp_path / "stranger")
    _signed_elsewhere(hub_dir, tmp_path, model)
    async with _serve(hub_dir) as (ctx, admin):
        base = ("models", "push", model, "--config", admin, "--name", "mlp")
        code, _, err = await _edgectl(
            *base, "--version", "3.0", "--metadata", tmp_path / "signed.json"
        )
        assert code == 1
        assert "signed.json is signed for mlp 2.0, not mlp 3.0" in err

        code, _, err = await _edgectl(*base, "--version", "3.0", "--key", tmp_path / "stranger.key")
        assert code == 1
        assert "error: models push: PERMISSION_DENIED: UnknownKey:" in err
        assert ("mlp", "3.0") not in ctx.cache.models


@async_test
async def test_push_without_a_key_or_a_hub_says_what_is_missing(tmp_path: Path) -> None:
    model = _model(tmp_path, size=10)
    admin = tmp_path / "admin.toml"
    admin.write_text(
        'hub = "localhost:1"\ncaCertificate = "ca.crt"\ncertificate = "a.crt"\nkey = "a.key"\n'
    )
    code, _, err = await _edgectl(
        "models", "push", model, "--name", "m", "--version", "1", "--config", admin
    )
    assert code == 1 and "no publisher key: give --key KEY" in err
    code, _, err = await _edgectl(
        "models", "push", model, "--name", "m", "--version", "1", "--config", tmp_path / "none"
    )
    assert code == 2 and "none: cannot read" in err  # a config problem: exit 2


@async_test
async def test_push_refuses_a_file_that_is_not_onnx_before_signing(tmp_path: Path) -> None:
    junk = tmp_path / "random.onnx"
    junk.write_bytes(os.urandom(50_000))
    admin = tmp_path / "admin.toml"
    admin.write_text(
        'hub = "localhost:1"\ncaCertificate = "ca.crt"\ncertificate = "a.crt"\nkey = "a.key"\n'
    )
    code, _, err = await _edgectl(
        "models", "push", junk, "--name", "m", "--version", "1", "--config", admin
    )
    assert code == 1
    assert f"{junk}: not an ONNX model" in err
    assert not junk.with_suffix(".meta").exists()


@async_test
async def test_push_carries_extras_and_refuses_what_it_cannot_find(
    hub_dir: Path, tmp_path: Path
) -> None:
    model = _model(tmp_path)
    extra = tmp_path / "validation.npz"
    extra.write_bytes(b"\x07" * 30_000)
    extra_sha = signing.describe_file(extra, "extra")["sha256"]
    async with _serve(hub_dir) as (ctx, admin):
        base = ("models", "push", model, "--name", "mlp", "--config", admin)
        code, out, err = await _edgectl(*base, "--version", "1.0", "--extra", extra)
        assert code == 0, err
        assert out.endswith(", extras validation.npz)\n"), out
        assert ctx.cache.models[("mlp", "1.0")].extras == {"validation.npz": extra_sha}
        assert ctx.blobs.path_for(extra_sha).read_bytes() == extra.read_bytes()

        # metadata signed elsewhere that lists an extra which is not here: refused before
        # anything is sent
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "labels.txt").write_text("cat\n")
        signed, _ = signing.sign_artifact(
            model,
            name="mlp",
            version="2.0",
            keys=[hub_dir / "publisher.key"],
            extras=[elsewhere / "labels.txt"],
            out=tmp_path / "mlp-2.0.meta",
        )
        code, _, err = await _edgectl(*base, "--version", "2.0", "--metadata", signed)
        assert code == 1
        assert "the signed metadata lists files that are not here: labels.txt" in err
        assert ("mlp", "2.0") not in ctx.cache.models
        code, out, err = await _edgectl(
            *base, "--version", "2.0", "--metadata", signed, "--extra", elsewhere / "labels.txt"
        )
        assert code == 0, err
        assert "extras labels.txt" in out
