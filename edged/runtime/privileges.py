"""The worker leaves root for its own uid (``identities.py`` chose it), in the order that
leaves nothing behind: supplementary groups first (only root may change them: none, or only
those of the accelerator nodes it may open), then the gid
(real, effective and saved), then the uid (the same three). Afterwards it checks that there
is no way back: every uid and gid is the new one, there are no supplementary groups, no
capability is left (permitted, effective or ambient), and ``setuid(0)`` fails.

A change of credentials clears the parent-death signal (prctl(2)): it is set again right
after the switch.
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

PR_SET_PDEATHSIG = 1

# What edged as root needs for the protections of docs/security.md, by capability number
# (linux/capability.h); the shipped unit's CapabilityBoundingSet= (packaging/systemd) holds
# these and no more: tests/systemd/test_units.py compares the two.
NEEDED_CAPABILITIES = {
    "CAP_KILL": 5,  # stop workers that run as other uids
    "CAP_SETGID": 6,  # a worker's switch to its own gid and groups
    "CAP_SETUID": 7,  # a worker's switch to its own uid
    "CAP_NET_ADMIN": 12,  # attach the egress programs (runtime/egressfilter.py)
    "CAP_SYS_ADMIN": 21,  # bpf() before Linux 5.8; the fanotify open watch (compliance)
    "CAP_SYS_RESOURCE": 24,  # a negative oom_score_adj (runtime/oomscoring.py)
    "CAP_BPF": 39,  # load the egress programs
}


class DropFailed(Exception):
    """The worker could not switch to its uid (nothing or part of it changed)."""


class StillPrivileged(DropFailed):
    """The switch went through but the process could still get root back: never run so."""


def drop_to(uid: int, gid: int, groups: tuple[int, ...] = ()) -> None:
    """Switch this process (one thread) to ``uid``/``gid`` for good, with no supplementary
    group but ``groups`` (those of the accelerator nodes it may open; never 0);
    :class:`DropFailed` names the step that failed."""
    if uid <= 0 or gid <= 0 or 0 in groups:
        raise DropFailed(f"refusing to switch to uid {uid} gid {gid} groups {list(groups)}")
    step = f"setgroups({list(groups)})"
    try:
        os.setgroups(list(groups))
        step = f"setresgid({gid})"
        os.setresgid(gid, gid, gid)
        step = f"setresuid({uid})"
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        raise DropFailed(f"{step}: {exc.strerror}") from None
    verify_dropped(uid, gid, groups)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by the switch: dies with edged


def verify_dropped(uid: int, gid: int, groups: tuple[int, ...] = ()) -> None:
    """:class:`StillPrivileged` unless this process is ``uid``/``gid`` (and ``groups``) with no
    way back to root."""
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise StillPrivileged(f"uids {os.getresuid()} gids {os.getresgid()} after the switch")
    if sorted(set(os.getgroups()) - {gid}) != sorted(groups):
        raise StillPrivileged(f"supplementary groups {os.getgroups()} after the switch")
    caps = capabilities()
    left = {k: v for k, v in caps.items() if k in ("CapPrm", "CapEff", "CapAmb") and v}
    if left:
        raise StillPrivileged(f"capabilities left after the switch: {left}")
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise StillPrivileged("setuid(0) succeeded after the switch")
    try:
        os.setgid(0)
    except PermissionError:
        pass
    else:
        raise StillPrivileged("setgid(0) succeeded after the switch")


def missing_capabilities(effective: int) -> tuple[str, ...]:
    """Pure: the names of :data:`NEEDED_CAPABILITIES` not in the mask ``effective``
    (``CapEff`` of /proc/self/status)."""
    return tuple(name for name, bit in NEEDED_CAPABILITIES.items() if not effective >> bit & 1)


def warn_missing_capabilities() -> tuple[str, ...]:
    """Log which needed capabilities edged as root lacks (a unit with a narrower
    CapabilityBoundingSet=): the protections that need them are then reported not in force
    per worker. Returns the names; nothing as a user other than root, which has none."""
    if os.geteuid() != 0:
        return ()
    try:
        missing = missing_capabilities(capabilities().get("CapEff", 0))
    except OSError:
        return ()  # no /proc/self/status: nothing to say, the protections report themselves
    if missing:
        from edgefleet.logs import get_logger

        get_logger(__name__).warning(
            "edged runs as root without capabilities its protections need",
            missing=" ".join(missing),
        )
    return missing


def capabilities(status: Path = Path("/proc/self/status")) -> dict[str, int]:
    """``Cap*`` lines of ``/proc/self/status`` (hex masks)."""
    out: dict[str, int] = {}
    for line in status.read_text().splitlines():
        if line.startswith("Cap"):
            name, _, value = line.partition(":")
            out[name] = int(value.strip(), 16)
    return out
