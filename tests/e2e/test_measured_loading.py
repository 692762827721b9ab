"""edged extends a model's measurement into its measurement PCR when a worker starts loading
it, not only before an attestation quote: a real ``edged run`` with static manifests (no hub,
so no challenge ever comes), a real software TPM (swtpm with an EK certificate), an
attestation key made in that TPM, real workers. Once each model serves, the PCR read from
the TPM is the replay of the event log, and the log holds that model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from harness import Edged, wait_for, write_manifest
from swtpmek import ek_swtpm

from edged.trust.tpmattesting import TpmAttestationKey
from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.trust.evidence import replay

PCR = 12

CONFIG = """\
[trust]
allowUnsigned = true
rootFile = "{absent}"
tpm = "{tcti}"
measurementPcr = {pcr}
measurementLog = "{log}"
"""


def _read_pcr(tcti: str, pcr: int) -> bytes:
    from tpm2_pytss import ESAPI, TPML_PCR_SELECTION

    esapi = ESAPI(tcti)
    try:
        _, _, digests = esapi.pcr_read(TPML_PCR_SELECTION.parse(f"sha256:{pcr}"))
        return bytes(digests[0])
    finally:
        esapi.close()


def _serving(e: Edged, name: str) -> str | None:
    w = e.workload(name)
    return str(w["model"]["sha256"]) if w["readyReplicas"] >= 1 else None


def test_a_model_is_in_the_pcr_once_it_serves_before_any_challenge(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    model_dir: Path,
    edged_factory: Callable[..., Edged],
) -> None:
    log_path = tmp_path / "run" / "measurements.json"
    with ek_swtpm(tmp_path_factory.mktemp) as tpm:
        data = tmp_path / "data"
        with TpmAttestationKey.create(data, tpm.tcti):
            pass  # what enrollment leaves: D/identity/ak.json (the hub's binding aside)
        config = CONFIG.format(
            absent=tmp_path / "no-root.json", tcti=tpm.tcti, pcr=PCR, log=log_path
        )
        write_manifest(model_dir)
        e = edged_factory(model_dir, data=data, config=config).start()
        try:
            e.wait_ready()
            first = wait_for(lambda: _serving(e, "mlp"), 90, "mlp serving")

            def events() -> list[dict[str, str]]:
                return list(orjson.loads(log_path.read_bytes())["events"])

            # measured when the worker started: the log holds the model (no code or config
            # event: those are extended before a quote, and no challenge came)
            assert events() == [{"kind": "model", "sha256": first}]
            assert _read_pcr(tpm.tcti, PCR) == replay(events())

            # a second model, started while the first serves
            build_mlp(model_dir / "other.onnx", TINY_MLP, seed=7)
            write_manifest(model_dir, name="other", path="other.onnx")
            second = wait_for(lambda: _serving(e, "other"), 90, "other serving")
            assert second != first
            assert events() == [
                {"kind": "model", "sha256": first},
                {"kind": "model", "sha256": second},
            ]
            assert _read_pcr(tpm.tcti, PCR) == replay(events())
            assert "model measurement failed" not in e.logs()
        finally:
            assert e.terminate() == 0
