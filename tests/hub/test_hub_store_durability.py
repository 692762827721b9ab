"""Every acknowledged write survives kill -9: a real writer process is SIGKILLed mid-stream."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from hub.state.store import SqliteStore

_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from hub.state.store import SqliteStore

    async def main() -> None:
        store = await SqliteStore.open(Path(sys.argv[1]))
        i = 0
        while True:
            revision = await store.put(f"/k/{i:06d}", str(i).encode())
            print(i, revision, flush=True)  # acknowledged: the put returned
            i += 1

    asyncio.run(main())
    """
)


def test_acknowledged_writes_survive_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"
    child = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    acknowledged: list[tuple[int, int]] = []
    try:
        for line in child.stdout:
            acknowledged.append(tuple(map(int, line.split())))  # type: ignore[arg-type]
            if len(acknowledged) == 150:
                os.kill(child.pid, signal.SIGKILL)
                break
        rest, _ = child.communicate(timeout=10)
    finally:
        child.kill()
        child.wait()
    acknowledged += [tuple(map(int, line.split())) for line in rest.splitlines()]  # type: ignore[misc]
    assert child.returncode == -signal.SIGKILL

    async def check() -> None:
        store = await SqliteStore.open(path)
        try:
            for i, revision in acknowledged:
                kv = await store.get(f"/k/{i:06d}")
                assert kv is not None, f"acknowledged write {i} (revision {revision}) was lost"
                assert kv.mod_revision == revision and kv.value == str(i).encode()
            assert (await store.range("/k/")).revision >= acknowledged[-1][1]
        finally:
            await store.close()

    asyncio.run(check())
