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
"""

from __future__ import annotations

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
class NetworkPolicy:
    """``spec.network``. ``egress`` ``None``: not given (a baseline sets no bound)."""

    egress: tuple[EgressRule, ...] | None = None

    @property
    def egress_ports(self) -> tuple[int, ...]:
        return tuple(sorted({r.port for r in self.egress or ()}))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.egress is not None:
            out["egress"] = [r.to_dict() for r in self.egress]  # sorted by port when read
        return out


def read_network(r: Reader | None) -> NetworkPolicy | None:
    """``spec.network`` (``None`` when absent); every problem goes to ``r.problems``."""
    if r is None:
        return None
    if not r.has("egress"):
        return NetworkPolicy()
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
    return NetworkPolicy(egress=tuple(sorted(rules, key=lambda rule: rule.port)))


def egress_beyond(asked: NetworkPolicy | None, bound: NetworkPolicy | None) -> tuple[int, ...]:
    """Pure: the ports ``asked`` wants that ``bound`` (a baseline's policy) does not allow."""
    if bound is None or bound.egress is None:
        return ()
    allowed = set(bound.egress_ports)
    return tuple(p for p in (asked.egress_ports if asked else ()) if p not in allowed)
