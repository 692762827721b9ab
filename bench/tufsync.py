"""TUF metadata update on a device, for a fleet repository of --models models (issue 11).
Not a test.

Method (/work/shared/BENCHMARKS.md: ratios against a baseline in the same run, medians):
the hub's real repository (``hub.state.tufrepo``) with --models artifacts (one model file and one
extra each) spread over --publishers delegated roles, and the device's real client
(``edged.trust.tufclient``: python-tuf's Updater with the project's fetcher), the fetch
reading the hub's files in process (no network: the figures are the device's verification
work and the bytes a sync moves). Cases:

* **cold**: a device with no TUF metadata yet (root, timestamp, snapshot, targets, then every
  publisher's delegated targets, as looking up all models needs);
* **steady**: a sync where nothing changed (python-tuf reads the timestamp, asks for a newer
  root, and stops);
* **one push**: a sync after one publisher added one model (timestamp, snapshot, that
  publisher's delegated targets), then the lookup of the new model;
* the **baseline**, today's per-artifact verification in the same run: the device verifies
  each assigned model's signed DSSE envelope (``verify_artifact_metadata``) that the desired
  state carries, for --assigned models and for all --models.

    .venv/bin/python bench/tufsync.py [--models 1000] [--publishers 10] [--assigned 10] [--reps 20]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DAY = 86400.0
PROFILE = False


def median_s(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def artifact_doc(name: str, version: str, now: float) -> dict[str, Any]:
    model = hashlib.sha256(f"{name}-{version}".encode()).hexdigest()
    extra = hashlib.sha256(f"{name}-{version}-labels".encode()).hexdigest()
    return {
        "_type": "artifact",
        "name": name,
        "version": version,
        "precision": None,
        "metadataVersion": int(now),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "expires": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 90 * DAY)),
        "files": {
            "model.onnx": {"sha256": model, "length": 123456, "role": "model"},
            "labels.txt": {"sha256": extra, "length": 321, "role": "extra"},
        },
    }


class Fetch:
    def __init__(self, repo: Any) -> None:
        self.repo = repo
        self.bytes = 0
        self.files: list[str] = []

    def __call__(self, name: str, max_length: int) -> bytes | None:
        data: bytes | None = self.repo.read(name)
        self.files.append(name)
        self.bytes += len(data or b"")
        return data

    def reset(self) -> None:
        self.bytes = 0
        self.files = []


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--publishers", type=int, default=10)
    ap.add_argument("--assigned", type=int, default=10)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    from edged.trust.tufclient import TufClient
    from edgefleet.trust import tufmeta
    from edgefleet.trust.documents import parse_artifact, parse_root
    from edgefleet.trust.envelopes import (
        ARTIFACT_TYPE,
        ROOT_TYPE,
        decode_payload,
        parse_envelope_bytes,
        sign_envelope,
    )
    from edgefleet.trust.signing import create_root, generate_key_pair, load_private_key
    from edgefleet.trust.verifying import TrustState, verify_artifact_metadata
    from hub.state.tufrepo import TufRepository, create_repository

    work = Path(tempfile.mkdtemp(prefix="bench-tuf-"))
    try:
        now = time.time()
        for k in ("root", "targets", *(f"pub{i}" for i in range(args.publishers))):
            generate_key_pair(work / k)
        from edgefleet.trust.signing import load_public_key_raw

        root_env = create_root(
            root_keys=[work / "root.key"],
            artifact_keys=[work / f"pub{i}.pub" for i in range(args.publishers)],
            out=work / "trust-root.json",
            now=now,
        )
        fleet_root = parse_root(decode_payload(root_env, expected_type=ROOT_TYPE, what="root"))
        create_repository(
            work,
            root_keys=[work / "root.key"],
            targets_key=work / "targets.key",
            delegations=[
                tufmeta.Delegation(
                    f"team{i}", (load_public_key_raw(work / f"pub{i}.pub"),), 1, (f"team{i}-*",)
                )
                for i in range(args.publishers)
            ],
            now=now,
            root_lifetime_s=365 * DAY,
            targets_lifetime_s=365 * DAY,
        )
        repo = TufRepository(work / "tuf")
        envelopes: list[bytes] = []
        per_pub = [args.models // args.publishers] * args.publishers
        per_pub[0] += args.models - sum(per_pub)
        t0 = time.perf_counter()
        for i, n in enumerate(per_pub):
            from tuf.api.metadata import Targets

            targets = Targets(version=1, expires=tufmeta._expiry(now + 90 * DAY))
            priv = load_private_key(work / f"pub{i}.key")
            for j in range(n):
                doc = artifact_doc(f"team{i}-model{j}", "1.0.0", now)
                envelopes.append(sign_envelope(ARTIFACT_TYPE, doc, [priv]).to_bytes())
                targets.targets.update(tufmeta.artifact_targets(parse_artifact(doc)))
            data = tufmeta.sign(targets, [tufmeta.tuf_signer(work / f"pub{i}.key")])
            repo.store_delegated(f"team{i}", data, 1)
        build_s = time.perf_counter() - t0
        metas = [
            parse_artifact(
                decode_payload(
                    parse_envelope_bytes(e, what="m"), expected_type=ARTIFACT_TYPE, what="m"
                )
            )
            for e in envelopes
        ]
        fetch = Fetch(repo)

        # cold: a new device, every publisher's targets (all models looked up)
        def cold() -> None:
            d = work / "dev-cold"
            shutil.rmtree(d, ignore_errors=True)
            fetch.reset()
            updater = TufClient(d).refresh(fetch, fleet_root)
            for m in metas[:: max(1, len(metas) // args.publishers)]:
                TufClient.check(updater, m)

        cold_s = median_s(cold, max(3, args.reps // 4))
        cold_bytes, cold_files = fetch.bytes, len(fetch.files)

        # steady: nothing changed since the last sync
        client = TufClient(work / "dev")
        updater = client.refresh(fetch, fleet_root)
        for m in metas[: args.assigned]:
            TufClient.check(updater, m)

        def steady() -> None:
            fetch.reset()
            up = client.refresh(fetch, fleet_root)
            for m in metas[: args.assigned]:
                TufClient.check(up, m)

        steady_s = median_s(steady, args.reps)
        if PROFILE:
            import cProfile

            cProfile.runctx("steady()", globals(), locals(), sort="cumtime")
        steady_bytes, steady_files = fetch.bytes, list(fetch.files)

        # one push: one publisher adds a model; the device syncs and looks it up
        pushes: list[float] = []
        push_bytes = 0
        pub_targets, _ = tufmeta.parse(repo.read("team0.json") or b"", Targets, what="t")
        for r in range(max(3, args.reps // 4)):
            doc = artifact_doc("team0-new", f"2.0.{r}", now)
            meta = parse_artifact(doc)
            pub_targets.version += 1
            pub_targets.targets.update(tufmeta.artifact_targets(meta))
            data = tufmeta.sign(pub_targets, [tufmeta.tuf_signer(work / "pub0.key")])
            repo.store_delegated("team0", data, pub_targets.version)
            fetch.reset()
            t = time.perf_counter()
            up = client.refresh(fetch, fleet_root)
            TufClient.check(up, meta)
            pushes.append(time.perf_counter() - t)
            push_bytes = fetch.bytes
        push_s = statistics.median(pushes)

        # baseline: today's per-artifact verification of the envelopes a desired state carries
        from edgefleet.trust.verifying import verify_initial_root

        root = verify_initial_root(root_env, now)

        def per_artifact(n: int) -> Callable[[], None]:
            def run() -> None:
                for e in envelopes[:n]:
                    verify_artifact_metadata(
                        root, parse_envelope_bytes(e, what="m"), now=now, state=TrustState()
                    )

            return run

        base_assigned_s = median_s(per_artifact(args.assigned), args.reps)
        base_all_s = median_s(per_artifact(args.models), max(3, args.reps // 4))
        env_bytes = [len(e) for e in envelopes]
        assigned_bytes = sum(env_bytes[: args.assigned])
        all_bytes = sum(env_bytes)
        sizes = {
            n: len(repo.read(n) or b"")
            for n in ("timestamp.json", "snapshot.json", "targets.json", "team0.json")
        }

        print(
            f"fleet repository: {args.models} models, {args.publishers} publishers (built and "
            f"signed in {build_s:.2f} s); the device is assigned {args.assigned} models"
        )
        print("files: " + ", ".join(f"{n} {b} B" for n, b in sizes.items()))
        print()
        print(f"{'case':60} {'time':>11} {'bytes':>10}")
        n, m = args.assigned, args.models
        rows = [
            (f"baseline: verify the {n} assigned envelopes", base_assigned_s, assigned_bytes),
            (f"baseline: verify all {m} envelopes", base_all_s, all_bytes),
            (f"TUF cold: first sync, {cold_files} files", cold_s, cold_bytes),
            (f"TUF steady: {' + '.join(steady_files)}, {n} lookups", steady_s, steady_bytes),
            ("TUF one push: timestamp, snapshot, one publisher, lookup", push_s, push_bytes),
        ]
        for label, sec, size in rows:
            print(f"{label:60.60} {sec * 1000:8.2f} ms {size:>10,}")
        print()
        base_t, base_b = base_assigned_s, assigned_bytes
        print(f"ratios against the per-artifact check of the {n} assigned models:")
        print(f"  steady sync {steady_s / base_t:.2f}x time, {steady_bytes / base_b:.2f}x bytes")
        print(f"  one push    {push_s / base_t:.2f}x time, {push_bytes / base_b:.2f}x bytes")
        print(f"  cold        {cold_s / base_t:.2f}x time, {cold_bytes / base_b:.2f}x bytes")
        print(f"against all {m} envelopes: cold {cold_s / base_all_s:.2f}x time, "
              f"{cold_bytes / all_bytes:.2f}x bytes")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
