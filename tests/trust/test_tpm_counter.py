"""The TPM NV counter under the trust state, on a real software TPM (swtpm): an older copy
of ``D/trust/`` restored whole, or the directory deleted, is TrustStateLost; ``edged trust
reset`` is the deliberate way back. Real files, real gate, real TPM; nothing faked."""

from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from trusttesting import Key, make_root

from edged.cli import main as edged
from edged.trust.admitting import ArtifactGate
from edged.trust.tpmcounter import TpmCounter, counter_lost
from edgefleet.launching import free_port_pair
from edgefleet.trust.documents import ArtifactMetadata, FileInfo


@pytest.fixture
def swtpm(tmp_path: Path) -> Iterator[str]:
    """A real software TPM on free ports; fails (does not skip) when swtpm is missing."""
    exe = shutil.which("swtpm")
    assert exe, "swtpm is not installed (Debian package swtpm; scripts/install-system-deps)"
    state = tmp_path / "tpmstate"
    state.mkdir()
    port = free_port_pair()
    proc = subprocess.Popen(
        [exe, "socket", "--tpm2", "--tpmstate", f"dir={state}",
         "--server", f"type=tcp,port={port}", "--ctrl", f"type=tcp,port={port + 1}",
         "--flags", "not-need-init,startup-clear"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            assert time.monotonic() < deadline, "swtpm did not start"
            time.sleep(0.05)
    yield f"swtpm:host=127.0.0.1,port={port}"
    proc.terminate()
    proc.wait(10)


def meta(version: str) -> ArtifactMetadata:
    data = version.encode()
    return ArtifactMetadata(
        "mlp", version, None, int(time.time()), time.time(), time.time() + 86400,
        {"m.onnx": FileInfo(hashlib.sha256(data).hexdigest(), len(data), "model")},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("tpm", "exists", "counter", "lost"),
    [
        (None, False, 0, None),  # no counter defined: nothing to compare
        (3, True, 3, None),
        (3, True, 4, None),  # the state one ahead (a crash between write and increment)
        (4, True, 3, "older copy"),
        (4, False, 0, "missing"),
    ],
)
def test_counter_lost_as_a_table(
    tpm: int | None, exists: bool, counter: int, lost: str | None
) -> None:
    got = counter_lost(tpm_value=tpm, state_exists=exists, state_counter=counter)
    assert (got is None) if lost is None else (got is not None and lost in got)


def test_a_restored_or_deleted_trust_state_is_detected(
    swtpm: str, tmp_path: Path, keys: dict[str, Key]
) -> None:
    root = tmp_path / "trust-root.json"
    root.write_bytes(make_root(keys, expires=time.time() + 86400).to_bytes())
    d = tmp_path / "dev"
    counter = TpmCounter(swtpm)

    def gate() -> ArtifactGate:
        return ArtifactGate(d, root_file=root, allow_unsigned=False, counter=counter)

    g = gate()
    g.begin()  # the image's root accepted: the state is written and counted
    assert g.root is not None and g.blocked is None
    assert counter.read() == g.state.tpm_counter == 1
    backup = tmp_path / "backup"
    shutil.copytree(d / "trust", backup)
    g.accept(meta("2.0.0"))
    assert counter.read() == g.state.tpm_counter == 2
    # an older copy of the whole trust directory (root.json and state.json agree)
    shutil.rmtree(d / "trust")
    shutil.copytree(backup, d / "trust")
    restored = gate()
    assert restored.blocked is not None and restored.blocked[0] == "TrustStateLost"
    assert "older copy" in restored.blocked[1]
    # the whole directory deleted: it would trust again from the image, forgetting 2.0.0
    shutil.rmtree(d / "trust")
    wiped = gate()
    assert wiped.blocked is not None and "missing" in wiped.blocked[1]
    # ... but enrolling again (edged enroll, with a token) is deliberate: it adopts the count
    enrolling = ArtifactGate(
        d, root_file=root, allow_unsigned=False, counter=counter, adopt_counter=True
    )
    assert enrolling.blocked is None
    shutil.rmtree(d / "trust", ignore_errors=True)
    # the deliberate way back: edged trust reset adopts the counter
    config = tmp_path / "edged.toml"
    config.write_text(f'[trust]\ntpm = "{swtpm}"\nrootFile = "{root}"\n')
    assert edged(["trust", "reset", "--data-dir", str(d), "--config", str(config)]) == 0
    again = gate()
    assert again.blocked is None
    again.begin()
    assert again.root is not None and again.state.tpm_counter == counter.read() == 3
