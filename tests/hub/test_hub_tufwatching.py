"""The running hub adopts a new TUF repository (hub/controllers/tufwatch.py): a real hub data
directory (``hub init`` with the quickstart TUF repository), the real context (SQLite), real
keys and files. New top-level targets installed with ``hub tuf install``'s function are
adopted; a targets file that does not verify is refused and the previous one kept."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from asynctesting import async_test

from edgefleet.trust import signing, tufmeta
from hub.initializing import init_hub
from hub.server import build_context, tuf_watcher
from hub.state.tufrepo import install_repository
from hub.trustsetup import quickstart_trust_with_tuf


@async_test
async def test_new_targets_are_adopted_and_bad_ones_refused(tmp_path: Path) -> None:
    d = tmp_path / "hub"
    await init_hub(d, region="eu-dublin", trust_setup=quickstart_trust_with_tuf)
    ctx = await build_context(d)
    try:
        assert ctx.tuf is not None and ctx.tuf.targets.version == 1
        watcher = tuf_watcher(ctx)
        assert not watcher.check()  # nothing changed
        signing.generate_key_pair(tmp_path / "vision")
        targets = tufmeta.build_targets(
            [
                tufmeta.Delegation(
                    "vision", (signing.load_public_key_raw(tmp_path / "vision.pub"),), 1,
                    ("vision-*",),
                )
            ],
            version=2,
            expires=time.time() + 86400,
        )  # fmt: skip
        new = tmp_path / "targets.json"
        new.write_bytes(tufmeta.sign(targets, [tufmeta.tuf_signer(d / "targets.key")]))
        await asyncio.to_thread(install_repository, d, d / "tuf" / "root.json", new)
        await asyncio.sleep(0.01)  # a new mtime
        assert watcher.check()
        assert ctx.tuf.targets.version == 2
        assert "vision" in (ctx.tuf.targets.delegations.roles or {})  # type: ignore[union-attr]
        # targets signed by the hub's online key (not a targets key): refused, v2 kept
        targets.version = 3
        (d / "tuf" / "targets.json").write_bytes(
            tufmeta.sign(targets, [tufmeta.tuf_signer(d / "tuf" / "online.key")])
        )
        assert not watcher.check()
        assert ctx.tuf.targets.version == 2
        reasons = [e["reason"] for e in ctx.cache.events]
        assert reasons[-2:] == ["TufRepositoryAdopted", "TufRepositoryRefused"]
    finally:
        await ctx.writer.flush()
        await ctx.store.close()
