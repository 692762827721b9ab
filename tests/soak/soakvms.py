"""The device lab's VMs in a soak run (issue 35: power cuts in the device lab's VMs;
``--vm-devices N``, docs/soak.md).

Each VM is the lab's (tests/vmlab/lab.py): the device image built by ``packaging/image/build``
booted in QEMU (TCG) with systemd, cgroup v2 and the project's .debs, its seed disk made by
``packaging/image/seed`` with a token from the region's first replica. Its edged enrolls at that
replica and dials both (``[hub] addresses``); QEMU's user networking lets the guest reach
nothing but the replicas' ports (``guestfwd`` of 10.0.2.100:PORT, the address the region's
certificate names). Its label is ``site=vm``: it runs ``soak-v`` alone, whose version the
operator's own stream changes every few minutes (``soakplan._vm_updates``), so power cuts fall
on downloads and version switches as well as on a device at rest.

A power cut is QEMU killed -9: the guest's page cache is lost, what QEMU had written to the
disk image stays, as on a device whose power is pulled. The next boot is its own: QEMU started
again on the same disk. At the end the VMs are cut with everything else and booted once more
with edged masked (``systemd.mask=edged.service``), so that ``edged check`` and the artifact
hashes see what the cut left, not what edged repaired at start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

VM_SITE = "vm"  # the VMs' label
GUEST_HUB_HOST = "10.0.2.100"  # the replicas, as a guest sees them (lab.GUEST_HUB_HOST)
BOOT_WITHIN = 1200.0  # first boot, seed and enrollment under TCG on a loaded machine
IMAGE_ENV = "EDGEFLEET_SOAK_VM_IMAGE"  # a lab image built before (packaging/image/build)
LAB = Path(__file__).resolve().parent.parent / "vmlab"


def _lab() -> Any:
    if str(LAB) not in sys.path:
        sys.path.append(str(LAB))
    import lab

    return lab


def unavailable() -> str:
    """Why VMs cannot run here ("" when they can): the lab's tools, root (the image build
    chroots; a prebuilt image in $EDGEFLEET_SOAK_VM_IMAGE needs only QEMU and socat)."""
    lab = _lab()
    if os.environ.get(IMAGE_ENV):
        missing = [t for t in ("qemu-system-x86_64", "qemu-img", "socat") if not shutil.which(t)]
        return f"the lab's VMs need {', '.join(missing)}" if missing else ""
    missing = lab.missing_tools()
    if missing:
        return f"the VM lab needs {', '.join(missing)} (scripts/install-system-deps)"
    if os.geteuid() != 0:
        return "the VM lab's image build needs root"
    return ""


def image(directory: Path) -> Path:
    """The lab's image: $EDGEFLEET_SOAK_VM_IMAGE, or built (and cached by the build) into
    ``directory/vm-image``."""
    prebuilt = os.environ.get(IMAGE_ENV)
    if prebuilt:
        return Path(prebuilt)
    out: Path = _lab().build_image(directory / "vm-image", directory)
    return out


class SoakVm:
    """One lab VM whose guest reaches every region replica (its port and enrollment port)."""

    def __init__(self, image: Path, workdir: Path, ports: list[int], seed: Path) -> None:
        lab = _lab()
        self.ports = ports
        self.vm = lab.Vm(image, workdir, SimpleNamespace(port=ports[0]), seed)
        self.vm.command = self.command  # the lab's start boots with this command line
        self.extra_cmdline = ""

    def command(self) -> list[str]:
        lab = _lab()
        cmd: list[str] = lab.Vm.command(self.vm)
        fwd = [
            f"guestfwd=tcp:{lab.GUEST_HUB_HOST}:{p}-cmd:socat STDIO TCP:127.0.0.1:{p}"
            for port in self.ports
            for p in (port, port + 1)
        ]
        fwd += [
            f"hostfwd=tcp:127.0.0.1:{self.vm.agent_port}-:{lab.AGENT_PORT}",
            f"hostfwd=tcp:127.0.0.1:{self.vm.infer_port}-:{lab.INFER_GUEST_PORT}",
        ]
        net = next(i for i, a in enumerate(cmd) if a.startswith("user,id=n0"))
        cmd[net] = ",".join(["user,id=n0,restrict=on", *fwd])
        if self.extra_cmdline:
            append = cmd.index("-append") + 1
            cmd[append] += " " + self.extra_cmdline
        return cmd

    def start(self) -> SoakVm:
        """Boot (again): the previous QEMU reaped first, the console of each boot kept."""
        old = self.vm.proc
        if old is not None:
            old.wait(30)
        self.vm.start()
        return self

    def pid(self) -> int | None:
        proc = self.vm.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def cut(self) -> None:
        """A power cut, nothing flushed by the guest."""
        self.vm.kill()

    def status(self) -> dict[str, Any] | None:
        """edged's status in the guest (the lab's agent), None while it does not answer
        (booting, cut): within 5 s, as a booting guest's forwarded port takes the connection
        and says nothing."""
        doc: dict[str, Any] = self.vm.status(timeout=5.0)
        return doc or None


def start_vms(fleet: Any, count: int) -> list[SoakVm]:
    """``count`` VMs, each seeded with a token of the region's first replica (labels
    ``site=vm``), booted at once; returns when each one's edged is connected to a replica."""
    lab = _lab()
    r0 = fleet.replicas[0]
    ports = [r.port for r in fleet.replicas]
    img = image(fleet.directory)
    vms = []
    for k in range(count):
        d = fleet.directory / f"vm-{k}"
        d.mkdir(parents=True, exist_ok=True)
        token, ca = r0.token()
        toml = d / "edged.toml"
        addresses = ", ".join(f'"{lab.GUEST_HUB_HOST}:{p}"' for p in ports)
        toml.write_text(lab.DEVICE_TOML + f"\n[hub]\naddresses = [{addresses}]\n")
        seed = d / "seed.img"
        cmd = [str(lab.SEED), "--out", str(seed), "--hub", f"{lab.GUEST_HUB_HOST}:{ports[0]}",
               "--ca-hash", ca, "--root-hash", r0.root_pin, "--edged-toml", str(toml),
               "--label", f"site={VM_SITE}"]  # fmt: skip
        made = subprocess.run(
            cmd, capture_output=True, text=True, check=False, timeout=60,
            env={**os.environ, "EDGEFLEET_SEED_TOKEN": token},
        )  # fmt: skip
        if made.returncode != 0:
            raise AssertionError(f"packaging/image/seed: {made.stdout}{made.stderr}")
        vms.append(SoakVm(img, d / "vm", ports, seed).start())
    deadline = time.monotonic() + BOOT_WITHIN
    for k, vm in enumerate(vms):
        while not ((vm.status() or {}).get("hub") or {}).get("connected"):
            if vm.pid() is None:
                raise AssertionError(f"vm-{k}: QEMU exited; console: {vm.vm.console_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"vm-{k}: edged not connected to the region within {BOOT_WITHIN:g}s; "
                    f"console: {vm.vm.console_tail()}"
                )
            time.sleep(2)
    return vms


def check_vm(vm: SoakVm) -> str:
    """After the final power cut (``vm.cut()``): boot with edged masked and check, read-only,
    what the cut left: ``edged check`` (config, state, runtime) and every artifact's bytes
    against its name. Raises AssertionError with the reason when either fails."""
    vm.extra_cmdline = "systemd.mask=edged.service"
    vm.start()
    vm.vm.wait_agent(BOOT_WITHIN)
    checked = vm.vm.run(
        "/opt/edgefleet/bin/edged check --config /etc/edged/edged.toml "
        "--data-dir /var/lib/edged 2>&1",
        timeout=600,
    )
    listing = vm.vm.run(
        "cd /var/lib/edged/artifacts/sha256 2>/dev/null && find . -maxdepth 1 -type f "
        "! -name '.*' -exec sha256sum {} + || true",
        timeout=600,
    )
    bad, count = [], 0
    for line in listing.splitlines():
        digest, _, name = line.strip().partition("  ")
        if not name:
            continue
        count += 1
        if digest != Path(name).name:
            bad.append(Path(name).name[:16])
    if bad:
        raise AssertionError(f"{len(bad)} of {count} blobs do not hash to their names: {bad}")
    last = checked.strip().splitlines()[-1:] or ["ok"]
    return f"edged check: {last[0][:120]}; {count} artifact blobs hash to their names"
