"""A small seccomp filter for inference workers (classic BPF, built here, loaded with prctl).

Landlock limits TCP by port but knows nothing of UDP or raw sockets, and a worker never needs
the system calls that administer the machine. The filter answers, for the worker and
everything it starts:

* ``socket()``: Unix sockets, and TCP (``SOCK_STREAM``) over IPv4/IPv6 (Landlock's port rules
  decide where those may go); anything else (UDP, raw, netlink, packet...) ``EPERM``;
* ``ptrace``, ``process_vm_readv/writev``, ``mount`` and the new mount API, ``pivot_root``,
  ``chroot``, ``unshare``, ``setns``, ``bpf``, ``perf_event_open``, ``userfaultfd``,
  ``io_uring_setup``, ``kexec_*``, module loading, ``keyctl``/``add_key``/``request_key``,
  ``open_by_handle_at``, ``swapon/off``, ``acct``, ``reboot``: ``EPERM``;
* every call from another architecture's ABI (x32, i386 compat): ``EPERM``;
* everything else: allowed. It is a deny list on purpose: an allow list would break with each
  onnxruntime or glibc release, and Landlock already confines files and TCP.

Its cost is a few dozen BPF instructions per system call; ``bench/sandbox.py`` measures the
whole sandbox. x86_64 and aarch64 only (:class:`SeccompUnsupported` elsewhere).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import socket
import struct

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_AND_K = 0x54
_RET_K = 0x06
_X32_SYSCALL_BIT = 0x40000000
_SOCK_TYPE_MASK = 0xF

# (audit arch, {name: number}) per machine
_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "socket": 41, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
            "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272,
            "setns": 308, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
            "io_uring_setup": 425, "kexec_load": 246, "kexec_file_load": 320,
            "init_module": 175, "finit_module": 313, "delete_module": 176, "keyctl": 250,
            "add_key": 248, "request_key": 249, "open_by_handle_at": 304, "swapon": 167,
            "swapoff": 168, "acct": 163, "reboot": 169, "open_tree": 428, "move_mount": 429,
            "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "socket": 198, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
            "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97,
            "setns": 268, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
            "io_uring_setup": 425, "kexec_load": 104, "kexec_file_load": 294,
            "init_module": 105, "finit_module": 273, "delete_module": 106, "keyctl": 219,
            "add_key": 217, "request_key": 218, "open_by_handle_at": 265, "swapon": 224,
            "swapoff": 225, "acct": 89, "reboot": 142, "open_tree": 428, "move_mount": 429,
            "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        },
    ),
}  # fmt: skip
_ARCHES["arm64"] = _ARCHES["aarch64"]


class SeccompUnsupported(Exception):
    """No filter for this machine's architecture."""


class _Filter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


# An instruction: (code, jump-if-true label or None, jump-if-false label or None, k)
_Insn = tuple[int, str | None, str | None, int]


def build_filter(machine: str) -> list[tuple[int, int, int, int]]:
    """Pure: the filter's instructions (code, jt, jf, k) for ``machine``
    (``platform.machine()``)."""
    if machine not in _ARCHES:
        raise SeccompUnsupported(f"no seccomp filter for {machine}")
    arch, numbers = _ARCHES[machine]
    offset = 0 if struct.pack("=I", 1) == struct.pack("<I", 1) else 4  # low word of args
    body: list[tuple[str | None, _Insn]] = [
        (None, (_LD_W_ABS, None, None, 4)),  # seccomp_data.arch
        (None, (_JEQ_K, None, "deny", arch)),
        (None, (_LD_W_ABS, None, None, 0)),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        body.append((None, (_JGE_K, "deny", None, _X32_SYSCALL_BIT)))
    body.append((None, (_JEQ_K, "socket", None, numbers["socket"])))
    for name, number in sorted(numbers.items()):
        if name != "socket":
            body.append((None, (_JEQ_K, "deny", None, number)))
    body += [
        (None, (_RET_K, None, None, RET_ALLOW)),
        ("socket", (_LD_W_ABS, None, None, 16 + offset)),  # args[0]: domain
        (None, (_JEQ_K, "allow", None, socket.AF_UNIX)),
        (None, (_JEQ_K, "inet", None, socket.AF_INET)),
        (None, (_JEQ_K, "inet", "deny", socket.AF_INET6)),
        ("inet", (_LD_W_ABS, None, None, 24 + offset)),  # args[1]: type | flags
        (None, (_AND_K, None, None, _SOCK_TYPE_MASK)),
        (None, (_JEQ_K, "allow", "deny", socket.SOCK_STREAM)),
        ("allow", (_RET_K, None, None, RET_ALLOW)),
        ("deny", (_RET_K, None, None, RET_ERRNO | errno.EPERM)),
    ]
    labels = {label: i for i, (label, _) in enumerate(body) if label}
    out = []
    for i, (_, (code, jt, jf, k)) in enumerate(body):
        out.append(
            (
                code,
                labels[jt] - i - 1 if jt else 0,
                labels[jf] - i - 1 if jf else 0,
                k,
            )
        )
    return out


def install() -> None:
    """Load the filter into the calling process (no_new_privs must be set; irreversible)."""
    program = build_filter(platform.machine())
    array = (_Filter * len(program))(*(_Filter(c, t, f, k) for c, t, f, k in program))
    prog = _Prog(len(program), array)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"PR_SET_SECCOMP: {os.strerror(code)}")
