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

from edged.config import WorkersConfig
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
    # who may use infer.sock, one (users, groups) per baseline that names any: a peer must
    # be allowed by each
    socket_peers: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()
    drift_action: str = "alert"  # the most severe of the baselines' drift.action
    drift_period_s: float = 30.0  # the shortest of their drift.period
    require_open_watch: bool = False  # a baseline's drift.requireOpenWatch
    separate_uids: bool = True  # [workers] separateUids
    edged_root: bool = False  # edged's effective uid is 0 (only then can workers get a uid)

    @classmethod
    def from_config(cls, workers: WorkersConfig, *, edged_root: bool) -> DeviceSecurity:
        """What edged.toml's ``[workers]`` says, before any baseline."""
        return cls(
            sandbox=workers.sandbox,
            seccomp=workers.seccomp,
            separate_uids=workers.separate_uids,
            edged_root=edged_root,
        )

    def with_baselines(self, baselines: Iterable[SecurityBaseline]) -> DeviceSecurity:
        """This device's settings under ``baselines`` (replacing any it held)."""
        items = sorted(baselines, key=lambda b: b.name)
        bound: tuple[EgressRule, ...] | None = None
        groups: set[str] = set()
        mode: int | None = None
        tcp: set[int] | None = None
        action, periods = "alert", []
        peers: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
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
            if ingress.users is not None or ingress.groups is not None:
                peers.append((ingress.users or (), ingress.groups or ()))
        return DeviceSecurity(
            sandbox=self.sandbox,
            seccomp=self.seccomp,
            require_sandbox=any(b.spec.require_sandbox for b in items),
            egress_bound=bound,
            baselines=tuple(b.name for b in items),
            socket_groups=tuple(sorted(groups)),
            socket_mode=mode,
            tcp_ports=None if tcp is None else tuple(sorted(tcp)),
            socket_peers=tuple(peers),
            drift_action=action,
            drift_period_s=min(periods, default=30.0),
            require_open_watch=any(
                b.spec.drift is not None and b.spec.drift.require_open_watch for b in items
            ),
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
PEER_CHECKED_SOCKET_MODE = 0o666  # ingress.users/groups without a socketMode or socketGroup


@dataclass(frozen=True, slots=True)
class PeerRule:
    """Who one baseline lets use infer.sock, as ids of this device."""

    uids: frozenset[int]
    gids: frozenset[int]


def resolve_peers(
    security: DeviceSecurity,
    *,
    user_id: Callable[[str], int | None],
    group_id: Callable[[str], int | None],
) -> tuple[tuple[PeerRule, ...], tuple[str, ...]]:
    """Pure (``user_id``/``group_id`` ask the device's databases; a number is itself): the
    baselines' ``ingress.users``/``groups`` as ids, and the names this device does not know
    (they let no one in: tighter, never looser)."""
    rules: list[PeerRule] = []
    problems: list[str] = []
    for users, groups in security.socket_peers:
        uids: set[int] = set()
        gids: set[int] = set()
        for kind, names, lookup, into in (
            ("user", users, user_id, uids),
            ("group", groups, group_id, gids),
        ):
            for name in names:
                found = int(name) if name.isdigit() else lookup(name)
                if found is None:
                    problems.append(
                        f"{kind} {name!r} (ingress.{kind}s) does not exist on this device"
                    )
                else:
                    into.add(found)
        rules.append(PeerRule(frozenset(uids), frozenset(gids)))
    return tuple(rules), tuple(problems)


def peer_allowed(rules: Iterable[PeerRule], *, uid: int, gids: Iterable[int], own_uid: int) -> bool:
    """Pure: whether a peer (its uid, primary and supplementary gids) may use infer.sock:
    edged's own user always; others when every rule names its uid or one of its groups."""
    if uid == own_uid:
        return True
    groups = set(gids)
    return all(uid in r.uids or not groups.isdisjoint(r.gids) for r in rules)


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
    if security.socket_peers and security.socket_mode is None:
        mode = PEER_CHECKED_SOCKET_MODE if group is None else mode  # edged checks each peer
    serve_tcp = tcp_port is not None
    if tcp_port is not None and security.socket_peers:
        serve_tcp = False
        problems.append(
            f"inference.listenTcp port {tcp_port} is not served: the SecurityBaseline "
            f"{', '.join(security.baselines)} names who may use the inference API "
            "(ingress.users, ingress.groups), which TCP cannot tell apart"
        )
    elif (
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
