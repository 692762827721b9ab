"""Secrets end to end: a real ``hub serve``, a real enrolled ``edged run``, real gRPC with real
certificates, real workers under Landlock, a real tmpfs (/dev/shm).

A device that is not trusted while a baseline requires attestation gets no secret (its
workloads say ``SecretUnavailable``); once the baseline no longer requires it, each workload's
secret reaches a file only its own workers may read (the kernel refuses the other workload's
worker, through the worker's test probe); a new version replaces the file without a worker
restart; and no value appears in any log, status, event, edgectl output, the hub's store file
or the device's data directory."""

from __future__ import annotations

import base64
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for

from edged.runtime import landlock
from edged.runtime.worker import TEST_PROBE_ENV
from edgefleet.demo import TINY_MLP, build_mlp

SHM = Path("/dev/shm")
pytestmark = [
    pytest.mark.scenario,
    pytest.mark.skipif(landlock.abi_version() < 1, reason="no Landlock on this kernel"),
    pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm"),
]

VALUE_A = "alpha-s3cret-" + uuid.uuid4().hex
VALUE_A2 = "alpha-rotated-" + uuid.uuid4().hex
VALUE_B = "bravo-s3cret-" + uuid.uuid4().hex
VALUES = (VALUE_A, VALUE_A2, VALUE_B)

SECRET = """\
apiVersion: edgefleet.io/v1
kind: Secret
metadata: {{name: {name}}}
spec:
  stringData: {{token: "{value}"}}
"""
DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {name}}}
spec:
  model: {{name: m{name}, version: "1.0.0"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  placement:
    nodeSelector: {{site: a}}
    tolerations: [{{key: node.edgefleet.io/untrusted, operator: Exists}}]
  secrets: [{{name: {secret}, mountPath: /run/secrets/{secret}}}]
"""
BASELINE = """\
apiVersion: edgefleet.io/v1
kind: SecurityBaseline
metadata: {{name: fleet}}
spec:
  requireAttestation: {require}
  allowedCodeDigests: ["sha256:{zeros}"]
"""


@pytest.fixture
def secrets_dir() -> Iterator[Path]:
    root = SHM / f"edgefleet-e2e-{uuid.uuid4().hex[:8]}"
    yield root
    for dirpath, dirnames, _ in os.walk(root):
        os.chmod(dirpath, 0o700)
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o700)
    shutil.rmtree(root, ignore_errors=True)


def _apply(hub: HubProcess, tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return hub.edgectl("apply", "-f", str(path)).stdout


def _baseline(require: bool) -> str:
    return BASELINE.format(require=str(require).lower(), zeros="0" * 64)


def test_secrets_reach_only_their_workers_rotate_in_place_and_never_leak(
    tmp_path: Path,
    edged_factory: Callable[..., Edged],
    secrets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init().start()
    outputs: list[str] = []
    try:
        model = tmp_path / "mlp.onnx"
        build_mlp(model, TINY_MLP, seed=1)
        for name in ("ma", "mb"):
            hub.edgectl("models", "push", str(model), "--name", name, "--version", "1.0.0")
        data = tmp_path / "dev-0"
        out = enroll(hub, data, "dev-0", {}, token_labels={"site": "a"})  # a Secret follows it
        assert out.returncode == 0, out.stdout + out.stderr
        file_a = secrets_dir / "a" / "s-a" / "token"
        file_b = secrets_dir / "b" / "s-b" / "token"
        # each worker tries both secrets as a workload finds them (EDGEFLEET_SECRET_DIRS) and
        # both files by their paths
        probe = [{"secret": "/run/secrets/s-a/token"}, {"secret": "/run/secrets/s-b/token"},
                 {"open": str(file_a)}, {"open": str(file_b)}]  # fmt: skip
        monkeypatch.setenv(TEST_PROBE_ENV, orjson.dumps(probe).decode())
        config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
        config += f'\n[secrets]\ndir = "{secrets_dir}"\n'
        e = edged_factory(None, data=data, config=config).start()

        # 1. attestation required, and this device cannot pass it: no secret, no worker
        _apply(hub, tmp_path, "baseline", _baseline(True))
        outputs.append(_apply(hub, tmp_path, "s-a", SECRET.format(name="s-a", value=VALUE_A)))
        value_file = tmp_path / "b-token.txt"  # s-b through edgectl create secret --from-file
        value_file.write_text(VALUE_B)
        created = hub.edgectl("create", "secret", "s-b", "--from-file", f"token={value_file}")
        assert created.stdout == "secret/s-b created\n"
        outputs.append(created.stdout + created.stderr)
        _apply(hub, tmp_path, "a", DEPLOYMENT.format(name="a", secret="s-a"))
        _apply(hub, tmp_path, "b", DEPLOYMENT.format(name="b", secret="s-b"))

        def untrusted() -> bool:
            doc = orjson.loads(hub.edgectl("get", "device", "dev-0", "-o", "json").stdout)
            return doc["status"]["attestation"]["state"] == "Untrusted"

        wait_for(untrusted, 60, "the device to fail attestation")

        def withheld() -> bool:
            return orjson.dumps(e.status()).decode().count("SecretUnavailable") >= 2

        wait_for(withheld, 60, "both workloads to be refused their secrets")
        assert not file_a.exists() and not file_b.exists()
        assert not any(w["name"] in ("a", "b") and w["replicas"] for w in e.status()["workloads"])

        # 2. no longer required: each workload's secret reaches its own directory
        _apply(hub, tmp_path, "baseline", _baseline(False))

        def both_ready() -> bool:
            names = {w["name"]: w for w in e.status()["workloads"]}
            return all(
                n in names and any(r["ready"] for r in names[n]["replicas"]) for n in ("a", "b")
            )

        wait_for(both_ready, 120, "workloads a and b to be ready with their secrets")
        assert file_a.read_text() == VALUE_A and file_b.read_text() == VALUE_B
        # as root, each worker runs as a uid of its own and reads its secrets through a
        # descriptor it opened before leaving root: readable files below 0700 directories
        own_uids = os.geteuid() == 0
        modes = ("0o444", "0o555") if own_uids else ("0o400", "0o500")
        assert oct(file_a.resolve().stat().st_mode & 0o777) == modes[0]
        assert oct(file_a.resolve().parent.stat().st_mode & 0o777) == modes[1]
        assert oct(secrets_dir.stat().st_mode & 0o777) == "0o700"
        assert oct((secrets_dir / "a").stat().st_mode & 0o777) == "0o700"

        # the kernel's verdicts: each worker reads its own secret, not the other's
        # (each worker's stderr, forwarded into edged's log)
        lines = wait_for(lambda: e.probe_results()[:2] if len(e.probe_results()) >= 2 else [],
                         30, "both workers' probe results")  # fmt: skip
        denied = "PermissionError: errno 13"
        own_path = denied if own_uids else "ok"  # its own file by path: only as edged's user
        verdicts = sorted(tuple(r["outcome"] for r in line) for line in lines)
        assert verdicts[:2] == sorted(
            [
                ("ok", "not mounted", own_path, denied),  # a's worker
                ("not mounted", "ok", denied, own_path),  # b's worker
            ]
        ), lines

        # 3. rotation: the file is replaced, the worker keeps running
        (pid_a,) = e.worker_pids("a")
        outputs.append(_apply(hub, tmp_path, "s-a", SECRET.format(name="s-a", value=VALUE_A2)))
        wait_for(lambda: file_a.read_text() == VALUE_A2, 60, "the new version of s-a")
        assert e.worker_pids("a") == [pid_a]
        status, _ = e.infer("ma", [[0.5] * TINY_MLP[0]])
        assert status == 200
        shown = orjson.loads(hub.edgectl("get", "secrets", "-o", "json").stdout)
        versions = {i["metadata"]["name"]: i["status"]["version"] for i in shown["items"]}
        assert versions == {"s-a": 2, "s-b": 1}
        table = hub.edgectl("get", "secrets").stdout
        assert "token" in table and "s-a" in table

        # 4. attestation required again (the device is still Untrusted): the secrets are
        # withdrawn, the files go and the workloads stop
        _apply(hub, tmp_path, "baseline", _baseline(True))
        wait_for(lambda: not file_a.exists() and not file_b.exists(), 60, "the files to go")

        def stopped() -> bool:
            return not any(w["name"] == "a" and w["replicas"] for w in e.status()["workloads"])

        wait_for(stopped, 60, "workload a to stop")

        # 5. nothing anywhere holds a value in the clear
        for args in (
            ("get", "secrets", "-o", "yaml"),
            ("get", "secret", "s-a", "-o", "json"),
            ("get", "device", "dev-0", "-o", "json"),
            ("get", "deployments", "-o", "yaml"),
            ("get", "events"),
            ("describe", "device", "dev-0"),
        ):
            outputs.append(hub.edgectl(*args).stdout)
        outputs.append(orjson.dumps(e.status()).decode())
        assert e.terminate() == 0
    finally:
        hub.stop()
    haystack = "\n".join(outputs).encode()
    for root in (tmp_path / "hub", data):
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                haystack += path.read_bytes()
    for log in tmp_path.glob("*.log"):
        haystack += log.read_bytes()
    for value in VALUES:
        for form in (value.encode(), base64.b64encode(value.encode())):
            assert form not in haystack, f"a secret value leaked ({value[:5]}...)"
    assert b"alpha-" not in haystack and b"bravo-" not in haystack
