"""The VM lab's parts: the device image (packaging/image/build, cached), a real hub process on
the host's loopback, seed disks (packaging/image/seed) and QEMU virtual machines booted from
the image under TCG.

Networking stays on this machine: each VM has QEMU user networking with ``restrict=on``, so
the guest reaches nothing but what a ``guestfwd`` names: 10.0.2.100:PORT, which opens one
``socat`` to 127.0.0.1:PORT per guest connection (the hub's mTLS and enrollment ports). The host
reaches the guest through ``hostfwd`` on 127.0.0.1 only: the test agent (port 7999, test images
only) and inference (guest port 18080, forwarded by the agent to edged's 127.0.0.1:8080).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgefleet.launching import LaunchedHub, LaunchError, free_port_pair, program_command, start_hub

REPO = Path(__file__).parents[2]
BUILD = REPO / "packaging" / "image" / "build"
SEED = REPO / "packaging" / "image" / "seed"
GUEST_HUB_HOST = "10.0.2.100"  # the hub, as the guest sees it (guestfwd)
AGENT_PORT = 7999  # the test agent in the guest (packaging/image/lab)
INFER_GUEST_PORT = 18080  # the agent's forward to edged's inference.listenTcp
TOOLS = ("qemu-system-x86_64", "qemu-img", "socat", "mke2fs", "debootstrap", "dpkg-buildpackage")

LABELS = {"site": "lab", "device.lab/role": "first"}  # the lab device's seed labels
DEVICE_TOML = """\
[inference]
listenTcp = "127.0.0.1:8080"

[discovery]
healthPeriod = "5s"
"""


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def wait_for(cond: Callable[[], Any], timeout: float, what: str, period: float = 1.0) -> Any:
    """Poll ``cond`` until it returns something true; AssertionError naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(period)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_image(out: Path, lock_dir: Path) -> Path:
    """The lab's image (the production image plus the test agent) in ``out``, built once per
    session across pytest-xdist workers (a file lock) and cached across runs by the build."""
    with open(lock_dir / "vmlab-image.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (out / "README").exists():
            return out
        made = subprocess.run(
            [str(BUILD), "--test-agent", "--out", str(out)],
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
        )
        if made.returncode != 0:
            raise AssertionError(f"packaging/image/build failed:\n{made.stdout}\n{made.stderr}")
        return out


class LabHub:
    """``hub init`` (its certificate names 10.0.2.100) and ``hub serve`` on 127.0.0.1:PORT and
    PORT+1 (enrollment); the guests dial 10.0.2.100:PORT through guestfwd."""

    def __init__(self, data: Path, log: Path) -> None:
        self.data = data
        self.log = log
        self.port = free_port_pair()
        self.launched: LaunchedHub | None = None

    @property
    def guest_address(self) -> str:
        return f"{GUEST_HUB_HOST}:{self.port}"

    def init(self) -> LabHub:
        out = subprocess.run(
            program_command("hub", "init", "--data-dir", self.data,
                            "--hub-address", self.guest_address, "--san", GUEST_HUB_HOST),
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        # edgectl on the host dials the loopback address (also in the certificate)
        config = self.data / "admin.toml"
        text = re.sub(
            r'^hub = ".*"$', f'hub = "127.0.0.1:{self.port}"', config.read_text(), flags=re.M
        )
        config.write_text(text)
        return self

    def start(self) -> LabHub:
        self.launched = start_hub(self.data, listen=f"127.0.0.1:{self.port}", log=self.log)
        try:
            self.launched.wait_listening(60)
        except LaunchError as exc:
            raise AssertionError(str(exc)) from None
        return self

    def stop(self) -> None:
        if self.launched is not None:
            self.launched.stop(20)

    def token(self) -> tuple[str, str, str]:
        """A new bootstrap token, the CA pin and the trust root pin (``hub token create``)."""
        out = subprocess.run(
            program_command("hub", "token", "create", "--data-dir", self.data),
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        ca = out.stderr.split("CA hash ")[1].strip()
        root = out.stderr.split("root hash ")[1].split(";")[0].strip()
        return out.stdout.strip(), ca, root

    def edgectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            program_command("edgectl", "--config", self.data / "admin.toml", *args),
            check=False, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if check and out.returncode != 0:
            raise AssertionError(f"edgectl {' '.join(args)}: {out.stdout}{out.stderr}")
        return out

    def get_json(self, *args: str) -> Any:
        return json.loads(self.edgectl("get", *args, "-o", "json").stdout)

    def devices(self) -> list[dict[str, Any]]:
        doc = self.get_json("devices")
        items: list[dict[str, Any]] = doc.get("items", doc) if isinstance(doc, dict) else doc
        return items


def make_seed(
    out: Path, hub: LabHub, *, labels: dict[str, str], edged_toml: str = DEVICE_TOML
) -> str:
    """A seed disk from a fresh ``hub token create``; returns the token (to look for leaks)."""
    token, ca, root = hub.token()
    toml = out.with_suffix(".toml")
    toml.write_text(edged_toml)
    cmd = [str(SEED), "--out", str(out), "--hub", hub.guest_address, "--ca-hash", ca]
    cmd += ["--root-hash", root, "--edged-toml", str(toml)]
    for k, v in labels.items():
        cmd += ["--label", f"{k}={v}"]
    made = subprocess.run(
        cmd, capture_output=True, text=True, check=False, timeout=60,
        env={**os.environ, "EDGEFLEET_SEED_TOKEN": token},
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    return token


class Vm:
    """One QEMU guest booted from the image (a qcow2 overlay of its own over the image's disk),
    the seed as its second disk. ``run`` executes a command in the guest through the agent."""

    def __init__(self, image: Path, workdir: Path, hub: LabHub, seed: Path | None) -> None:
        self.image = image
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.hub = hub
        self.seed = seed
        self.disk = self.dir / "disk.qcow2"
        self.console = self.dir / "console.log"
        self.agent_port = free_port()
        self.infer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(image / "disk.qcow2"),
             "-F", "qcow2", str(self.disk)],
            check=True, capture_output=True,
        )  # fmt: skip

    def command(self) -> list[str]:
        fwd = [
            f"guestfwd=tcp:{GUEST_HUB_HOST}:{p}-cmd:socat STDIO TCP:127.0.0.1:{p}"
            for p in (self.hub.port, self.hub.port + 1)
        ]
        fwd += [
            f"hostfwd=tcp:127.0.0.1:{self.agent_port}-:{AGENT_PORT}",
            f"hostfwd=tcp:127.0.0.1:{self.infer_port}-:{INFER_GUEST_PORT}",
        ]
        cmdline = (self.image / "cmdline").read_text().strip() + " console=ttyS0"
        cmd = ["qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", "1024", "-smp", "2"]
        cmd += ["-nodefaults", "-no-user-config", "-display", "none"]
        cmd += ["-kernel", str(self.image / "vmlinuz"), "-initrd", str(self.image / "initrd.img")]
        cmd += ["-append", cmdline, "-serial", f"file:{self.console}"]
        cmd += ["-drive", f"file={self.disk},if=virtio,format=qcow2"]
        if self.seed is not None:
            cmd += ["-drive", f"file={self.seed},if=virtio,format=raw,readonly=on"]
        cmd += ["-netdev", ",".join(["user,id=n0,restrict=on", *fwd])]
        cmd += ["-device", "virtio-net-pci,netdev=n0", "-device", "virtio-rng-pci"]
        return cmd

    def start(self) -> Vm:
        # the serial log of every boot is kept: console.log is appended to by QEMU per start
        if self.console.exists():
            self.console.rename(self.dir / f"console-{time.time_ns()}.log")
        self.started_at = time.monotonic()
        with open(self.dir / "qemu.err", "ab") as err:  # QEMU keeps its own copy of the fd
            self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=err)
        return self

    def kill(self) -> None:
        """Power cut: QEMU killed, nothing flushed by the guest."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def stop(self) -> None:
        """A clean power-off if the guest answers, else a cut."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            return
        try:
            self.run("systemd-run --on-active=1 systemctl poweroff", timeout=10)
            self.proc.wait(120)
        except (AssertionError, OSError, subprocess.TimeoutExpired):
            self.kill()
        self.proc = None

    def alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"QEMU exited; console: {self.console_tail()}")

    def console_tail(self, chars: int = 3000) -> str:
        try:
            return self.console.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return "(no console log)"

    def _post(self, path: str, doc: dict[str, Any], timeout: float) -> dict[str, Any]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.agent_port}{path}",
            data=json.dumps(doc).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout + 15) as resp:
            result: dict[str, Any] = json.loads(resp.read())
            return result

    def try_run(self, cmd: str, timeout: float = 60) -> tuple[int, str] | None:
        """(exit status, output) of ``bash -c cmd`` in the guest; None if the agent is not
        reachable (booting, or QEMU gone)."""
        try:
            doc = self._post("/run", {"cmd": cmd, "timeout": int(timeout)}, timeout)
        except (OSError, urllib.error.URLError, json.JSONDecodeError):
            return None
        return int(doc["rc"]), str(doc["out"])

    def run(self, cmd: str, timeout: float = 60, check: bool = True) -> str:
        got = self.try_run(cmd, timeout)
        if got is None:
            raise AssertionError(f"the guest agent did not answer: {cmd}")
        rc, out = got
        if check and rc != 0:
            raise AssertionError(f"in the guest, {cmd!r} exited {rc}: {out}")
        return out

    def wait_agent(self, timeout: float = 300) -> str:
        """Wait until the guest's agent answers; returns the boot id."""

        def answered() -> str | None:
            self.alive()
            got = self.try_run("cat /proc/sys/kernel/random/boot_id", 10)
            return got[1].strip() if got and got[0] == 0 else None

        try:
            boot: str = wait_for(answered, timeout, "the guest's agent", period=2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nconsole:\n{self.console_tail()}") from None
        return boot

    def reboot(self, timeout: float = 300) -> str:
        """A clean reboot (systemctl reboot); returns the new boot id."""
        before = self.run("cat /proc/sys/kernel/random/boot_id").strip()
        self.run("systemd-run --on-active=1 systemctl reboot")
        wait_for(
            lambda: (
                (self.try_run("cat /proc/sys/kernel/random/boot_id", 5) or (1, before))[1].strip()
                not in ("", before)
            ),
            timeout,
            "the guest to reboot",
            period=2,
        )
        return self.wait_agent(timeout)

    def status(self, timeout: float = 30) -> dict[str, Any]:
        """What ``edged status -o json`` prints in the guest: edged's ``/v1/status`` on its
        status socket (/run/edged), fetched by the agent (a look costs 0.05 s instead of the
        2-4 s of a Python start under TCG, and the lab looks often, at three guests at once);
        {} while edged does not answer. test_device runs ``edged status`` itself."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.agent_port}/edged-status", timeout=timeout
            ) as resp:
                doc = json.loads(resp.read())
        except (OSError, urllib.error.URLError, json.JSONDecodeError):
            return {}  # the agent or edged not answering (booting, restarting, QEMU gone)
        return dict(doc) if isinstance(doc, dict) else {}

    def infer(self, model: str, doc: dict[str, Any], timeout: float = 30) -> tuple[int, Any]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.infer_port}/v2/models/{model}/infer",
            data=json.dumps(doc).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")


DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {name}}}
spec:
  model: {{name: {model}, version: "{version}"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  placement: {{nodeSelector: {{site: lab}}}}
  probes:
    readiness: {{periodSeconds: 2, timeoutSeconds: 5}}
"""


def deploy(
    hub: LabHub, folder: Path, name: str, version: str, extra: str = "", model: str = ""
) -> None:
    """``edgectl apply`` a ModelDeployment ``name`` of ``model`` (default: ``name``) at
    ``version`` for the lab's devices; ``extra``: more lines under ``spec`` (indented)."""
    doc = folder / f"{name}-{version}.yaml"
    doc.write_text(DEPLOYMENT.format(name=name, model=model or name, version=version) + extra)
    hub.edgectl("apply", "-f", str(doc))


def push(hub: LabHub, path: Path, name: str, version: str) -> None:
    out = hub.edgectl("models", "push", str(path), "--name", name, "--version", version)
    assert "pushed" in out.stdout or "unchanged" in out.stdout, out.stdout


def enrolled(hub: LabHub) -> list[dict[str, Any]]:
    """The hub's devices labelled site=lab."""
    return [d for d in hub.devices() if d["metadata"].get("labels", {}).get("site") == "lab"]


def infer_request(x: Any) -> dict[str, Any]:
    """An Open Inference Protocol request for the demo MLP's ``input`` (a numpy array)."""
    return {
        "inputs": [
            {
                "name": "input",
                "datatype": "FP32",
                "shape": list(x.shape),
                "data": x.ravel().tolist(),
            }
        ]
    }


def main_pid(vm: Vm) -> int:
    return int(vm.run("systemctl show -p MainPID --value edged").strip() or 0)


def wait_active(vm: Vm, unit: str, timeout: float) -> None:
    """Wait until ``unit`` is active in the guest; fail at once, with its journal, if systemd
    gave up on it (``failed``)."""

    def active() -> bool:
        state = vm.run(f"systemctl is-active {unit}", check=False).strip()
        if state == "failed":
            journal = vm.run(f"journalctl -b -u {unit} --no-pager -o cat | tail -30", check=False)
            raise AssertionError(f"{unit} failed in the guest:\n{journal}")
        return state == "active"

    wait_for(active, timeout, f"{unit} to be active", period=2)
