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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from edged.runtime.launching import SandboxSpec
from edgefleet.api import ModelDeployment, SecurityBaseline
from edgefleet.api.networking import EgressRule, NetworkPolicy, egress_beyond

CPU_ONLY_PROVIDERS = frozenset({"CPUExecutionProvider", "XnnpackExecutionProvider"})


@dataclass(frozen=True, slots=True)
class DeviceSecurity:
    """What this device's config and the accepted baselines say about worker sandboxes."""

    sandbox: str = "landlock"
    seccomp: bool = True
    require_sandbox: bool = False
    egress_bound: tuple[int, ...] | None = None  # None: no baseline bounds egress
    baselines: tuple[str, ...] = ()  # names, for messages

    def with_baselines(self, baselines: Iterable[SecurityBaseline]) -> DeviceSecurity:
        """This device's settings under ``baselines`` (replacing any it held)."""
        items = sorted(baselines, key=lambda b: b.name)
        bound: set[int] | None = None
        for b in items:
            net = b.spec.network
            if net is not None and net.egress is not None:
                ports = set(net.egress_ports)
                bound = ports if bound is None else bound & ports
        return DeviceSecurity(
            sandbox=self.sandbox,
            seccomp=self.seccomp,
            require_sandbox=any(b.spec.require_sandbox for b in items),
            egress_bound=None if bound is None else tuple(sorted(bound)),
            baselines=tuple(b.name for b in items),
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
    if security.egress_bound is not None:
        bound = NetworkPolicy(egress=tuple(EgressRule(port=p) for p in security.egress_bound))
        beyond = egress_beyond(network, bound)
        if beyond:
            allowed = ", ".join(map(str, security.egress_bound)) or "none"
            refused = (
                f"spec.network.egress asks for port {', '.join(map(str, beyond))}, which the "
                f"SecurityBaseline {', '.join(security.baselines)} does not allow "
                f"(allowed: {allowed})"
            )
    mode = "landlock" if security.require_sandbox else security.sandbox
    needs_devices = any(p not in CPU_ONLY_PROVIDERS for p in providers)
    return SandboxSpec(
        mode=mode,
        required=security.require_sandbox,
        network=network is not None and network.egress is not None,
        connect_ports=ports,
        device_paths=tuple(device_paths) if needs_devices else (),
        seccomp=security.seccomp and mode != "off",
        refused=refused,
    )
