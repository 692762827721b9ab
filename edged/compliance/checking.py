"""Drift: what on the device differs from what edged made (pure: observations in, findings out).

* the artifact store (``artifacts/sha256/``): a file that is not a blob edged committed (its
  name is not a sha256, or it is not a plain file) is ``ArtifactAdded``; a blob that became
  writable, or whose bytes no longer hash to its name, is ``ArtifactChanged``. Blobs are
  trusted by their stat fingerprint (size, mtime, inode) once seen or hashed, and hashed
  again only when it changes, so an idle check reads no model;
* edged's config file: its digest differs from the one edged started with: ``ConfigChanged``;
* processes in edged's cgroup (and the cgroups below it) that neither edged nor one of its
  descendants started: ``StrayProcess``. Checked only when edged has a cgroup of its own
  (systemd: its service's); otherwise the check is reported as not done;
* processes that hold a model file open (a descriptor into ``artifacts/sha256/``) and are
  neither edged nor one of its descendants (its workers): ``ModelFileOpened``;
* sockets listening that the ingress policy does not allow, of processes in edged's cgroup,
  of edged's descendants, or of edged's user when it is not root (edged's own are what it
  was told to serve): TCP not on loopback, or on a port outside the baselines'
  ``network.ingress.tcpPorts`` (when set); unix sockets other than infer.sock and the status
  socket: ``ListeningSocket``.

:func:`plan_remediation` says what to do about findings under a baseline's ``drift.action``;
:func:`hold_reason` why no replica may start (quarantine, or an open watch a baseline requires).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

HEX_NAME = re.compile(r"[0-9a-f]{64}")  # a blob's name
_HEX = HEX_NAME


class FindingKind(StrEnum):
    ARTIFACT_ADDED = "ArtifactAdded"
    ARTIFACT_CHANGED = "ArtifactChanged"
    CONFIG_CHANGED = "ConfigChanged"
    STRAY_PROCESS = "StrayProcess"
    MODEL_FILE_OPENED = "ModelFileOpened"
    LISTENING_SOCKET = "ListeningSocket"


class DriftAction(StrEnum):
    """``spec.drift.action`` of a SecurityBaseline."""

    ALERT = "alert"  # report (status, the hub, the log)
    RESTART_WORKLOAD = "restartWorkload"  # undo it: move files away, kill strays, restart
    QUARANTINE = "quarantine"  # stop every workload; start none until an operator clears it


@dataclass(frozen=True, slots=True)
class Finding:
    kind: FindingKind
    subject: str  # a path, or a pid
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "subject": self.subject, "message": self.message}


@dataclass(frozen=True, slots=True)
class StoreEntry:
    """One directory entry of ``artifacts/sha256/`` as ``lstat`` saw it."""

    name: str
    regular: bool
    mode: int
    size: int
    mtime_ns: int
    inode: int

    @property
    def fingerprint(self) -> tuple[int, int, int]:
        return (self.size, self.mtime_ns, self.inode)


def check_store(
    entries: Iterable[StoreEntry], trusted: Mapping[str, tuple[int, int, int]]
) -> tuple[list[Finding], list[str]]:
    """The findings about the store, and the blobs to hash (named as a digest, not trusted
    with their current fingerprint). ``trusted``: fingerprints seen or verified before."""
    findings: list[Finding] = []
    to_hash: list[str] = []
    for e in entries:
        if not e.regular or not _HEX.fullmatch(e.name):
            findings.append(
                Finding(
                    FindingKind.ARTIFACT_ADDED,
                    e.name,
                    f"{e.name} in the artifact store is not a blob edged committed",
                )
            )
            continue
        if e.mode & 0o222:
            findings.append(
                Finding(
                    FindingKind.ARTIFACT_CHANGED,
                    e.name,
                    f"blob {e.name} is writable (mode {e.mode & 0o777:04o}); edged keeps "
                    "blobs read-only",
                )
            )
        if trusted.get(e.name) != e.fingerprint:
            to_hash.append(e.name)
    return findings, to_hash


def hash_findings(hashed: Mapping[str, str | None]) -> list[Finding]:
    """Findings from blobs hashed (name -> the digest found; None: unreadable)."""
    return [
        Finding(
            FindingKind.ARTIFACT_CHANGED,
            name,
            f"blob {name} no longer hashes to its name (found {found or 'nothing readable'})",
        )
        for name, found in sorted(hashed.items())
        if found != name
    ]


def check_config(path: str, at_start: str | None, now: str | None) -> list[Finding]:
    """``at_start``/``now``: the config file's sha256 (None: no file)."""
    if at_start == now:
        return []
    what = "removed" if now is None else "changed"
    return [
        Finding(
            FindingKind.CONFIG_CHANGED,
            path,
            f"{path} was {what} outside edged since it started (it applies at the next start)",
        )
    ]


def check_processes(
    pids: Iterable[int], parent_of: Mapping[int, int], own: int, names: Mapping[int, str]
) -> list[Finding]:
    """Processes of edged's cgroup not descended from edged (``own``); ``parent_of``: each
    process's parent pid as read (a process that vanished has none: not a finding)."""
    findings = []
    for pid in sorted(set(pids)):
        if pid == own or pid not in parent_of:
            continue
        seen = set()
        cur = pid
        while cur not in (own, 0, 1) and cur not in seen and cur in parent_of:
            seen.add(cur)
            cur = parent_of[cur]
        if cur != own:
            name = names.get(pid, "?")
            findings.append(
                Finding(
                    FindingKind.STRAY_PROCESS,
                    str(pid),
                    f"process {pid} ({name}) runs in edged's cgroup and edged did not start it",
                )
            )
    return findings


def _descends(pid: int, own: int, parent_of: Mapping[int, int]) -> bool:
    seen = set()
    cur = pid
    while cur not in (own, 0, 1) and cur not in seen and cur in parent_of:
        seen.add(cur)
        cur = parent_of[cur]
    return cur == own


def check_openers(
    open_blobs: Mapping[int, Iterable[str]],
    parent_of: Mapping[int, int],
    own: int,
    names: Mapping[int, str],
) -> list[Finding]:
    """Processes holding model files open (pid -> names in the store) that are neither
    edged (``own``) nor descended from it; only blobs count (a file edged did not commit
    is ``ArtifactAdded`` already)."""
    findings = []
    for pid, blobs in sorted(open_blobs.items()):
        shown = sorted({b for b in blobs if _HEX.fullmatch(b)})  # others are ArtifactAdded
        if not shown or pid == own or _descends(pid, own, parent_of):
            continue
        findings.append(
            Finding(
                FindingKind.MODEL_FILE_OPENED,
                str(pid),
                f"process {pid} ({names.get(pid, '?')}) has model file "
                f"{', '.join(b[:12] for b in shown[:3])}{' ...' if len(shown) > 3 else ''} "
                "open; only edged's workers may",
            )
        )
    return findings


@dataclass(frozen=True, slots=True)
class Listener:
    """A listening socket and the process that holds it (``family``: tcp, tcp6 or unix;
    ``address``: the bound address, or the unix path, ``@name`` when abstract)."""

    pid: int
    family: str
    address: str
    port: int = 0


LOOPBACK = ("127.", "::1", "::ffff:127.")


def check_listeners(
    listeners: Iterable[Listener],
    *,
    tcp_ports: Iterable[int] | None,
    unix_paths: Iterable[str],
    names: Mapping[int, str],
) -> list[Finding]:
    """Listening sockets the ingress policy does not allow (see the module doc);
    ``listeners`` are those of the processes in scope, edged's own left out."""
    ports = None if tcp_ports is None else set(tcp_ports)
    paths = set(unix_paths)
    findings = []
    for li in sorted(set(listeners), key=lambda x: (x.pid, x.family, x.address, x.port)):
        who = f"process {li.pid} ({names.get(li.pid, '?')})"
        if li.family == "unix":
            if li.address in paths:
                continue
            why = f"listens on unix socket {li.address}; only infer.sock and edged.sock may be"
        else:
            shown = f"[{li.address}]:{li.port}" if ":" in li.address else f"{li.address}:{li.port}"
            if not li.address.startswith(LOOPBACK):
                why = f"listens on {shown}, not loopback; the inference API is loopback only"
            elif ports is not None and li.port not in ports:
                allowed = ", ".join(map(str, sorted(ports))) or "none"
                why = f"listens on {shown}; the baselines' tcpPorts allow {allowed}"
            else:
                continue
        findings.append(Finding(FindingKind.LISTENING_SOCKET, str(li.pid), f"{who} {why}"))
    return findings


@dataclass(frozen=True, slots=True)
class Remediation:
    """What to do about findings (pure: :func:`plan_remediation`)."""

    remove_files: tuple[str, ...] = ()  # store entries to move to quarantine/
    requarantine_blobs: tuple[str, ...] = ()  # blobs to check and quarantine if rotten
    kill_pids: tuple[int, ...] = ()
    quarantine: bool = False  # stop every workload, start none until an operator clears it


def plan_remediation(findings: Iterable[Finding], action: DriftAction) -> Remediation:
    """What ``action`` does about ``findings``: ``alert`` nothing; ``restartWorkload`` moves
    added files to quarantine, has changed blobs checked (and quarantined, so their workloads
    fetch them again and restart), kills stray processes, processes holding a model file open
    and processes listening where the policy does not allow (a worker among them is started
    again by its workload); ``quarantine`` stops every workload
    and starts none until an operator clears it, leaving the evidence where it is. A config
    edited by hand is only reported (edged does not rewrite its own config)."""
    items = list(findings)
    if action is DriftAction.ALERT or not items:
        return Remediation()
    if action is DriftAction.QUARANTINE:
        return Remediation(quarantine=True)
    return Remediation(
        remove_files=tuple(f.subject for f in items if f.kind is FindingKind.ARTIFACT_ADDED),
        requarantine_blobs=tuple(
            f.subject for f in items if f.kind is FindingKind.ARTIFACT_CHANGED
        ),
        kill_pids=tuple(
            sorted(
                {
                    int(f.subject)
                    for f in items
                    if f.kind in KILLED and f.subject.isdigit() and int(f.subject) > 1
                }
            )
        ),
    )


def hold_reason(
    *,
    quarantined: str | None,
    open_watch_reason: str | None,
    require_open_watch: bool,
    baselines: Sequence[str],
) -> str | None:
    """Why no replica may start now, or None: the device's quarantine (``quarantined``: its
    reason), or a baseline's ``drift.requireOpenWatch`` (``baselines``: their names) on a
    device where the open watch is not in force (``open_watch_reason``: why not)."""
    if quarantined is not None:
        return quarantined
    if require_open_watch and open_watch_reason is not None:
        return (
            f"the SecurityBaseline {', '.join(baselines)} requires the open "
            f"watch (drift.requireOpenWatch) and it is not in force: {open_watch_reason}"
        )
    return None


KILLED = frozenset(
    {FindingKind.STRAY_PROCESS, FindingKind.MODEL_FILE_OPENED, FindingKind.LISTENING_SOCKET}
)
