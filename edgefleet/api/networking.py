"""Network policy of inference workers: ``spec.network`` of a ModelDeployment and of a
SecurityBaseline.

Egress is enforced on the device by the kernel (Landlock TCP rules, Linux 6.7+), which names
TCP *ports*, never addresses: a rule for port 8080 lets the worker connect to 8080 on every
address. So an egress rule is a port, and a rule that names a host is refused as "not
supported yet" rather than enforced more loosely than it reads::

    spec:
      network:
        egress:
          - port: 8080          # the local sensor service; any address on that port

In a ModelDeployment, ``egress`` is what the deployment's workers may connect to (nothing when
absent). In a SecurityBaseline, ``egress`` bounds what any deployment may ask for (absent: no
bound; ``[]``: no worker may connect anywhere); a device refuses to start a worker whose
deployment asks for more, naming the port.

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

import re
from dataclasses import dataclass
from typing import Any

from edgefleet.api.validating import Reader, int_in

MAX_EGRESS_RULES = 64

_port = int_in(1, 65535)


@dataclass(frozen=True, slots=True, kw_only=True)
class EgressRule:
    port: int

    def to_dict(self) -> dict[str, Any]:
        return {"port": self.port}


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
    seen: set[int] = set()
    for path, item in items[:MAX_EGRESS_RULES]:
        rule = r.problems.reader(item, path)
        if rule is None:
            continue
        for name in ("host", "address", "cidr", "to"):
            if rule.has(name):
                rule.problems.add(
                    rule.at(name),
                    "not supported yet: the kernel enforces egress by TCP port only (Landlock "
                    "rules name ports, not addresses), so a rule naming an address would allow "
                    "that port on every address; give only the port",
                )
        port = rule.required("port", _port, None)
        if port is None:
            continue
        if port in seen:
            rule.problems.add(rule.at("port"), f"port {port} is listed twice")
            continue
        seen.add(port)
        rules.append(EgressRule(port=port))
    return NetworkPolicy(
        egress=tuple(sorted(rules, key=lambda rule: rule.port)), ingress=ingress_policy
    )


def egress_beyond(asked: NetworkPolicy | None, bound: NetworkPolicy | None) -> tuple[int, ...]:
    """Pure: the ports ``asked`` wants that ``bound`` (a baseline's policy) does not allow."""
    if bound is None or bound.egress is None:
        return ()
    allowed = set(bound.egress_ports)
    return tuple(p for p in (asked.egress_ports if asked else ()) if p not in allowed)
