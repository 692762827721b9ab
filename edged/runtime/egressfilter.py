"""Egress rules that name addresses, enforced by the kernel: a cgroup BPF program.

Landlock's TCP rules name ports only, so a rule such as ``{port: 8080, cidr: 127.0.0.1}``
(``edgefleet/api/networking.py``) needs a second mechanism. edged (as root: loading and
attaching needs CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN) makes one cgroup v2 per worker,
attaches two ``BPF_PROG_TYPE_CGROUP_SOCK_ADDR`` programs to it (``connect4`` and ``connect6``)
and the worker joins that cgroup first thing, before it reads its model. From then on every
``connect()`` of an IPv4 or IPv6 socket of the worker runs the program, which allows it only
when some rule allows its port and address (a rule without ``cidr``: any address); otherwise
``connect()`` fails with EPERM. IPv4 rules also cover their IPv4-mapped IPv6 addresses
(``::ffff:a.b.c.d``), so a v6 socket is no way around a v4 rule. Landlock still limits the
ports (the two must both allow), seccomp keeps the worker to TCP and Unix sockets (no UDP,
which these hooks would not see), and the worker cannot leave its cgroup (Landlock denies it
every write outside a few device files; with a uid of its own, the cgroup files are root's).

The programs are built here (:func:`build_program`, pure: a few compares per rule, no maps,
no helpers) and loaded with the ``bpf()`` system call through ctypes: no compiler, no
libbpf. They stay attached until the cgroup is removed when the worker has exited.

Where the cgroup is: the replica's resource-limit cgroup when edged uses cgroup v2 for limits
(``limiting.py``), else ``<edged's cgroup v2>/edgefleet-egress/<edged pid>-<replica>`` (on a
hybrid hierarchy, in the unified one: ``/sys/fs/cgroup/unified``). When edged sits in the
``supervisor`` leaf of its delegated cgroup (``delegating.py``), that is
``<delegated>/workloads/edgefleet-egress/...`` instead: workers stay below the workloads
subtree, never below edged's own leaf. Leaves of edged processes no longer running are removed
when the next one is made.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

from edged.runtime.delegating import SUPERVISOR, WORKLOADS

# bpf(2) commands, program and attach types, flags (linux/bpf.h)
_BPF_PROG_LOAD = 5
_BPF_PROG_ATTACH = 8
_PROG_TYPE_CGROUP_SOCK_ADDR = 18
ATTACH_INET4_CONNECT = 10
ATTACH_INET6_CONNECT = 11
_F_ALLOW_MULTI = 2
_ATTR_SIZE = 144
_SYS_BPF = {"x86_64": 321, "aarch64": 280}

# struct bpf_sock_addr offsets
_USER_IP4 = 4
_USER_IP6 = 8
_USER_PORT = 24

# eBPF opcodes used
_LDX_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W
_MOV32_X = 0xBC  # BPF_ALU | BPF_MOV | BPF_X
_AND32_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
_JNE32_K = 0x56  # BPF_JMP32 | BPF_JNE | BPF_K
_MOV64_K = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K
_EXIT = 0x95

MAX_RULES = 64  # networking.MAX_EGRESS_RULES: the program stays a few hundred instructions
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")

Rule = tuple[int, str]  # (port, cidr or "": any address)


class EgressFilterError(Exception):
    """The rules cannot be enforced here; the message says why."""


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    if imm >= 1 << 31:
        imm -= 1 << 32
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def _le32(data: bytes) -> int:
    """A 4-byte word as the program's 32-bit load sees it (network bytes, little-endian CPU)."""
    return int.from_bytes(data, "little")


def _port_word(port: int) -> int:
    return _le32(port.to_bytes(2, "big") + b"\0\0")


def _words(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> list[tuple[int, int]]:
    """(mask, value) of each 32-bit word of the address, as loaded."""
    addr = net.network_address.packed
    mask = net.netmask.packed
    return [(_le32(mask[i : i + 4]), _le32(addr[i : i + 4])) for i in range(0, len(addr), 4)]


def _networks(cidr: str, family: int) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The networks of ``cidr`` as the ``family`` hook sees them (4 or 6); [] if none."""
    net = ipaddress.ip_network(cidr)
    if family == 4:
        return [net] if net.version == 4 else []
    if net.version == 6:
        return [net]
    mapped = int(_MAPPED.network_address) | int(net.network_address)
    return [ipaddress.IPv6Network((mapped, 96 + net.prefixlen))]


def build_program(rules: Sequence[Rule], family: int) -> bytes:
    """Pure: the ``connect4`` (``family`` 4) or ``connect6`` (6) program: return 1 (allow)
    when a rule allows the port and address, else 0 (EPERM)."""
    if len(rules) > MAX_RULES:
        raise EgressFilterError(f"at most {MAX_RULES} egress rules, got {len(rules)}")
    # registers: r1 ctx; v4: r2 address; v6: r2..r5 its words; r6 port; r7 scratch
    words = 1 if family == 4 else 4
    out = [_insn(_LDX_W, 2 + i, 1, (_USER_IP4 if family == 4 else _USER_IP6) + 4 * i)
           for i in range(words)]  # fmt: skip
    out.append(_insn(_LDX_W, 6, 1, _USER_PORT))
    for port, cidr in rules:
        nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network | None]
        nets = [None] if not cidr else list(_networks(cidr, family))
        for net in nets:
            checks: list[bytes] = []
            for i, (mask, value) in enumerate(_words(net) if net is not None else []):
                if mask == 0:
                    continue
                checks += [
                    _insn(_MOV32_X, 7, 2 + i),
                    _insn(_AND32_K, 7, imm=mask),
                    _insn(_JNE32_K, 7, imm=value & mask),  # offset set below
                ]
            allow = [_insn(_MOV64_K, 0, imm=1), _insn(_EXIT)]
            block_len = 1 + len(checks) + len(allow)
            block = [_insn(_JNE32_K, 6, off=block_len - 1, imm=_port_word(port))]
            for j in range(2, len(checks), 3):  # each jne: to the end of this block
                pos = 1 + j  # its index in the block
                checks[j] = _insn(_JNE32_K, 7, off=block_len - 1 - pos, imm=_imm_of(checks[j]))
            out += block + checks + allow
    out += [_insn(_MOV64_K, 0, imm=0), _insn(_EXIT)]
    return b"".join(out)


def _imm_of(insn: bytes) -> int:
    return int(struct.unpack("<BBhi", insn)[3])


# -- the kernel -------------------------------------------------------------------------------
def _bpf(cmd: int, attr: bytes) -> int:
    nr = _SYS_BPF.get(os.uname().machine)
    if nr is None:
        raise EgressFilterError(f"bpf() is not known on {os.uname().machine}")
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(attr.ljust(_ATTR_SIZE, b"\0"), _ATTR_SIZE)
    ret = libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), buf, ctypes.c_uint(_ATTR_SIZE))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def load_program(insns: bytes, attach_type: int) -> int:
    """Load a cgroup sock_addr program; its file descriptor. The verifier's log is asked for
    only when the load fails (to say why)."""
    code = ctypes.create_string_buffer(insns, len(insns))
    license_ = ctypes.create_string_buffer(b"GPL")

    def attr(log: ctypes.Array[ctypes.c_char] | None) -> bytes:
        return struct.pack(
            "<IIQQIIQII16sII",
            _PROG_TYPE_CGROUP_SOCK_ADDR,
            len(insns) // 8,
            ctypes.addressof(code),
            ctypes.addressof(license_),
            0 if log is None else 1,
            0 if log is None else len(log),
            0 if log is None else ctypes.addressof(log),
            0,
            0,
            b"edgefleet_egr",
            0,
            attach_type,
        )

    try:
        return _bpf(_BPF_PROG_LOAD, attr(None))
    except OSError as exc:
        log = ctypes.create_string_buffer(1 << 20)
        try:
            os.close(_bpf(_BPF_PROG_LOAD, attr(log)))
        except OSError:
            pass
        detail = log.value.decode(errors="replace").strip().splitlines()
        raise EgressFilterError(
            f"the kernel refused the egress program: {exc.strerror}"
            + (f" ({detail[-1]})" if detail else "")
        ) from None


def attach(cgroup: Path, prog_fd: int, attach_type: int) -> None:
    fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _bpf(_BPF_PROG_ATTACH, struct.pack("<IIIII", fd, prog_fd, attach_type, _F_ALLOW_MULTI, 0))
    finally:
        os.close(fd)


def enforce(cgroup: Path, rules: Sequence[Rule]) -> None:
    """Attach both programs for ``rules`` to ``cgroup`` (:class:`EgressFilterError` if the
    kernel will not)."""
    for family, attach_type in ((4, ATTACH_INET4_CONNECT), (6, ATTACH_INET6_CONNECT)):
        prog = load_program(build_program(rules, family), attach_type)
        try:
            attach(cgroup, prog, attach_type)
        except OSError as exc:
            raise EgressFilterError(
                f"cannot attach the egress program to {cgroup}: {exc.strerror}"
            ) from None
        finally:
            os.close(prog)  # the attachment holds the program


def cgroup2_mount(mountinfo: str) -> Path | None:
    """Pure: where the cgroup v2 hierarchy is mounted, from /proc/self/mountinfo's text."""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if sep and right.split(" ", 1)[0] == "cgroup2":
            fields = left.split()
            if len(fields) >= 5:
                return Path(fields[4])
    return None


def own_cgroup2(proc_cgroup: str) -> str | None:
    """Pure: this process's cgroup v2 path, from /proc/self/cgroup's text."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def egress_base(own: str) -> str:
    """Pure: the cgroup (relative to the cgroup v2 mount) below which egress leaves go, for a
    process in ``own``: its delegated cgroup's workloads subtree when it sits in the
    supervisor leaf, else its own cgroup."""
    path = Path("/") / own.lstrip("/")
    if path.name == SUPERVISOR:
        return str(path.parent / WORKLOADS / "edgefleet-egress")
    return str(path / "edgefleet-egress")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def egress_parent() -> Path:
    """``<edged's cgroup v2>/edgefleet-egress`` (:class:`EgressFilterError` when there is no
    cgroup v2 here)."""
    try:
        mount = cgroup2_mount(Path("/proc/self/mountinfo").read_text())
        own = own_cgroup2(Path("/proc/self/cgroup").read_text())
    except OSError as exc:
        raise EgressFilterError(f"cannot find the cgroup v2 hierarchy: {exc}") from None
    if mount is None or own is None:
        raise EgressFilterError("no cgroup v2 hierarchy is mounted")
    return mount / egress_base(own).lstrip("/")


def _sweep(parent: Path) -> None:
    """Remove leaves of edged processes that are gone (kill -9 leaves them behind)."""
    try:
        names = [p.name for p in parent.iterdir() if p.is_dir()]
    except OSError:
        return
    for name in names:
        pid, _, _ = name.partition("-")
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            try:
                (parent / name).rmdir()
            except OSError:
                pass  # a worker of it still runs: next time


def prepare(replica_id: str, rules: Sequence[Rule], limits_cgroup: str = "") -> Path:
    """The cgroup a worker of ``replica_id`` joins, with the programs for ``rules`` attached
    (control process, before the start). :class:`EgressFilterError` says why not."""
    if limits_cgroup:
        path = Path(limits_cgroup)
    else:
        parent = egress_parent()
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EgressFilterError(f"cannot make the cgroup {parent}: {exc.strerror}") from None
        _sweep(parent)
        path = parent / f"{os.getpid()}-{replica_id}"
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            raise EgressFilterError(f"cannot make the cgroup {path}: {exc.strerror}") from None
    enforce(path, rules)
    return path


def remove(path: str) -> None:
    """Remove a worker's own egress cgroup once its process is gone (its programs go with it;
    not a limits cgroup: ``limiting.remove_cgroup`` owns that)."""
    try:
        Path(path).rmdir()
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.EBUSY):
            raise


def join(path: str) -> None:
    """Move the calling process into ``path`` (the worker, before it confines itself)."""
    (Path(path) / "cgroup.procs").write_text(str(os.getpid()))


def describe(rules: Iterable[Rule]) -> tuple[str, ...]:
    """Pure: ``127.0.0.1/32:8080``, ``*:443`` (for status)."""
    return tuple(f"{cidr or '*'}:{port}" for port, cidr in rules)
