"""A Secret that requires a TPM, end to end: a real software TPM (swtpm, EK certificate from a
local CA the hub trusts), a real ``hub serve``, two real enrolled ``edged run`` processes — one
whose attestation key is bound to that TPM's EK, one without a TPM — real workers under
Landlock and a real tmpfs.

The TPM-attested device gets the secret and its worker reads it; the software-attested one
never gets it: the deployment mounting it is not sent there, the device shows why
(``notRunning``), and a search of everything the test produced about that device (its data
directory, its secrets directory, its log, its status, what edgectl shows of it) finds no
trace of the value. Nothing anywhere holds the value in the clear."""

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
from swtpmek import ek_swtpm

from edged.runtime import landlock
from edgefleet.demo import TINY_MLP, build_mlp

SHM = Path("/dev/shm")
pytestmark = [
    pytest.mark.scenario,
    pytest.mark.skipif(landlock.abi_version() < 1, reason="no Landlock on this kernel"),
    pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm"),
]

VALUE = "tpm-only-s3cret-" + uuid.uuid4().hex
SECRET = f"""\
apiVersion: edgefleet.io/v1
kind: Secret
metadata: {{name: vault}}
spec:
  requireTpm: true
  stringData: {{token: "{VALUE}"}}
"""
DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: v}
spec:
  model: {name: mv, version: "1.0.0"}
  runtime: {executionProviders: [CPUExecutionProvider]}
  replicas: {perDevice: 1}
  placement: {nodeSelector: {site: a}}
  secrets: [{name: vault, mountPath: /run/secrets/vault}]
"""


def _remove(root: Path) -> None:
    for dirpath, dirnames, _ in os.walk(root):
        os.chmod(dirpath, 0o700)
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o700)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def shm_dirs() -> Iterator[tuple[Path, Path]]:
    tag = uuid.uuid4().hex[:8]
    dirs = (SHM / f"edgefleet-tpm-{tag}", SHM / f"edgefleet-soft-{tag}")
    yield dirs
    for d in dirs:
        _remove(d)


def test_a_secret_requiring_a_tpm_reaches_only_the_tpm_attested_device(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    edged_factory: Callable[..., Edged],
    shm_dirs: tuple[Path, Path],
) -> None:
    tpm_secrets, soft_secrets = shm_dirs
    with ek_swtpm(tmp_path_factory.mktemp) as tpm:
        hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init()
        (hub.data / "ek-cas").mkdir()
        shutil.copy(tpm.ca, hub.data / "ek-cas" / "manufacturer.pem")
        hub.start()
        outputs: list[str] = []
        devices: dict[str, tuple[Path, Edged]] = {}
        try:
            model = tmp_path / "mlp.onnx"
            build_mlp(model, TINY_MLP, seed=1)
            hub.edgectl("models", "push", str(model), "--name", "mv", "--version", "1.0.0")
            base = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
            base = base.replace("[trust]\n", "[trust]\ntpm = {tpm}\n")
            with_tpm = base.format(tpm=f'"{tpm.tcti}"') + f'\n[secrets]\ndir = "{tpm_secrets}"\n'
            without = base.format(tpm='"off"') + f'\n[secrets]\ndir = "{soft_secrets}"\n'
            for name, config in (("cam-tpm", with_tpm), ("cam-soft", without)):
                toml = tmp_path / f"{name}.toml"
                toml.write_text(config)
                data = tmp_path / name
                out = enroll(hub, data, name, {}, config=toml, token_labels={"site": "a"})
                assert out.returncode == 0, out.stdout + out.stderr
                expected = "TPM-attested" if name == "cam-tpm" else "software-attested"
                assert expected in out.stdout, out.stdout
                devices[name] = (data, edged_factory(None, data=data, config=config).start())
            (tpm_data, e_tpm), (soft_data, e_soft) = devices["cam-tpm"], devices["cam-soft"]

            applied = tmp_path / "vault.yaml"
            applied.write_text(SECRET)
            outputs.append(hub.edgectl("apply", "-f", str(applied)).stdout)
            (tmp_path / "v.yaml").write_text(DEPLOYMENT)
            outputs.append(hub.edgectl("apply", "-f", str(tmp_path / "v.yaml")).stdout)

            def device(name: str) -> dict[str, object]:
                text = hub.edgectl("get", "device", name, "-o", "json").stdout
                doc: dict[str, object] = orjson.loads(text)
                return doc

            # the TPM-attested device: the secret reaches its worker's file
            def tpm_ready() -> bool:
                names = {w["name"]: w for w in e_tpm.status()["workloads"]}
                return "v" in names and any(r["ready"] for r in names["v"]["replicas"])

            wait_for(tpm_ready, 180, "workload v to be ready on the TPM-attested device")
            assert (tpm_secrets / "v" / "vault" / "token").read_text() == VALUE

            # the device without a TPM: not sent the deployment, and says why
            def soft_reason() -> str:
                status = device("cam-soft")["status"]
                assert isinstance(status, dict)
                return str(status["notRunning"].get("v", ""))

            wait_for(soft_reason, 60, "the hub to say why cam-soft does not run v")
            assert soft_reason() == (
                "secret vault requires a TPM (spec.requireTpm): the device is software-attested "
                "(no TPM attestation key bound to its endorsement key), so the secret is never "
                "sent to it"
            )
            soft_status = e_soft.status()
            assert not any(w["name"] == "v" for w in soft_status["workloads"])
            assert soft_status["hub"].get("secrets", {}).get("held", {}) == {}
            tpm_status = e_tpm.status()
            assert tpm_status["hub"]["secrets"]["held"] == {"vault": 1}
            shown = orjson.loads(hub.edgectl("get", "secret", "vault", "-o", "json").stdout)
            assert shown["spec"] == {"keys": ["token"], "requireTpm": True}
            wide = hub.edgectl("get", "secrets", "-o", "wide").stdout
            assert wide.split("\n")[0].split()[-1] == "REQUIRE-TPM", wide
            assert wide.split("\n")[1].split()[-1] == "true", wide
            outputs.append(wide)

            soft_outputs = [
                orjson.dumps(soft_status).decode(),
                orjson.dumps(device("cam-soft")).decode(),
                hub.edgectl("describe", "device", "cam-soft").stdout,
            ]
            outputs += [
                *soft_outputs,
                orjson.dumps(tpm_status).decode(),
                orjson.dumps(device("cam-tpm")).decode(),
                hub.edgectl("get", "secrets", "-o", "yaml").stdout,
                hub.edgectl("get", "events").stdout,
            ]
            assert e_tpm.terminate() == 0 and e_soft.terminate() == 0
        finally:
            for _, e in devices.values():
                if e.proc is not None and e.proc.poll() is None:
                    e.terminate()
            hub.stop()

    forms = (VALUE.encode(), base64.b64encode(VALUE.encode()), b"tpm-only-")

    def everything(*roots: Path) -> bytes:
        out = b""
        for root in roots:
            for path in root.rglob("*") if root.is_dir() else ():
                if path.is_file() and not path.is_symlink():
                    out += path.read_bytes()
        return out

    # the device without a TPM: nothing of it, in any form, anywhere it could be
    soft_log = e_soft.log_path.read_bytes()
    soft = everything(soft_data, soft_secrets) + soft_log + "\n".join(soft_outputs).encode()
    assert soft_log, "cam-soft's log is empty: the search would prove nothing"
    for form in forms:
        assert form not in soft, "the secret reached the device without a TPM"
    # and no value in the clear anywhere else (the TPM device's tmpfs file aside)
    haystack = everything(tmp_path / "hub", tpm_data) + "\n".join(outputs).encode()
    for log in tmp_path.glob("*.log"):
        haystack += log.read_bytes()
    for form in forms:
        assert form not in haystack, "a secret value leaked"
