"""What edged tells a worker process at launch: a frozen, JSON-serialisable spec.

Shared by the control process (which must not import numpy or onnxruntime) and the worker.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LimitsSpec:
    """Resource limits for one worker and how they are enforced.

    ``mode`` is ``cgroup`` (cgroup v2: ``cpu.max`` and ``memory.max`` of ``cgroup_path``),
    ``rlimit`` (RLIMIT_DATA for memory, CPU affinity to ``cpus`` for CPU), or ``none``.
    """

    mode: str = "none"
    cgroup_path: str = ""
    cpus: tuple[int, ...] = ()
    memory_bytes: int | None = None
    cpu_millis: int | None = None


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """How a worker confines itself before it reads its model (``sandboxing.py``).

    ``mode``: ``landlock`` (filesystem: read its artifact and the runtime's libraries only;
    TCP: connect to ``connect_ports`` and bind ``bind_ports`` only) or ``off``. ``required``:
    a protection that cannot be put in force fails the start (a baseline's
    ``requireSandbox``); otherwise it is reported. ``network``: the TCP rules must be in force
    (a network policy was given): a kernel without them fails the start, whatever
    ``required`` says. ``device_paths``: accelerator nodes the worker may open read-write.
    ``refused``: edged decided the worker may not run (egress beyond the baseline); the worker
    reports it (``NetworkPolicyDenied``) and exits, so the refusal shows like any failed start.
    ``separate_uid``: the worker leaves root for a uid of its own (edged runs as root and
    ``[workers] separateUids`` is on, or a baseline requires the sandbox); when not,
    ``uid_note`` says why (status shows it).
    """

    mode: str = "off"
    required: bool = False
    network: bool = False
    connect_ports: tuple[int, ...] = ()
    bind_ports: tuple[int, ...] = ()
    # when a rule names addresses: every egress rule as (port, cidr or ""), enforced by a
    # cgroup BPF program on ``egress_cgroup`` (made by edged before the start: egressfilter.py),
    # which the worker joins first; ``egress_problem``: why edged could not make it
    egress_rules: tuple[tuple[int, str], ...] = ()
    egress_cgroup: str = ""
    egress_problem: str = ""
    device_paths: tuple[str, ...] = ()
    seccomp: bool = False
    refused: str = ""  # why this worker may not start at all (a policy refused it)
    # directories the worker may read (its workload's secrets directory: edged/trust/secrets.py)
    read_dirs: tuple[str, ...] = ()
    separate_uid: bool = False
    uid_note: str = ""  # why the worker keeps edged's uid (when not separate_uid)


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    replica_id: str
    workload: str
    model_name: str
    model_version: str
    artifact_path: str
    artifact_sha256: str
    providers: tuple[str, ...]
    intra_op_threads: int
    max_batch_size: int
    max_queue_delay_s: float
    limits: LimitsSpec
    log_level: str = "info"
    # the artifact's validation set (runtime/validating.py), evaluated when ``validate``
    validate: bool = False
    validation_path: str = ""
    validation_sha256: str = ""
    sandbox: SandboxSpec = SandboxSpec()
    # spec.secrets: (mountPath, the directory that serves it), told to the worker as
    # EDGEFLEET_SECRET_DIRS (workers have no mount namespace: docs/security.md)
    secret_dirs: tuple[tuple[str, str], ...] = ()
    # its model configuration's directory (edged/state/modelconfigs.py: config.json and
    # files/, swapped whole), told to the worker as EDGEFLEET_MODEL_CONFIG_DIR and, for the
    # file, EDGEFLEET_MODEL_CONFIG; "": none
    config_dir: str = ""
    # the uid (and gid of the same number) the pool took for this replica when
    # ``sandbox.separate_uid`` (runtime/identities.py); -1: none, ``uid_problem`` says why
    uid: int = -1
    uid_problem: str = ""
    # its supplementary groups then: only those of the accelerator nodes it may open
    groups: tuple[int, ...] = ()
    # workers that outlive edged (runtime/adopting.py): the abstract Unix socket name the
    # worker listens on for the next edged ("": it dies with edged, as before), how long it
    # waits for one, and the uid a connection must come from (edged's)
    attach_name: str = ""
    orphan_timeout_s: float = 0.0
    supervisor_uid: int = -1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> LaunchSpec:
        limits = doc.pop("limits")
        limits["cpus"] = tuple(limits["cpus"])
        doc["providers"] = tuple(doc["providers"])
        sandbox = doc.pop("sandbox", None) or {}
        doc["secret_dirs"] = tuple(tuple(pair) for pair in doc.get("secret_dirs", ()))
        doc["groups"] = tuple(doc.get("groups", ()))
        for key in ("connect_ports", "bind_ports", "device_paths", "read_dirs"):
            if key in sandbox:
                sandbox[key] = tuple(sandbox[key])
        if "egress_rules" in sandbox:
            sandbox["egress_rules"] = tuple((int(p), str(c)) for p, c in sandbox["egress_rules"])
        return cls(limits=LimitsSpec(**limits), sandbox=SandboxSpec(**sandbox), **doc)
