"""Landlock (Linux's unprivileged sandboxing LSM) through its raw system calls, with ctypes.

Only what the worker sandbox needs: :func:`abi_version` (0: no Landlock), and
:class:`Ruleset`, which collects path and TCP port rules and :meth:`Ruleset.restrict_self`
enforces them on the calling thread and every thread and process it starts afterwards.
Nothing here decides policy (``sandboxing.py`` does); this module only speaks to the kernel.

The system call numbers are the same on every architecture edged ships for (the generic
syscall table: x86_64, aarch64, arm, riscv64). ABI versions:

* 1 (Linux 5.13): filesystem access rights, 2 (5.19) ``REFER``, 3 (6.2) ``TRUNCATE``;
* 4 (6.7): TCP ``bind``/``connect`` by port; 5 (6.10): ``IOCTL_DEV``;
* 6 (6.12): scopes (abstract Unix sockets, signals); 7 (6.15): audit log flags.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39

# -- filesystem rights ---------------------------------------------------------------------------
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5

FS_READ = FS_READ_FILE | FS_READ_DIR
"""Read files and list directories: what the worker gets on its libraries and artifact."""
FS_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
"""The rights a rule on a file (not a directory) may carry."""

# -- network rights (ABI 4) ----------------------------------------------------------------------
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1

# -- scopes (ABI 6) ------------------------------------------------------------------------------
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

RULE_PATH_BENEATH = 1
RULE_NET_PORT = 2


class LandlockError(OSError):
    """The kernel refused a Landlock call (errno and what was asked)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


_libc: ctypes.CDLL | None = None


def _syscall() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.prctl.restype = ctypes.c_int
        _libc = libc
    return _libc


def _call(number: int, *args: object) -> int:
    libc = _syscall()
    result = int(libc.syscall(ctypes.c_long(number), *args))
    if result < 0:
        errno = ctypes.get_errno()
        raise LandlockError(errno, os.strerror(errno))
    return result


def abi_version() -> int:
    """The Landlock ABI this kernel offers; 0 when it has none (not built in, not enabled with
    ``lsm=``, or a kernel older than 5.13)."""
    try:
        return _call(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                     ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))  # fmt: skip
    except (LandlockError, AttributeError):
        return 0


def fs_rights(abi: int) -> int:
    """Every filesystem right ``abi`` knows: handled, so denied unless a rule allows it."""
    rights = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def net_rights(abi: int) -> int:
    return NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0


def scopes(abi: int) -> int:
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


def _attr_size(abi: int) -> int:
    """The ruleset attribute's size an ABI understands (older kernels refuse larger ones
    with non-zero tails only, but a smaller size keeps the call exact)."""
    if abi >= 6:
        return ctypes.sizeof(_RulesetAttr)
    if abi >= 4:
        return 16
    return 8


def set_no_new_privs() -> None:
    """``prctl(PR_SET_NO_NEW_PRIVS, 1)``: no exec can ever grant this process or its children
    more privileges (setuid bits, file capabilities); needed by Landlock and seccomp."""
    libc = _syscall()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise LandlockError(errno, f"PR_SET_NO_NEW_PRIVS: {os.strerror(errno)}")


def no_new_privs() -> bool:
    return bool(_syscall().prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1)


@dataclass(frozen=True, slots=True)
class Enforced:
    """What :meth:`Ruleset.restrict_self` put in force."""

    abi: int
    fs_rights: int
    net_rights: int
    scopes: int


class Ruleset:
    """A Landlock ruleset being built: everything the ABI handles is denied unless a rule
    allows it. Close it (or use it as a context manager) when done."""

    def __init__(self, abi: int, *, network: bool = True, scoped: bool = True) -> None:
        """``network``: handle TCP bind/connect (deny them but for port rules);
        ``scoped``: deny signals and abstract Unix sockets beyond the sandbox (ABI 6)."""
        if abi < 1:
            raise LandlockError(95, "Landlock is not available on this kernel")
        self.abi = abi
        self.handled_fs = fs_rights(abi)
        self.handled_net = net_rights(abi) if network else 0
        self.scoped = scopes(abi) if scoped else 0
        attr = _RulesetAttr(self.handled_fs, self.handled_net, self.scoped)
        self.fd = _call(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr),
                        ctypes.c_size_t(_attr_size(abi)), ctypes.c_uint32(0))  # fmt: skip

    def __enter__(self) -> Ruleset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def allow_path(self, path: str, rights: int) -> bool:
        """Allow ``rights`` on ``path`` and everything beneath it (a file: on that file, with
        only the rights a file can have). False when the path does not exist."""
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            if not os.path.isdir(path):
                rights &= FS_FILE_ONLY
            rule = _PathBeneathAttr(rights & self.handled_fs, fd)
            _call(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(self.fd), ctypes.c_int(RULE_PATH_BENEATH),
                  ctypes.byref(rule), ctypes.c_uint32(0))  # fmt: skip
        finally:
            os.close(fd)
        return True

    def allow_port(self, port: int, rights: int) -> None:
        """Allow TCP ``rights`` (``NET_CONNECT_TCP``, ``NET_BIND_TCP``) on ``port``, on every
        address: Landlock rules name ports, never addresses."""
        if not self.handled_net:
            raise LandlockError(95, f"Landlock ABI {self.abi} has no TCP port rules")
        rule = _NetPortAttr(rights & self.handled_net, port)
        _call(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(self.fd), ctypes.c_int(RULE_NET_PORT),
              ctypes.byref(rule), ctypes.c_uint32(0))  # fmt: skip

    def restrict_self(self) -> Enforced:
        """Enforce the ruleset on this process (every thread started later inherits it, and
        so does every child). Sets no_new_privs first; there is no way back."""
        set_no_new_privs()
        _call(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(self.fd), ctypes.c_uint32(0))
        enforced = Enforced(self.abi, self.handled_fs, self.handled_net, self.scoped)
        self.close()
        return enforced
