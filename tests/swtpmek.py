"""A software TPM (swtpm) manufactured by ``swtpm_setup`` with an RSA EK certificate issued by a
local CA (``swtpm_localca``), served on free loopback ports: what the TPM attestation tests
and the end-to-end test of TPM-only secrets enroll devices with. Missing swtpm fails the test
(Debian packages swtpm, swtpm-tools: scripts/install-system-deps), it does not skip."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edgefleet.launching import free_port_pair


@dataclass
class Tpm:
    tcti: str
    ca: Path  # the CA that issued the EK certificate (what the hub must trust)
    other_ca: Path  # a CA that issued nothing here (only when asked for)


def setup_config(d: Path) -> Path:
    (d / "ca").mkdir()
    (d / "localca.conf").write_text(
        f"statedir = {d / 'ca'}\nsigningkey = {d / 'ca' / 'signkey.pem'}\n"
        f"issuercert = {d / 'ca' / 'issuercert.pem'}\ncertserial = {d / 'ca' / 'certserial'}\n"
    )
    (d / "localca.options").write_text("--platform-manufacturer test\n--platform-version 2.1\n")
    conf = d / "setup.conf"
    conf.write_text(
        "create_certs_tool = /usr/bin/swtpm_localca\n"
        f"create_certs_tool_config = {d / 'localca.conf'}\n"
        f"create_certs_tool_options = {d / 'localca.options'}\n"
        "active_pcr_banks = sha256\n"
    )
    return conf


@contextmanager
def ek_swtpm(mkdir: Callable[[str], Path], *, other_ca: bool = False) -> Iterator[Tpm]:
    """swtpm with an EK certificate; ``mkdir(name)`` makes a fresh directory (a tmp_path
    factory's ``mktemp``). ``other_ca``: also make a CA that issued nothing here."""
    exe, setup = shutil.which("swtpm"), shutil.which("swtpm_setup")
    assert exe and setup, "swtpm/swtpm_setup missing (scripts/install-system-deps)"
    d = mkdir("swtpm")
    state = d / "state"
    state.mkdir()
    conf = setup_config(d)
    out = subprocess.run(
        [setup, "--tpm2", "--tpmstate", str(state), "--create-ek-cert", "--config", str(conf),
         "--overwrite"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    other = d / "no-other-ca"
    if other_ca:
        other = mkdir("otherca")
        conf2 = setup_config(other)
        state2 = other / "state"
        state2.mkdir()
        subprocess.run(
            [setup, "--tpm2", "--tpmstate", str(state2), "--create-ek-cert", "--config",
             str(conf2)],
            capture_output=True, timeout=120, check=True,
        )  # fmt: skip
    port = free_port_pair()
    proc = subprocess.Popen(
        [exe, "socket", "--tpm2", "--tpmstate", f"dir={state}",
         "--server", f"type=tcp,port={port}", "--ctrl", f"type=tcp,port={port + 1}",
         "--flags", "not-need-init,startup-clear"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
                assert time.monotonic() < deadline, "swtpm did not start"
                time.sleep(0.05)
        yield Tpm(
            f"swtpm:host=127.0.0.1,port={port}",
            d / "ca" / "issuercert.pem",
            other / "ca" / "issuercert.pem",
        )
    finally:
        proc.terminate()
        proc.wait(10)
