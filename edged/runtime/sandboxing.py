"""The worker sandbox: what a worker may touch, put in force by the worker on itself.

The worker calls :func:`apply_sandbox` after its resource limits and before it reads its
model, while it is still one thread (Landlock restricts the calling thread and what it starts
afterwards). With ``mode = "landlock"``:

* **filesystem**: every right Landlock knows is handled, so everything is denied but reading
  the worker's own artifact (that one file, not the store) and the runtime: the Python
  installation (``sysconfig`` paths and ``sys.path``, never the working directory), the system
  libraries, ``/etc/ld.so.cache``, the CPU description in ``/proc`` and ``/sys`` that ONNX
  Runtime reads, ``/dev/null`` and ``/dev/urandom``; plus read-write on accelerator nodes
  (``device_paths``). No write, create, remove or execute anywhere.
* **network** (Landlock ABI 4+): TCP ``connect`` only to ``connect_ports`` and ``bind`` only
  on ``bind_ports``; none by default. Landlock rules name *ports*, not addresses: a port
  allowed is allowed on every address. UDP and Unix sockets are not TCP: see ``seccomp``.
* **egress by address** (``egress_rules``: a rule names ``cidr``): first of all, the worker
  joins the cgroup edged made for it, whose BPF programs allow ``connect()`` only to what a
  rule allows (``egressfilter.py``); the ports are still Landlock's too.
* **scopes** (ABI 6+): no signals to, and no abstract Unix sockets of, processes outside the
  sandbox (edged, other workers).
* **no_new_privs**: set before anything else; exec can never grant privileges again.
* **seccomp** (``seccomp.py``, when asked): refuses new sockets other than Unix and TCP, and
  the system calls a worker never needs (ptrace, mount, bpf, kexec, ...).
* **a uid of its own** (``separate_uid``: edged runs as root): the Landlock rules are made
  while the worker is still root (it can open every path they name), then it switches to the
  uid the pool took for it (``privileges.py``: setgroups, setresgid, setresuid, and a check
  that there is no way back), then no_new_privs, Landlock and seccomp are put in force. It
  happens whatever ``mode`` is (``[workers] separateUids`` turns it off).

What is in force is returned as :class:`Protections` (the worker sends it in READY; edged shows
it per replica). A protection that cannot be had (no Landlock: an old kernel or ``lsm=``
without it) is reported, not fatal, unless ``required``; a network policy the kernel cannot
enforce (ABI < 4) always fails the start (:class:`SandboxUnavailable`): never silently weaker.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edged.runtime import egressfilter, landlock
from edged.runtime import seccomp as seccomp_filter
from edged.runtime.launching import SandboxSpec
from edged.runtime.privileges import DropFailed, StillPrivileged, drop_to

SYSTEM_LIBRARIES = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")
"""System library directories (shared objects ONNX Runtime and numpy load)."""
SYSTEM_FILES = (
    "/etc/ld.so.cache",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/self",
    "/sys/devices/system/cpu",
    "/sys/devices/system/node",
    "/sys/fs/cgroup",
    "/sys/bus",
    "/sys/class",
    "/sys/devices",
    "/dev/urandom",
)
"""Read-only: the loader cache, the CPU, memory and device description that ONNX Runtime and
numpy read (ONNX Runtime walks PCI devices to discover GPUs). Its telemetry store under
``~/.cache`` is not allowed: it warns once in the worker's log and carries on."""
READ_WRITE_FILES = ("/dev/null",)


class SandboxUnavailable(Exception):
    """A protection that must be in force cannot be: the worker does not start."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class Protections:
    """What is in force in a worker (``to_json`` is what status shows per replica)."""

    mode: str  # "landlock" or "off"
    landlock_abi: int = 0  # the kernel's ABI (0: no Landlock)
    filesystem: bool = False
    network: bool = False  # TCP connect/bind limited to the policy's ports
    scoped: bool = False  # signals and abstract Unix sockets stay inside
    no_new_privs: bool = False
    seccomp: bool = False
    connect_ports: tuple[int, ...] = ()
    bind_ports: tuple[int, ...] = ()
    # egress by address too (cgroup BPF, egressfilter.py): "127.0.0.1/32:8080", "*:443"
    connect_to: tuple[str, ...] = ()
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    groups: tuple[int, ...] = ()  # supplementary groups with a uid of its own
    separate_uid: bool = False  # a uid of its own, not edged's
    uid_note: str = ""  # why not (when it was not wanted)
    problems: tuple[str, ...] = ()  # what was wanted and is not in force

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "landlockAbi": self.landlock_abi,
            "filesystem": self.filesystem,
            "network": self.network,
            "scoped": self.scoped,
            "noNewPrivs": self.no_new_privs,
            "seccomp": self.seccomp,
            "connectPorts": list(self.connect_ports),
            "bindPorts": list(self.bind_ports),
            **({"connectTo": list(self.connect_to)} if self.connect_to else {}),
            "uid": self.uid,
            "gid": self.gid,
            **({"groups": list(self.groups)} if self.groups else {}),
            "separateUid": self.separate_uid,
            **({"uidNote": self.uid_note} if self.uid_note else {}),
            "problems": list(self.problems),
        }


def runtime_read_paths(
    *, path: Iterable[str], cwd: str, prefixes: Iterable[str], package_root: str
) -> list[str]:
    """Pure: the Python installation a worker must read, given ``sys.path``, the working
    directory (``python -m`` puts it first on ``sys.path``: never allowed for that), the
    installation's ``sysconfig`` paths and the directory that holds the ``edged`` package
    (allowed even when it is the working directory: a checkout run from its root)."""
    out: list[str] = []
    for entry in (*prefixes, package_root, *path):
        if not entry or not os.path.isabs(entry):
            continue
        normal = os.path.normpath(entry)
        if normal == "/" or normal in out:
            continue
        if normal == cwd and entry not in (*prefixes, package_root):
            continue
        out.append(normal)
    return out


def _python_paths() -> list[str]:
    names = ("stdlib", "platstdlib", "purelib", "platlib")
    prefixes: list[str] = []
    for vars_ in (None, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
        paths = sysconfig.get_paths(vars=vars_) if vars_ else sysconfig.get_paths()
        prefixes += [paths[n] for n in names if n in paths]
    prefixes.append(os.path.join(sys.base_exec_prefix, "lib"))  # libpython, lib-dynload
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return runtime_read_paths(
        path=sys.path, cwd=os.getcwd(), prefixes=prefixes, package_root=package_root
    )


class _UidSwitch:
    """The switch to the worker's own uid, made once, at the point :func:`apply_sandbox`
    chooses (after the Landlock rules are made, before they are enforced)."""

    def __init__(
        self, spec: SandboxSpec, uid: int, why_none: str, groups: tuple[int, ...] = ()
    ) -> None:
        self.spec, self.uid, self.why_none, self.groups = spec, uid, why_none, groups
        self.done = False
        self.separate = False
        self.problems: list[str] = []

    def __call__(self) -> None:
        if self.done or not self.spec.separate_uid:
            self.done = True
            return
        self.done = True
        if self.uid < 0:
            self._missing(f"no uid of its own: {self.why_none or 'none was given'}")
            return
        try:
            drop_to(self.uid, self.uid, self.groups)
        except StillPrivileged as exc:
            raise SandboxUnavailable("SandboxUnavailable", f"uid {self.uid}: {exc}") from None
        except DropFailed as exc:
            self._missing(f"cannot switch to uid {self.uid}: {exc}")
            return
        self.separate = True

    def _missing(self, message: str) -> None:
        if self.spec.required:
            raise SandboxUnavailable("SandboxUnavailable", f"{message}; the baseline requires it")
        self.problems.append(message)

    def note(self) -> str:
        return "" if self.separate else self.spec.uid_note


def apply_sandbox(
    spec: SandboxSpec,
    artifact_path: str,
    extra_files: tuple[str, ...] = (),
    *,
    uid: int = -1,
    uid_problem: str = "",
    groups: tuple[int, ...] = (),
) -> Protections:
    """Confine the calling process as ``spec`` says (see the module's docstring); what is in
    force. ``extra_files``: other blobs of the artifact the worker reads after confining
    itself (its validation set), read-only like the model. ``uid``: the uid of its own the
    worker switches to when ``spec.separate_uid`` (-1: none could be had, ``uid_problem``
    says why), with supplementary ``groups`` only (the accelerator nodes').
    :class:`SandboxUnavailable` when something that must be in force cannot be."""
    if spec.refused:
        raise SandboxUnavailable("NetworkPolicyDenied", spec.refused)
    connect_to = _join_egress_filter(spec)
    switch = _UidSwitch(spec, uid, uid_problem, groups)
    if spec.mode == "off":
        switch()
        return _protections(Protections(mode="off", connect_to=connect_to), switch)
    threads = _thread_count()
    if threads != 1:  # Landlock and seccomp would leave the other threads unconfined
        message = f"the worker has {threads} threads when it would confine itself (needs one)"
        if spec.required or spec.network:
            raise SandboxUnavailable("SandboxUnavailable", message)
        switch()
        return _protections(
            Protections(mode=spec.mode, problems=(f"{message}: not confined",)), switch
        )
    abi = landlock.abi_version()
    problems: list[str] = []
    wants_network = spec.network or spec.required
    if abi < 1:
        message = "this kernel has no Landlock (Linux 5.13+ with landlock in lsm=)"
        if spec.network:
            raise SandboxUnavailable(
                "NetworkPolicyUnenforceable", f"{message}: the network policy cannot be enforced"
            )
        if spec.required:
            raise SandboxUnavailable("SandboxUnavailable", f"{message}; the baseline requires it")
        problems.append(message)
    elif abi < 4 and wants_network:
        message = f"Landlock ABI {abi} has no TCP rules (ABI 4, Linux 6.7, has them)"
        raise SandboxUnavailable(
            "NetworkPolicyUnenforceable" if spec.network else "SandboxUnavailable",
            f"{message}: the network policy cannot be enforced"
            if spec.network
            else f"{message}; the baseline requires a sandbox with no network",
        )
    elif abi < 4:
        problems.append(f"Landlock ABI {abi} has no TCP rules: the network is not restricted")
    nnp = False
    try:
        landlock.set_no_new_privs()
        nnp = True
    except OSError as exc:
        if spec.required:
            raise SandboxUnavailable("SandboxUnavailable", f"no_new_privs: {exc}") from None
        problems.append(f"no_new_privs: {exc}")
    enforced: landlock.Enforced | None = None
    if abi >= 1:
        try:
            enforced = _restrict(abi, spec, artifact_path, extra_files, switch)
        except OSError as exc:
            if spec.required or spec.network:
                raise SandboxUnavailable(
                    "SandboxUnavailable", f"Landlock refused the ruleset: {exc}"
                ) from None
            problems.append(f"Landlock refused the ruleset: {exc}")
    switch()  # no Landlock (or its ruleset refused): the switch still comes before seccomp
    seccomp = False
    if spec.seccomp:
        try:
            seccomp_filter.install()
            seccomp = True
        except (OSError, seccomp_filter.SeccompUnsupported) as exc:
            if spec.required:
                raise SandboxUnavailable("SandboxUnavailable", f"seccomp: {exc}") from None
            problems.append(f"seccomp: {exc}")
    network = enforced is not None and enforced.net_rights != 0
    return _protections(
        Protections(
            mode=spec.mode,
            landlock_abi=abi,
            filesystem=enforced is not None,
            network=network,
            scoped=enforced is not None and enforced.scopes != 0,
            no_new_privs=nnp and landlock.no_new_privs(),
            seccomp=seccomp,
            connect_ports=spec.connect_ports if network else (),
            bind_ports=spec.bind_ports if network else (),
            connect_to=connect_to,
            problems=tuple(problems),
        ),
        switch,
    )


def _join_egress_filter(spec: SandboxSpec) -> tuple[str, ...]:
    """Join the cgroup whose BPF programs enforce the egress rules that name addresses
    (egressfilter.py; while the worker may still write to it); what they allow, for status.
    A policy that cannot be enforced stops the start, whatever ``required`` says."""
    if not spec.egress_rules:
        return ()
    problem = spec.egress_problem or ("" if spec.egress_cgroup else "edged made no cgroup")
    if not problem:
        try:
            egressfilter.join(spec.egress_cgroup)
        except OSError as exc:
            problem = f"cannot join the cgroup {spec.egress_cgroup}: {exc.strerror or exc}"
    if problem:
        raise SandboxUnavailable(
            "NetworkPolicyUnenforceable",
            f"egress rules that name addresses cannot be enforced here ({problem}); they need "
            "edged as root and a cgroup v2 hierarchy (a cgroup BPF connect program)",
        )
    return egressfilter.describe(spec.egress_rules)


def _protections(found: Protections, switch: _UidSwitch) -> Protections:
    """``found`` with the uid the process has now and what the switch did."""
    return replace(
        found,
        uid=os.getuid(),
        gid=os.getgid(),
        groups=tuple(sorted(set(os.getgroups()) - {os.getgid()})) if switch.separate else (),
        separate_uid=switch.separate,
        uid_note=switch.note(),
        problems=found.problems + tuple(switch.problems),
    )


def _thread_count() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 1


def _restrict(
    abi: int,
    spec: SandboxSpec,
    artifact_path: str,
    extra_files: tuple[str, ...] = (),
    before_enforcing: Callable[[], None] | None = None,
) -> landlock.Enforced:
    """Make the ruleset (``before_enforcing`` runs once it is made: the uid switch, so that
    the rules could name paths only root may open), then enforce it."""
    with landlock.Ruleset(abi) as rules:
        if not rules.allow_path(artifact_path, landlock.FS_READ_FILE):
            raise FileNotFoundError(f"the artifact {artifact_path} is not there")
        for path in extra_files:  # a missing one: the worker's own read of it says so
            rules.allow_path(path, landlock.FS_READ_FILE)
        for path in spec.read_dirs:  # its own workload's secrets, nobody else's
            rules.allow_path(path, landlock.FS_READ)
        for path in (*_python_paths(), *SYSTEM_LIBRARIES, *SYSTEM_FILES):
            rules.allow_path(path, landlock.FS_READ)
        rw = landlock.FS_READ | landlock.FS_WRITE_FILE
        for path in READ_WRITE_FILES:
            rules.allow_path(path, rw)
        for path in spec.device_paths:
            rules.allow_path(path, rw | landlock.FS_IOCTL_DEV)
        if rules.handled_net:
            for port in spec.connect_ports:
                rules.allow_port(port, landlock.NET_CONNECT_TCP)
            for port in spec.bind_ports:
                rules.allow_port(port, landlock.NET_BIND_TCP)
        if before_enforcing is not None:
            before_enforcing()
        return rules.restrict_self()


ACCELERATOR_NODES = (
    "/dev/nvidia*", "/dev/nvhost-*", "/dev/nvmap", "/dev/dri", "/dev/accel", "/dev/kfd",
    "/dev/apex_*", "/dev/hailo*", "/dev/rknpu",
)  # fmt: skip
"""Device nodes a worker running an accelerator's execution provider may open read-write."""


def accelerator_nodes() -> tuple[str, ...]:
    """The accelerator nodes present on this device (for ``SandboxSpec.device_paths``)."""
    import glob

    return tuple(sorted({p for pattern in ACCELERATOR_NODES for p in glob.glob(pattern)}))
