"""Trust-root distribution and attestation benchmark (issue 11). Not a test.

Method (/work/shared/BENCHMARKS.md: ratios against a baseline in the same run, medians):

1. **Roots per sync.** Every desired state now carries the hub's root chain, and the device
   follows it before verifying the state's artifacts (``ArtifactGate.accept_root_envelopes``).
   For a chain of R roots (R-1 rotations) it measures: the steady state (nothing new: parse
   the envelopes, compare versions and payload digests), one rotation step (the last root is
   new: two signature thresholds), and the bytes the chain adds to each DesiredState. The
   baseline is today's per-artifact check in the same run: ``verify_artifact_metadata`` of one
   signed artifact (one Ed25519 signature), and a sync of a fleet repository with --models
   artifacts (that check once per model).
2. **Attestation round trip.** ``Attester.answer`` (measure, sign; with a TPM also extend and
   quote) + the hub's ``verify_evidence``: with the file identity key (the baseline) and with
   a TPM identity on swtpm (started here on free loopback ports).

    .venv/bin/python bench/trustroots.py [--reps 200] [--models 1000] [--chain 1,10,100]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def median_s(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def make_chain(work: Path, length: int) -> list[bytes]:
    from edgefleet.trust.signing import (
        create_root,
        generate_key_pair,
        rotate_root,
        sign_root,
        write_envelope,
    )

    generate_key_pair(work / "pub")
    generate_key_pair(work / "root0")
    env = create_root(root_keys=[work / "root0.key"], artifact_keys=[work / "pub.pub"])
    write_envelope(env, work / "root-1.json")
    chain = [env.to_bytes()]
    for v in range(2, length + 1):
        generate_key_pair(work / f"root{v - 1}")
        env = rotate_root(
            work / f"root-{v - 1}.json",
            root_keys=[work / f"root{v - 1}.key"],
            artifact_keys=[work / "pub.pub"],
        )
        env = sign_root(env, [work / f"root{v - 2}.key"])
        write_envelope(env, work / f"root-{v}.json")
        chain.append(env.to_bytes())
    return chain


def bench_roots(work: Path, lengths: list[int], models: int, reps: int) -> None:
    print("1. roots per sync (medians)")
    for length in lengths:
        d = work / f"chain-{length}"
        d.mkdir()
        bench_chain(d, length, models, reps)


def bench_chain(d: Path, length: int, models: int, reps: int) -> None:
    from edged.trust.admitting import ArtifactGate
    from edgefleet.demo import build_mlp
    from edgefleet.trust.envelopes import parse_envelope_bytes
    from edgefleet.trust.signing import sign_artifact
    from edgefleet.trust.verifying import TrustState, verify_artifact_metadata

    chain = make_chain(d, length)
    model = build_mlp(d / "m.onnx", (4, 8, 2), seed=1)
    _, meta_env = sign_artifact(model, name="m", version="1.0.0", keys=[d / "pub.key"])
    first = d / "image-root.json"
    first.write_bytes(chain[0])
    now = time.time()

    def gate_at(version: int) -> ArtifactGate:
        data = d / f"data-{version}"
        shutil.rmtree(data, ignore_errors=True)
        g = ArtifactGate(data, root_file=first, allow_unsigned=False)
        g.refresh_root(now)
        if version > 1:
            envs = [parse_envelope_bytes(c, what="r") for c in chain[:version]]
            g.accept_root_envelopes(envs, now, origin="bench")
        return g

    current = gate_at(length)

    def steady() -> None:
        envs = [parse_envelope_bytes(c, what="r") for c in chain]
        assert current.accept_root_envelopes(envs, now, origin="bench") is None

    t_steady = median_s(steady, reps)
    t_step = float("nan")
    if length > 1:
        samples = []
        for _ in range(max(reps // 10, 5)):
            g = gate_at(length - 1)
            envs = [parse_envelope_bytes(c, what="r") for c in chain]
            t = time.perf_counter()
            g.accept_root_envelopes(envs, now, origin="bench")
            samples.append(time.perf_counter() - t)
        t_step = statistics.median(samples)
    root = current.root
    t_art = median_s(
        lambda: verify_artifact_metadata(root, meta_env, now=now, state=TrustState()), reps
    )
    size = sum(len(c) for c in chain)
    step = (
        f"; rotation step {t_step * 1e3:.3f} ms ({t_step / t_art:.1f}x, with the fsyncs "
        "of root.json and state.json)"
        if length > 1
        else ""
    )
    print(
        f"  chain of {length:>3}: {size / 1024:6.1f} KiB per DesiredState; steady "
        f"{t_steady * 1e3:.3f} ms = {t_steady / t_art:.1f}x one artifact check, "
        f"{t_steady / (t_art * models):.4f}x {models} of them{step}"
    )
    print(f"{'':16}baseline (same run): one artifact check {t_art * 1e3:.3f} ms")


def start_swtpm(state: Path) -> tuple[subprocess.Popen[bytes], str]:
    from edgefleet.launching import free_port_pair

    exe = shutil.which("swtpm")
    if exe is None:
        raise SystemExit("swtpm is not installed (scripts/install-system-deps)")
    port = free_port_pair()
    proc = subprocess.Popen(
        [exe, "socket", "--tpm2", "--tpmstate", f"dir={state}",
         "--server", f"type=tcp,port={port}", "--ctrl", f"type=tcp,port={port + 1}",
         "--flags", "not-need-init,startup-clear"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, f"swtpm:host=127.0.0.1,port={port}"
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("swtpm did not start") from None
            time.sleep(0.05)


def bench_attestation(work: Path, reps: int) -> None:
    import orjson

    from edged.trust.attesting import Attester
    from edged.trust.identity import load_or_create_identity
    from edgefleet.trust.evidence import Policy, verify_evidence

    policy = Policy(allowed_code=None, allowed_config=None, trust_root=None, allowed_models=None)
    nonce = b"n" * 32

    def round_trip(identity: object, quoter: Any = None, ak_pem: str | None = None) -> float:
        attester = Attester(identity, code_digest="c0de", quoter=quoter)
        public = identity.public_key_pem()  # type: ignore[attr-defined]

        def once() -> None:
            ev = orjson.loads(
                orjson.dumps(
                    attester.answer(
                        nonce,
                        now=time.time(),
                        config_path=None,
                        trust_root_path=None,
                        model_digests=["ab" * 32],
                    )
                )
            )
            v = verify_evidence(
                ev,
                expected_nonce=nonce,
                identity_public_key=public,
                policy=policy,
                now=0,
                attestation_key=ak_pem,
            )
            assert v.trusted or (quoter is None and ak_pem is None and "tpm" in ev), v.reasons

        return median_s(once, reps)

    file_ident = load_or_create_identity(work / "file-id", tpm="off")
    t_file = round_trip(file_ident)
    state = work / "tpmstate"
    state.mkdir()
    proc, tcti = start_swtpm(state)
    try:
        tpm_ident = load_or_create_identity(work / "tpm-id", tpm=tcti)
        t_tpm = round_trip(tpm_ident)
        tpm_ident.close()
        from edged.trust.tpmattesting import TpmAttestationKey

        with TpmAttestationKey.create(work / "ak", tcti) as key:
            ak_pem = key.public.to_pem().decode()

        def quote(qualifying: bytes) -> dict[str, Any]:  # as edged does it for each answer
            k = TpmAttestationKey.load(work / "ak", tcti)
            assert k is not None
            with k:
                return k.quote(qualifying)

        t_ak = round_trip(file_ident, quote, ak_pem)
    finally:
        proc.terminate()
        proc.wait(10)
    print("2. attestation round trip (answer + verify, medians)")
    print(f"  file identity (baseline): {t_file * 1e3:7.3f} ms")
    print(
        f"  identity key in swtpm, PCR 23 quote (refused since: not EK-bound): "
        f"{t_tpm * 1e3:7.3f} ms ({t_tpm / t_file:.1f}x)"
    )
    print(
        f"  EK-bound AK on swtpm, PCRs 0-7 quote (open, load, quote, close): "
        f"{t_ak * 1e3:7.3f} ms ({t_ak / t_file:.1f}x)"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--chain", default="1,10,100")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="edged-bench-roots-") as tmp:
        work = Path(tmp)
        bench_roots(work, [int(x) for x in args.chain.split(",")], args.models, args.reps)
        bench_attestation(work, max(args.reps // 4, 10))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
