"""What sandbox a worker gets (pure): edged.toml, the fleet's baselines and the deployment in,
a :class:`~edged.runtime.launching.SandboxSpec` out. The worker puts it in force on itself
(``sandboxing.py``); edged never needs Landlock in the control process.

* ``[workers] sandbox`` (``landlock``, the default, or ``off``) and ``seccomp`` (default on)
  say what this device does; a baseline's ``requireSandbox`` makes a protection that cannot
  be had fail the start instead of being reported (and overrides ``sandbox = "off"``).
* A deployment's ``spec.network.egress`` grants TCP ports; a baseline's
  ``network.egress`` bounds what any deployment may be granted (several baselines: only what
  each allows). A deployment asking beyond the bound is refused (``refused``): its worker
  reports ``NetworkPolicyDenied`` and does not start.
* ``[workers] separateUids`` (default on): when edged runs as root, each worker replica
  leaves root for a uid of its own (``identities.py``, ``privileges.py``); a baseline's
  ``requireSandbox`` overrides ``separateUids = false`` there. When edged is not root its
  workers are not root either and keep its uid (status says why).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from edged.runtime.launching import SandboxSpec
from edgefleet.api import ModelDeployment, SecurityBaseline
from edgefleet.api.baselines import DRIFT_ACTIONS
from edgefleet.api.networking import EgressRule, egress_beyond, intersect_egress

CPU_ONLY_PROVIDERS = frozenset({"CPUExecutionProvider", "XnnpackExecutionProvider"})


@dataclass(frozen=True, slots=True)
class DeviceSecurity:
    """What this device's config and the accepted baselines say about worker sandboxes."""

    sandbox: str = "landlock"
    seccomp: bool = True
    require_sandbox: bool = False
    egress_bound: tuple[EgressRule, ...] | None = None  # None: no baseline bounds egress
    baselines: tuple[str, ...] = ()  # names, for messages
    # ingress (infer.sock and the loopback TCP ports): None = no baseline says
    socket_groups: tuple[str, ...] = ()  # every group a baseline names (two: a conflict)
    socket_mode: int | None = None  # the modes of every baseline ANDed
    tcp_ports: tuple[int, ...] | None = None  # the ports every baseline allows
    drift_action: str = "alert"  # the most severe of the baselines' drift.action
    drift_period_s: float = 30.0  # the shortest of their drift.period
    separate_uids: bool = True  # [workers] separateUids
    edged_root: bool = False  # edged's effective uid is 0 (only then can workers get a uid)

    def with_baselines(self, baselines: Iterable[SecurityBaseline]) -> DeviceSecurity:
        """This device's settings under ``baselines`` (replacing any it held)."""
        items = sorted(baselines, key=lambda b: b.name)
        bound: tuple[EgressRule, ...] | None = None
        groups: set[str] = set()
        mode: int | None = None
        tcp: set[int] | None = None
        action, periods = "alert", []
        for b in items:
            if b.spec.drift is not None:
                if DRIFT_ACTIONS.index(b.spec.drift.action) > DRIFT_ACTIONS.index(action):
                    action = b.spec.drift.action
                periods.append(b.spec.drift.period_s)
            net = b.spec.network
            if net is not None and net.egress is not None:
                bound = net.egress if bound is None else intersect_egress(bound, net.egress)
            ingress = net.ingress if net is not None else None
            if ingress is None:
                continue
            if ingress.socket_group is not None:
                groups.add(ingress.socket_group)
            if ingress.socket_mode is not None:
                mode = ingress.socket_mode if mode is None else mode & ingress.socket_mode
            if ingress.tcp_ports is not None:
                allowed = set(ingress.tcp_ports)
                tcp = allowed if tcp is None else tcp & allowed
        return DeviceSecurity(
            sandbox=self.sandbox,
            seccomp=self.seccomp,
            require_sandbox=any(b.spec.require_sandbox for b in items),
            egress_bound=bound,
            baselines=tuple(b.name for b in items),
            socket_groups=tuple(sorted(groups)),
            socket_mode=mode,
            tcp_ports=None if tcp is None else tuple(sorted(tcp)),
            drift_action=action,
            drift_period_s=min(periods, default=30.0),
            separate_uids=self.separate_uids,
            edged_root=self.edged_root,
        )


def choose_sandbox(
    deployment: ModelDeployment,
    providers: Sequence[str],
    security: DeviceSecurity,
    *,
    device_paths: Sequence[str] = (),
) -> SandboxSpec:
    """Pure: the sandbox of a worker of ``deployment`` running ``providers`` on this device.
    ``device_paths``: the accelerator nodes of this device (given to workers that run an
    accelerator's provider)."""
    network = deployment.spec.network
    ports = network.egress_ports if network is not None else ()
    refused = ""
    beyond = egress_beyond(network, security.egress_bound)
    if beyond:
        allowed = ", ".join(r.text() for r in security.egress_bound or ()) or "none"
        refused = (
            f"spec.network.egress asks for port {', '.join(r.text() for r in beyond)}, which "
            f"the SecurityBaseline {', '.join(security.baselines)} does not allow "
            f"(allowed: {allowed})"
        )
    # Rules that name addresses are enforced by a cgroup BPF program too (egressfilter.py):
    # every rule then, since the program allows only what some rule allows.
    rules = (
        tuple((r.port, r.cidr or "") for r in network.egress or ())
        if network is not None and network.egress_addresses
        else ()
    )
    mode = "landlock" if security.require_sandbox else security.sandbox
    needs_devices = any(p not in CPU_ONLY_PROVIDERS for p in providers)
    separate_uid, uid_note = uid_separation(security)
    return SandboxSpec(
        mode=mode,
        required=security.require_sandbox,
        network=network is not None and network.egress is not None,
        connect_ports=ports,
        egress_rules=rules,
        device_paths=tuple(device_paths) if needs_devices else (),
        seccomp=security.seccomp and mode != "off",
        refused=refused,
        separate_uid=separate_uid,
        uid_note=uid_note,
    )


def uid_separation(security: DeviceSecurity) -> tuple[bool, str]:
    """Pure: whether workers get a uid of their own, and if not, why."""
    if not security.edged_root:
        return False, "edged is not root"
    if security.separate_uids or security.require_sandbox:
        return True, ""
    return False, "turned off ([workers] separateUids = false)"


DEFAULT_SOCKET_MODE = 0o660


@dataclass(frozen=True, slots=True)
class IngressPlan:
    """How the inference API is offered: infer.sock's group (``None``: edged's own) and mode,
    whether the configured loopback TCP port may be served, and why anything is tighter than
    configured."""

    group: str | None
    mode: int
    serve_tcp: bool
    problems: tuple[str, ...] = ()


def plan_ingress(
    security: DeviceSecurity, *, tcp_port: int | None, group_exists: Callable[[str], bool]
) -> IngressPlan:
    """Pure (``group_exists`` asks the device's group database): what the baselines allow of
    the inference API. When they cannot be followed (two baselines name different groups, a
    group this device does not have) the socket is closed to all but edged's own user (0600):
    tighter, never looser, and said in ``problems``."""
    problems: list[str] = []
    mode = DEFAULT_SOCKET_MODE if security.socket_mode is None else security.socket_mode
    group: str | None = None
    if len(security.socket_groups) > 1:
        problems.append(
            "baselines name different groups for infer.sock "
            f"({', '.join(security.socket_groups)}): only edged's own user may use it"
        )
        mode &= 0o600
    elif security.socket_groups:
        group = security.socket_groups[0]
        if not group_exists(group):
            problems.append(
                f"group {group!r} does not exist on this device: only edged's own user may "
                "use infer.sock"
            )
            group = None
            mode &= 0o600
    serve_tcp = tcp_port is not None
    if (
        tcp_port is not None
        and security.tcp_ports is not None
        and tcp_port not in security.tcp_ports
    ):
        serve_tcp = False
        allowed = ", ".join(map(str, security.tcp_ports)) or "none"
        problems.append(
            f"inference.listenTcp port {tcp_port} is not allowed by the SecurityBaseline "
            f"{', '.join(security.baselines)} (tcpPorts: {allowed}): not served"
        )
    return IngressPlan(group, mode, serve_tcp, tuple(problems))


def outdated_sandboxes(
    running: Iterable[tuple[str, SandboxSpec, SandboxSpec]],
) -> list[str]:
    """Pure: the replicas whose worker runs under another sandbox than the one it would get
    now (``(replica id, running, wanted)``): a baseline changed under them. Killed and started
    again, they get the new one; nothing keeps running under a policy that no longer holds."""
    return [rid for rid, have, want in running if have != want]
