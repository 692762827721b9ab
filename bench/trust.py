"""Trust benchmark: artifact verification streams (flat memory) and hashes near hashlib speed.

Not a test. Method (see /work/shared/BENCHMARKS.md): a 200 MB artifact (size with --mb), signed
with a fresh key under a fresh trust root, in a temporary directory. Each repetition runs in a
fresh subprocess:

- ``hashlib``: the baseline, ``hashlib.file_digest(f, "sha256")`` over the file;
- ``verify``: ``ArtifactGate.admit`` on it: metadata signature checks, then stream the file
  into the content-addressed store (copy + sha256 + signed-length limit + fsync + rename);
- ``extras``: the gate's streaming check of a signed extra file (sha256 + length, no copy).

Each subprocess reports its wall time and its peak RSS growth (``ru_maxrss`` after minus before
the call). Figures are medians of --reps repetitions; ratios are against hashlib in the same
run. Targets: verify memory growth < 64 MiB for 200 MB; sha256 throughput >= 0.8x hashlib.

    .venv/bin/python bench/trust.py [--mb 200] [--reps 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CHILD = r"""
import hashlib, resource, sys, time
from pathlib import Path
mode, work = sys.argv[1], Path(sys.argv[2])
model = work / "model.onnx"
if mode != "hashlib":
    from edgefleet.artifacts.storing import ArtifactStore
    from edged.trust.admitting import ArtifactGate, ArtifactRequest
    from edgefleet.trust.signing import read_envelope  # noqa: F401  (imports cryptography now)
    from edgefleet.trust.documents import parse_artifact
    from edgefleet.trust.envelopes import ARTIFACT_TYPE, decode_payload
    import shutil
    data = work / "data"
    shutil.rmtree(data, ignore_errors=True)
    gate = ArtifactGate(data, root_file=work / "root.json", allow_unsigned=False)
    store = ArtifactStore(data / "artifacts")
    now = gate.begin()
    req = ArtifactRequest("big", "1.0.0", model, work / "model.onnx.metadata.json")
    env = read_envelope(work / "with-extras.metadata.json")
    meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="m"))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if mode == "hashlib":
    with open(model, "rb") as f:
        hashlib.file_digest(f, "sha256").hexdigest()
elif mode == "copy":
    import os, shutil
    dst = work / "copy.bin"
    shutil.copyfile(model, dst)
    fd = os.open(dst, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    dst.unlink()
elif mode == "verify":
    gate.admit(req, store, now=now, max_bytes=1 << 40)
else:
    gate._check_extras(meta, work, "big")
elapsed = time.perf_counter() - t
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(elapsed, (after - before) * 1024, after * 1024)
"""


def prepare(work: Path, mb: int) -> None:
    from edgefleet.trust.signing import create_root, generate_key_pair, sign_artifact

    block = os.urandom(1 << 20)
    with open(work / "model.onnx", "wb") as f:
        f.write(b"\x08" + block[1:])  # sniffs as ONNX (field 1 varint)
        for _ in range(mb - 1):
            f.write(block)
    os.link(work / "model.onnx", work / "extra.bin")  # same bytes, for the extras path
    generate_key_pair(work / "pub")
    create_root(
        root_keys=[work / "pub.key"], artifact_keys=[work / "pub.pub"], out=work / "root.json"
    )
    sign_artifact(  # the model alone: what `verify` measures
        work / "model.onnx", name="big", version="1.0.0", keys=[work / "pub.key"]
    )
    sign_artifact(  # with an extra file: what `extras` measures
        work / "model.onnx",
        name="big",
        version="1.0.0",
        keys=[work / "pub.key"],
        extras=[work / "extra.bin"],
        out=work / "with-extras.metadata.json",
    )


def run(mode: str, work: Path) -> tuple[float, int, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(work)],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
    ).stdout.split()
    return float(out[0]), int(out[1]), int(out[2])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    mib = 1 << 20
    with tempfile.TemporaryDirectory(prefix="edged-bench-trust-") as tmp:
        work = Path(tmp)
        prepare(work, args.mb)
        size = (work / "model.onnx").stat().st_size
        modes = ("hashlib", "copy", "verify", "extras")
        results: dict[str, list[tuple[float, int, int]]] = {m: [] for m in modes}
        for _ in range(args.reps):
            for mode in modes:
                results[mode].append(run(mode, work))
    med = {
        m: (
            statistics.median(t for t, _, _ in r),
            statistics.median(b for _, b, _ in r),
            statistics.median(p for _, _, p in r),
        )
        for m, r in results.items()
    }
    base_t = med["hashlib"][0]
    print(f"artifact {size / mib:.0f} MiB, {args.reps} repetitions, medians")
    head = ("path", "seconds", "MB/s", "x hashlib", "RSS growth", "peak RSS")
    print("{:<8} {:>8} {:>6} {:>9} {:>11} {:>9}".format(*head))
    for mode, (t, rss, peak) in med.items():
        print(
            f"{mode:<8} {t:8.3f} {size / t / 1e6:6.0f} {base_t / t:9.2f} "
            f"{rss / mib:7.1f} MiB {peak / mib:5.1f} MiB"
        )
    v_t, v_rss, _ = med["verify"]
    c_t = med["copy"][0]
    e_t = med["extras"][0]
    print(
        f"target: verify memory growth < 64 MiB: {'met' if v_rss < 64 * mib else 'NOT met'} "
        f"({v_rss / mib:.1f} MiB; peak RSS of the whole process {med['verify'][2] / mib:.0f} MiB)"
    )
    print(
        f"target: sha256 throughput >= 0.8x hashlib: streaming check {base_t / e_t:.2f}x "
        f"({'met' if base_t / e_t >= 0.8 else 'NOT met'})"
    )
    print(
        f"full verify (hash + copy into the store + fsync): {base_t / v_t:.2f}x hashlib, "
        f"{c_t / v_t:.2f}x a plain copy+fsync (the I/O floor)"
    )
    if args.json:
        args.json.write_text(json.dumps({"size": size, "runs": results, "medians": med}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
