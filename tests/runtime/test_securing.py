"""What sandbox a worker gets (pure tables): config, baselines and the deployment in, a
SandboxSpec out; and the pieces of the sandbox that are pure (paths, the seccomp program)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from edged.runtime.launching import LaunchSpec, LimitsSpec, SandboxSpec
from edged.runtime.sandboxing import runtime_read_paths
from edged.runtime.seccomp import RET_ALLOW, SeccompUnsupported, build_filter
from edged.runtime.securing import (
    DeviceSecurity,
    IngressPlan,
    PeerRule,
    choose_sandbox,
    outdated_sandboxes,
    peer_allowed,
    plan_ingress,
    resolve_peers,
)
from edgefleet.api import ModelDeployment, SecurityBaseline, parse_manifest
from edgefleet.errors import ValidationError


def deployment(network: dict[str, Any] | None = None) -> ModelDeployment:
    spec: dict[str, Any] = {"model": {"name": "m", "version": "1", "path": "m.onnx"}}
    if network is not None:
        spec["network"] = network
    doc = {"apiVersion": "edgefleet.io/v1", "kind": "ModelDeployment",
           "metadata": {"name": "m"}, "spec": spec}  # fmt: skip
    manifest = parse_manifest(doc)
    assert isinstance(manifest, ModelDeployment)
    return manifest


def baseline(name: str, **spec: Any) -> SecurityBaseline:
    doc = {"apiVersion": "edgefleet.io/v1", "kind": "SecurityBaseline",
           "metadata": {"name": name}, "spec": spec}  # fmt: skip
    manifest = parse_manifest(doc)
    assert isinstance(manifest, SecurityBaseline)
    return manifest


CPU = ("CPUExecutionProvider",)
DEVICE = DeviceSecurity()


def bound(*rules: dict) -> DeviceSecurity:
    """DEVICE under one baseline "b" whose egress is ``rules``."""
    return DEVICE.with_baselines([baseline("b", network={"egress": list(rules)})])


LOOPBACK_8080 = {"port": 8080, "cidr": "127.0.0.0/8"}


@pytest.mark.parametrize(
    ("network", "security", "expected"),
    [
        # on by default, no network
        (None, DEVICE, SandboxSpec(mode="landlock", seccomp=True)),
        # the deployment grants a port: the TCP rules must be in force
        ({"egress": [{"port": 8080}]}, DEVICE,
         SandboxSpec(mode="landlock", network=True, connect_ports=(8080,), seccomp=True)),
        # an explicit "no egress" is a policy too
        ({"egress": []}, DEVICE, SandboxSpec(mode="landlock", network=True, seccomp=True)),
        # edged.toml turned it off
        (None, DeviceSecurity(sandbox="off"), SandboxSpec(mode="off")),
        # ... but a baseline that requires it wins
        (None, DeviceSecurity(sandbox="off").with_baselines([baseline("b", requireSandbox=True)]),
         SandboxSpec(mode="landlock", required=True, seccomp=True)),
        # within the baseline's bound
        ({"egress": [{"port": 8080}]},
         DEVICE.with_baselines([baseline("b", network={"egress": [{"port": 8080}]})]),
         SandboxSpec(mode="landlock", network=True, connect_ports=(8080,), seccomp=True)),
        # beyond it: refused, with the port, the baseline and what it allows
        ({"egress": [{"port": 22}, {"port": 8080}]},
         DEVICE.with_baselines([baseline("b", network={"egress": [{"port": 8080}]})]),
         SandboxSpec(mode="landlock", network=True, connect_ports=(22, 8080), seccomp=True,
                     refused="spec.network.egress asks for port 22, which the SecurityBaseline "
                     "b does not allow (allowed: 8080)")),
        # two baselines: only what both allow
        ({"egress": [{"port": 8080}]},
         DEVICE.with_baselines([baseline("a", network={"egress": [{"port": 8080}]}),
                                baseline("b", network={"egress": []})]),
         SandboxSpec(mode="landlock", network=True, connect_ports=(8080,), seccomp=True,
                     refused="spec.network.egress asks for port 8080, which the SecurityBaseline "
                     "a, b does not allow (allowed: none)")),
        # a rule naming addresses: every rule goes to the BPF program too
        ({"egress": [{"port": 8080, "cidr": "127.0.0.1"}, {"port": 443}]},
         bound({"port": 8080}, {"port": 443}),
         SandboxSpec(mode="landlock", network=True, connect_ports=(443, 8080), seccomp=True,
                     egress_rules=((443, ""), (8080, "127.0.0.1/32")))),
        # an address outside the baseline's network
        ({"egress": [{"port": 8080, "cidr": "10.0.0.5"}]},
         bound(LOOPBACK_8080),
         SandboxSpec(mode="landlock", network=True, connect_ports=(8080,), seccomp=True,
                     egress_rules=((8080, "10.0.0.5/32"),),
                     refused="spec.network.egress asks for port 8080 on 10.0.0.5/32, which the "
                     "SecurityBaseline b does not allow (allowed: 8080 on 127.0.0.0/8)")),
        # every address is more than the baseline's network
        ({"egress": [{"port": 8080}]},
         bound(LOOPBACK_8080),
         SandboxSpec(mode="landlock", network=True, connect_ports=(8080,), seccomp=True,
                     refused="spec.network.egress asks for port 8080, which the "
                     "SecurityBaseline b does not allow (allowed: 8080 on 127.0.0.0/8)")),
        # two baselines: the narrower network of each pair
        ({"egress": [{"port": 8080, "cidr": "10.1.2.3"}, {"port": 8080, "cidr": "10.2.0.1"}]},
         DEVICE.with_baselines([
             baseline("a", network={"egress": [{"port": 8080, "cidr": "10.0.0.0/8"}]}),
             baseline("b", network={"egress": [{"port": 8080, "cidr": "10.1.0.0/16"},
                                               {"port": 9}]}),
         ]),
         SandboxSpec(mode="landlock", network=True, connect_ports=(8080,), seccomp=True,
                     egress_rules=((8080, "10.1.2.3/32"), (8080, "10.2.0.1/32")),
                     refused="spec.network.egress asks for port 8080 on 10.2.0.1/32, which the "
                     "SecurityBaseline a, b does not allow (allowed: 8080 on 10.1.0.0/16)")),
    ],
)  # fmt: skip
def test_choose_sandbox(network, security: DeviceSecurity, expected: SandboxSpec) -> None:
    # edged is not root in these rows (the uid rows: test_separate_uids below)
    expected = replace(expected, uid_note="edged is not root")
    assert choose_sandbox(deployment(network), CPU, security) == expected


ROOT = DeviceSecurity(edged_root=True)
REQUIRED = [baseline("b", requireSandbox=True)]


@pytest.mark.parametrize(
    ("security", "separate", "note"),
    [
        # edged is root: a uid of its own per worker, by default
        (ROOT, True, ""),
        # turned off in edged.toml...
        (DeviceSecurity(edged_root=True, separate_uids=False), False,
         "turned off ([workers] separateUids = false)"),
        # ... unless a baseline requires the sandbox
        (DeviceSecurity(edged_root=True, separate_uids=False).with_baselines(REQUIRED), True, ""),
        # edged is not root: its workers are not either, and keep its uid, whatever is asked
        (DEVICE, False, "edged is not root"),
        (DEVICE.with_baselines(REQUIRED), False, "edged is not root"),
        # the sandbox off in edged.toml does not turn the uid off
        (DeviceSecurity(sandbox="off", edged_root=True), True, ""),
    ],
)  # fmt: skip
def test_separate_uids(security: DeviceSecurity, separate: bool, note: str) -> None:
    spec = choose_sandbox(deployment(), CPU, security)
    assert (spec.separate_uid, spec.uid_note) == (separate, note)


def test_accelerator_nodes_only_for_accelerator_providers() -> None:
    nodes = ("/dev/nvidia0", "/dev/nvidiactl")
    cpu = choose_sandbox(deployment(), CPU, DEVICE, device_paths=nodes)
    cuda = choose_sandbox(deployment(), ("CUDAExecutionProvider", *CPU), DEVICE, device_paths=nodes)
    assert cpu.device_paths == () and cuda.device_paths == nodes


def test_a_host_in_an_egress_rule_is_refused_not_loosened() -> None:
    with pytest.raises(ValidationError) as info:
        deployment({"egress": [{"host": "10.0.0.5", "port": 5432}]})
    assert [p.path for p in info.value.problems] == ["spec.network.egress[0].host"]
    assert "not supported yet" in info.value.problems[0].message


def test_network_changes_the_revision_and_its_absence_does_not() -> None:
    from edged.workloads import DesiredWorkload

    plain = DesiredWorkload(deployment(), "ab" * 32, "f.yaml")
    assert "network" not in deployment().to_dict()["spec"]
    granted = DesiredWorkload(deployment({"egress": [{"port": 8080}]}), "ab" * 32, "f.yaml")
    assert plain.revision != granted.revision


def test_launch_spec_round_trips_with_its_sandbox() -> None:
    spec = LaunchSpec(
        replica_id="r", workload="w", model_name="m", model_version="1", artifact_path="/a",
        artifact_sha256="00", providers=CPU, intra_op_threads=1, max_batch_size=1,
        max_queue_delay_s=0.0, limits=LimitsSpec(),
        sandbox=SandboxSpec(mode="landlock", connect_ports=(1, 2), device_paths=("/dev/x",)),
    )  # fmt: skip
    import orjson

    assert LaunchSpec.from_json(orjson.loads(orjson.dumps(spec.to_json()))) == spec


def test_runtime_paths_never_include_the_working_directory_or_the_root() -> None:
    paths = runtime_read_paths(
        path=["/srv/app", "", "relative", "/", "/opt/py/lib/python3.11", "/opt/py/lib/python3.11/"],
        cwd="/srv/app",
        prefixes=["/opt/py/lib/python3.11"],
        package_root="/opt/edged",
    )
    assert paths == ["/opt/py/lib/python3.11", "/opt/edged"]


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_seccomp_program_jumps_stay_inside_it(machine: str) -> None:
    program = build_filter(machine)
    assert len(program) < 64  # cheap: a few dozen instructions per system call
    for i, (code, jt, jf, _) in enumerate(program):
        if code & 0x07 == 0x05:  # BPF_JMP
            assert i + 1 + max(jt, jf) < len(program)
    assert program[-1][3] != RET_ALLOW  # the last word is the denial


def test_seccomp_has_no_program_for_unknown_machines() -> None:
    with pytest.raises(SeccompUnsupported):
        build_filter("mips")


def test_the_package_root_is_read_even_when_it_is_the_working_directory() -> None:
    paths = runtime_read_paths(
        path=["/srv/app"], cwd="/srv/app", prefixes=[], package_root="/srv/app"
    )
    assert paths == ["/srv/app"]


def ingress(**network: Any) -> DeviceSecurity:
    return DEVICE.with_baselines([baseline("fleet", network={"ingress": network})])


def exists(group: str) -> bool:
    return group in {"apps", "42"}


@pytest.mark.parametrize(
    ("security", "tcp_port", "expected"),
    [
        (DEVICE, None, IngressPlan(None, 0o660, False)),
        (DEVICE, 8000, IngressPlan(None, 0o660, True)),
        (ingress(socketGroup="apps", socketMode="0620"), None, IngressPlan("apps", 0o620, False)),
        (ingress(tcpPorts=[8000]), 8000, IngressPlan(None, 0o660, True)),
        (ingress(tcpPorts=[]), 8000, IngressPlan(None, 0o660, False, (
            "inference.listenTcp port 8000 is not allowed by the SecurityBaseline fleet "
            "(tcpPorts: none): not served",))),
        # a group this device does not have: tighter, never looser
        (ingress(socketGroup="nobody-here"), None, IngressPlan(None, 0o600, False, (
            "group 'nobody-here' does not exist on this device: only edged's own user may use "
            "infer.sock",))),
        # users named: the kernel lets all connect, edged checks each; TCP cannot tell who
        (ingress(users=["alice"]), 8000, IngressPlan(None, 0o666, False, (
            "inference.listenTcp port 8000 is not served: the SecurityBaseline fleet names who "
            "may use the inference API (ingress.users, ingress.groups), which TCP cannot tell "
            "apart",))),
        (ingress(groups=["apps"], socketMode="0660"), None, IngressPlan(None, 0o660, False)),
        (DEVICE.with_baselines([baseline("a", network={"ingress": {"socketGroup": "apps"}}),
                                baseline("b", network={"ingress": {"socketGroup": "42"}})]),
         None, IngressPlan(None, 0o600, False, (
             "baselines name different groups for infer.sock (42, apps): only edged's own user "
             "may use it",))),
    ],
)  # fmt: skip
def test_plan_ingress(security: DeviceSecurity, tcp_port: int | None, expected) -> None:
    assert plan_ingress(security, tcp_port=tcp_port, group_exists=exists) == expected


@pytest.mark.parametrize(
    ("network", "path"),
    [
        ({"ingress": {"tcpPorts": [8000]}}, "spec.network.ingress"),  # a deployment: refused
    ],
)
def test_ingress_belongs_to_baselines(network: dict[str, Any], path: str) -> None:
    with pytest.raises(ValidationError) as info:
        deployment(network)
    assert [p.path for p in info.value.problems] == [path]


@pytest.mark.parametrize(
    ("ingress_doc", "problem"),
    [
        ({"socketMode": "0777"}, "spec.network.ingress.socketMode: must not have execute bits"),
        ({"socketMode": "0440"}, "spec.network.ingress.socketMode: must let edged's own user"),
        ({"socketMode": 660}, "spec.network.ingress.socketMode: must be an octal mode"),
        ({"socketGroup": "Bad Group"}, "spec.network.ingress.socketGroup: must be a group"),
        ({"tcpPorts": [70000]}, "spec.network.ingress.tcpPorts[0]: must be"),
        ({"users": ["Bad User"]}, "spec.network.ingress.users[0]: must be a user name"),
        ({"groups": [True]}, "spec.network.ingress.groups[0]: must be a group"),
    ],
)
def test_ingress_problems(ingress_doc: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as info:
        baseline("b", network={"ingress": ingress_doc})
    assert any(str(p).startswith(problem) for p in info.value.problems), info.value.problems


def test_ingress_is_canonical() -> None:
    b = baseline("b", network={"ingress": {"socketGroup": "apps", "socketMode": "660",
                                           "tcpPorts": [9000, 8000]}})  # fmt: skip
    assert b.to_dict()["spec"]["network"] == {
        "ingress": {"socketGroup": "apps", "socketMode": "0660", "tcpPorts": [8000, 9000]}
    }
    assert parse_manifest(b.to_dict()) == b


def test_outdated_sandboxes_are_those_that_differ() -> None:
    a, b = SandboxSpec(mode="landlock"), SandboxSpec(mode="landlock", required=True)
    assert outdated_sandboxes([("r0", a, a), ("r1", a, b)]) == ["r1"]


def test_one_baseline_requiring_the_open_watch_is_enough() -> None:
    plain = baseline("a", drift={"action": "alert"})
    strict = baseline("b", drift={"action": "quarantine", "period": "10s",
                                  "requireOpenWatch": True})  # fmt: skip
    assert not DEVICE.with_baselines([plain]).require_open_watch
    both = DEVICE.with_baselines([plain, strict])
    assert both.require_open_watch and both.drift_action == "quarantine"
    assert strict.to_dict()["spec"]["drift"] == {
        "action": "quarantine",
        "period": "10s",
        "requireOpenWatch": True,
    }
    assert "requireOpenWatch" not in plain.to_dict()["spec"]["drift"]
    with pytest.raises(ValidationError, match=r"spec\.drift\.requireOpenWatch"):
        baseline("c", drift={"requireOpenWatch": "yes please"})


def test_peers_resolve_and_every_baseline_must_allow() -> None:
    security = DEVICE.with_baselines([
        baseline("a", network={"ingress": {"users": ["alice", 1001], "groups": ["apps"]}}),
        baseline("b", network={"ingress": {"users": ["ghost"], "groups": ["apps", "42"]}}),
    ])  # fmt: skip
    users = {"alice": 1000}.get
    groups = {"apps": 500}.get
    rules, problems = resolve_peers(security, user_id=users, group_id=groups)
    assert rules == (PeerRule(frozenset({1000, 1001}), frozenset({500})),
                     PeerRule(frozenset(), frozenset({42, 500})))  # fmt: skip
    assert problems == ("user 'ghost' (ingress.users) does not exist on this device",)

    def allowed(uid: int, *gids: int) -> bool:
        return peer_allowed(rules, uid=uid, gids=gids, own_uid=0)

    assert allowed(0)  # edged's own user
    assert allowed(1000, 500)  # named by a, in a group of b
    assert not allowed(1000, 1000)  # a allows, b does not
    assert allowed(7, 7, 42, 500)  # in a group each allows (supplementary groups count)
    assert not allowed(1001, 1001)
    assert peer_allowed((), uid=9, gids=(), own_uid=0)  # no rules: the socket's mode decides
