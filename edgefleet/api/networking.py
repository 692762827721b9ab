"""Network policy of inference workers: ``spec.network`` of a ModelDeployment and of a
SecurityBaseline.

Egress is enforced on the device by the kernel. An egress rule names a TCP port and, if it
says ``cidr``, the addresses (one address, ``127.0.0.1``, or a network, ``10.0.0.0/8``, IPv4
or IPv6) that port may be reached on::

    spec:
      network:
        egress:
          - port: 8080          # the local sensor service, on this address only
            cidr: 127.0.0.1
          - port: 443           # any address on port 443

Ports are enforced by Landlock's TCP rules (Linux 6.7+), which name ports only; a rule with
``cidr`` is enforced too by a cgroup BPF ``connect4``/``connect6`` program on the worker's
cgroup (edged as root: ``edged/runtime/egressfilter.py``). A device that cannot enforce a rule
does not start the worker (``NetworkPolicyUnenforceable``): never silently weaker. Host names
are refused (nothing resolves them at connect time).

In a ModelDeployment, ``egress`` is what the deployment's workers may connect to (nothing when
absent). In a SecurityBaseline, ``egress`` bounds what any deployment may ask for (absent: no
bound; ``[]``: no worker may connect anywhere): a deployment's rule is within a baseline's
when the baseline has a rule for its port whose addresses (all, when it has no ``cidr``)
contain the deployment's. A device refuses to start a worker whose deployment asks for more,
naming the rule.

``ingress`` (SecurityBaseline only: the inference API is one per device) says who may use it::

    spec:
      network:
        ingress:
          socketGroup: apps     # infer.sock's group (a name or a number) ...
          socketMode: "0660"    # ... and mode: the kernel checks both at connect()
          tcpPorts: [8000]      # the loopback ports edged may serve inference on ([]: none)
          users: [alice, 1001]  # who may use infer.sock: edged checks each connection's
          groups: [apps]        # SO_PEERCRED (a user listed, or a member of a group listed)

With ``users`` or ``groups``, edged refuses (HTTP 403) a connection to infer.sock from any
other user (edged's own user aside), and serves no TCP port (TCP cannot tell users apart).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from edgefleet.api.validating import Reader, int_in

MAX_EGRESS_RULES = 64

_port = int_in(1, 65535)


IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True, kw_only=True)
class EgressRule:
    """A TCP port, on the addresses of ``cidr`` (a network in its canonical form, such as
    ``127.0.0.1/32``; ``None``: every address)."""

    port: int
    cidr: str | None = None

    @property
    def network(self) -> IpNetwork | None:
        return None if self.cidr is None else ipaddress.ip_network(self.cidr)

    def covers(self, other: EgressRule) -> bool:
        """Whether this rule allows everything ``other`` allows."""
        if self.port != other.port:
            return False
        if self.cidr is None:
            return True
        mine, theirs = self.network, other.network
        if theirs is None or mine is None or mine.version != theirs.version:
            return False
        return theirs.subnet_of(mine)  # type: ignore[arg-type]

    def text(self) -> str:
        """``8080`` or ``8080 on 10.0.0.0/8`` (for messages)."""
        return str(self.port) if self.cidr is None else f"{self.port} on {self.cidr}"

    def to_dict(self) -> dict[str, Any]:
        return {"port": self.port} if self.cidr is None else {"port": self.port, "cidr": self.cidr}


def _rule_key(rule: EgressRule) -> tuple[int, int, str]:
    return (rule.port, 0 if rule.cidr is None else 1, rule.cidr or "")


def _cidr(value: object) -> str:
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError(f"must be an IP address or network as a string, got {value!r}")
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"must be an IP address or network such as 10.0.0.0/8: {exc}") from None
    return str(net)


@dataclass(frozen=True, slots=True, kw_only=True)
class IngressPolicy:
    """``spec.network.ingress`` of a SecurityBaseline; ``None`` fields are not set."""

    socket_group: str | None = None
    socket_mode: int | None = None
    tcp_ports: tuple[int, ...] | None = None
    users: tuple[str, ...] | None = None  # names or numbers
    groups: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.users is not None:
            out["users"] = list(self.users)
        if self.groups is not None:
            out["groups"] = list(self.groups)
        if self.socket_group is not None:
            out["socketGroup"] = self.socket_group
        if self.socket_mode is not None:
            out["socketMode"] = f"{self.socket_mode:04o}"
        if self.tcp_ports is not None:
            out["tcpPorts"] = list(self.tcp_ports)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkPolicy:
    """``spec.network``. ``egress`` ``None``: not given (a baseline sets no bound)."""

    egress: tuple[EgressRule, ...] | None = None
    ingress: IngressPolicy | None = None

    @property
    def egress_ports(self) -> tuple[int, ...]:
        return tuple(sorted({r.port for r in self.egress or ()}))

    @property
    def egress_addresses(self) -> bool:
        """Whether a rule names addresses (Landlock alone cannot enforce it)."""
        return any(r.cidr is not None for r in self.egress or ())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.egress is not None:
            out["egress"] = [r.to_dict() for r in self.egress]  # sorted by port when read
        if self.ingress is not None:
            out["ingress"] = self.ingress.to_dict()
        return out


def _group(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31:
        return str(value)
    if isinstance(value, str) and re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}\$?|[0-9]{1,10}", value):
        return value
    raise ValueError(f"must be a group name or number, got {value!r}")


def _user(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31:
        return str(value)
    if isinstance(value, str) and re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}\$?|[0-9]{1,10}", value):
        return value
    raise ValueError(f"must be a user name or number, got {value!r}")


MAX_PEERS = 256


def _socket_mode(value: object) -> int:
    if not isinstance(value, str) or not re.fullmatch(r"0?[0-7]{3}", value):
        raise ValueError(f'must be an octal mode as a string such as "0660", got {value!r}')
    mode = int(value, 8)
    if mode & 0o111:
        raise ValueError(f"must not have execute bits, got {value!r}")
    if not mode & 0o200:
        raise ValueError(f"must let edged's own user write (0200), got {value!r}")
    return mode


def _read_ingress(r: Reader | None) -> IngressPolicy | None:
    if r is None:
        return None
    ports = r.list_of("tcpPorts", _port, unique=True)
    if ports is not None and len(ports) > MAX_EGRESS_RULES:
        r.problems.add(r.at("tcpPorts"), f"at most {MAX_EGRESS_RULES}, got {len(ports)}")
    users = r.list_of("users", _user, unique=True)
    groups = r.list_of("groups", _group, unique=True)
    for name, items in (("users", users), ("groups", groups)):
        if items is not None and len(items) > MAX_PEERS:
            r.problems.add(r.at(name), f"at most {MAX_PEERS}, got {len(items)}")
    return IngressPolicy(
        socket_group=r.optional("socketGroup", _group, None),
        socket_mode=r.optional("socketMode", _socket_mode, None),
        tcp_ports=None if ports is None else tuple(sorted(ports)),
        users=None if users is None else tuple(sorted(users)),
        groups=None if groups is None else tuple(sorted(groups)),
    )


def read_network(r: Reader | None, *, ingress: bool = False) -> NetworkPolicy | None:
    """``spec.network`` (``None`` when absent); every problem goes to ``r.problems``.
    ``ingress``: the document may say who uses the inference API (a SecurityBaseline)."""
    if r is None:
        return None
    ingress_policy = None
    if ingress:
        ingress_policy = _read_ingress(r.section("ingress"))
    elif r.has("ingress"):
        r.problems.add(
            r.at("ingress"),
            "set in a SecurityBaseline: the inference API is one per device, not per deployment",
        )
    if not r.has("egress"):
        return NetworkPolicy(ingress=ingress_policy)
    items = r.items("egress")
    if len(items) > MAX_EGRESS_RULES:
        r.problems.add(r.at("egress"), f"at most {MAX_EGRESS_RULES} rules, got {len(items)}")
    rules: list[EgressRule] = []
    seen: set[tuple[int, str | None]] = set()
    for path, item in items[:MAX_EGRESS_RULES]:
        rule = r.problems.reader(item, path)
        if rule is None:
            continue
        if rule.has("host"):
            rule.problems.add(
                rule.at("host"),
                "not supported yet: host names are not resolved at connect time; give the "
                "addresses in cidr",
            )
        for name in ("address", "to"):
            if rule.has(name):
                rule.problems.add(
                    rule.at(name), "not a field of an egress rule: give the addresses in cidr"
                )
        cidr = rule.optional("cidr", _cidr, None)
        port = rule.required("port", _port, None)
        if port is None:
            continue
        if (port, cidr) in seen:
            what = f"port {port}" + ("" if cidr is None else f" on {cidr}")
            rule.problems.add(rule.at("port"), f"{what} is listed twice")
            continue
        seen.add((port, cidr))
        rules.append(EgressRule(port=port, cidr=cidr))
    return NetworkPolicy(egress=tuple(sorted(rules, key=_rule_key)), ingress=ingress_policy)


def egress_beyond(
    asked: NetworkPolicy | None, bound: Iterable[EgressRule] | None
) -> tuple[EgressRule, ...]:
    """Pure: the rules of ``asked`` that no rule of ``bound`` (a baseline's egress, or several
    baselines' together: :func:`intersect_egress`) covers. ``None``: no bound."""
    if bound is None:
        return ()
    allowed = tuple(bound)
    return tuple(
        r for r in (asked.egress or () if asked else ()) if not any(b.covers(r) for b in allowed)
    )


def intersect_egress(a: Iterable[EgressRule], b: Iterable[EgressRule]) -> tuple[EgressRule, ...]:
    """Pure: what both bounds allow. Two networks are either nested or disjoint, so each pair
    of rules for one port gives the narrower one, or nothing."""
    out: set[EgressRule] = set()
    bs = tuple(b)
    for x in a:
        for y in bs:
            if x.covers(y):
                out.add(y)
            elif y.covers(x):
                out.add(x)
    return tuple(sorted(out, key=_rule_key))
