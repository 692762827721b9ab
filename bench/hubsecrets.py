"""Secrets benchmark (issues 11 and 18). Not a test.

Method (/work/shared/BENCHMARKS.md: ratios against a baseline in the same run, medians):

1. **Rotating the hub's key** (``hub secrets rotate-key``, :func:`hub.state.secretkeys.rotate_key`)
   over a real SQLite store holding --secrets Secrets of --bytes each: the rotation's time
   against the baseline of writing the same records again with the same transactions (the
   store's own cost: what the rotation adds is opening and sealing each value twice, and the
   key files).
2. **Opening a Secret on the device**: a ``requireTpm`` one, opened by ECDH in a TPM (swtpm,
   started here on free loopback ports; a fresh TPM session per open, as edged does), against
   the baseline of an ordinary one opened with the identity file key, same values.

    .venv/bin/python bench/hubsecrets.py [--secrets 256] [--bytes 65536] [--reps 3] [--opens 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.trustroots import start_swtpm  # noqa: E402


async def _fill(data_dir: Path, count: int, size: int) -> None:
    from edgefleet.api import ObjectMeta, Secret
    from hub.state import storekeys
    from hub.state.secrets import SecretKeys, plan_record
    from hub.state.store import Put, open_hub_store

    keys = SecretKeys.load(data_dir)
    store = await open_hub_store(None, data_dir=data_dir)
    try:
        for i in range(count):
            secret = Secret(metadata=ObjectMeta(name=f"s{i}"), data={"v": os.urandom(size)})
            record, _ = plan_record(keys, secret, None)
            value = storekeys.object_value(secret.redacted(), time.time(), record.to_json())
            await store.txn([], [Put(storekeys.object_key("Secret", secret.name), value)])
    finally:
        await store.close()


async def _rewrite(data_dir: Path) -> float:
    """The baseline: the same records read and written back, in the rotation's batches."""
    from hub.state import storekeys
    from hub.state.secretkeys import BATCH_BYTES, BATCH_RECORDS
    from hub.state.store import Compare, Put, open_hub_store

    store = await open_hub_store(None, data_dir=data_dir)
    try:
        start = time.perf_counter()
        kvs = (await store.range(storekeys.object_prefix("Secret"))).kvs
        batch: list[tuple[Compare, Put]] = []
        size = 0
        for kv in [*kvs, None]:
            if kv is None or len(batch) >= BATCH_RECORDS or size + len(kv.value) > BATCH_BYTES:
                if batch:
                    await store.txn([c for c, _ in batch], [p for _, p in batch])
                batch, size = [], 0
            if kv is not None:
                doc = storekeys.loads(kv.value)
                batch.append((Compare(kv.key, kv.mod_revision), Put(kv.key, storekeys.dumps(doc))))
                size += len(kv.value)
        return time.perf_counter() - start
    finally:
        await store.close()


async def _rotate(data_dir: Path) -> tuple[float, int]:
    from hub.state.secretkeys import rotate_key
    from hub.state.store import open_hub_store

    store = await open_hub_store(None, data_dir=data_dir)
    try:
        start = time.perf_counter()
        done = await rotate_key(store, data_dir)
        return time.perf_counter() - start, done.resealed
    finally:
        await store.close()


def bench_rotation(work: Path, count: int, size: int, reps: int) -> None:
    from hub.initializing import init_hub

    result = asyncio.run(init_hub(work / "hub", region="bench", hub_address="127.0.0.1:7443"))
    data_dir = result.paths.data_dir
    asyncio.run(_fill(data_dir, count, size))
    rotations, rewrites = [], []
    for _ in range(reps):
        rewrites.append(asyncio.run(_rewrite(data_dir)))
        took, resealed = asyncio.run(_rotate(data_dir))
        assert resealed == count, resealed
        rotations.append(took)
    rot, base = statistics.median(rotations), statistics.median(rewrites)
    mib = count * size / 2**20
    print(f"rotate-key      {count} Secrets x {size} B ({mib:.0f} MiB of values): "
          f"{rot:.2f} s (median of {reps}), {count / rot:.0f} Secrets/s")  # fmt: skip
    print(f"{'':16}baseline (same run): the same records rewritten, same batches {base:.2f} s;"
          f" ratio {rot / base:.1f}x")  # fmt: skip


def bench_open(work: Path, opens: int) -> None:
    from edged.trust.identity import load_or_create_identity
    from edged.trust.tpmattesting import TpmAttestationKey, TpmSealingKey
    from edgefleet.sealing import open_from_hub, public_key_of, seal_for_device

    values = {"token": os.urandom(4096)}
    data = work / "device"
    state = work / "swtpm"
    state.mkdir()
    proc, tcti = start_swtpm(state)
    try:
        with TpmAttestationKey.create(data, tcti) as ak:
            ak.make_sealing_key(b"\x00" * 32).save(data)
        with TpmSealingKey(data, tcti) as key:
            tpm_public = public_key_of(key.public_key_pem())
        ident = load_or_create_identity(data, tpm="off")
        file_public = public_key_of(ident.public_key_pem())
        tpm_sealed = seal_for_device(tpm_public, "d", "s", 1, values, require_tpm=True)
        file_sealed = seal_for_device(file_public, "d", "s", 1, values)

        def open_tpm() -> None:
            with TpmSealingKey(data, tcti) as key:
                assert open_from_hub(key.exchange, tpm_public, "d", tpm_sealed) == values

        def open_file() -> None:
            assert open_from_hub(ident.exchange, file_public, "d", file_sealed) == values

        def timed(fn: object, n: int) -> float:
            times = []
            for _ in range(n):
                start = time.perf_counter()
                fn()  # type: ignore[operator]
                times.append(time.perf_counter() - start)
            return statistics.median(times)

        t_file = timed(open_file, opens * 10)
        t_tpm = timed(open_tpm, opens)
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"open (device)   requireTpm, ECDH in swtpm (session, storage key, load, ZGen): "
          f"{t_tpm * 1e3:.1f} ms per Secret (median of {opens})")  # fmt: skip
    print(f"{'':16}baseline (same run): identity file key {t_file * 1e3:.3f} ms; ratio "
          f"{t_tpm / t_file:.0f}x (once per version: edged keeps the values)")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--secrets", type=int, default=256)
    p.add_argument("--bytes", type=int, default=64 * 1024)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--opens", type=int, default=20)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgefleet-bench-secrets-") as tmp:
        work = Path(tmp)
        bench_rotation(work, args.secrets, args.bytes, args.reps)
        bench_open(work, args.opens)


if __name__ == "__main__":
    main()
