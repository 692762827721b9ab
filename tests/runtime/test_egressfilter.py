"""Egress rules that name addresses (``edged/runtime/egressfilter.py``): the BPF programs as
built (pure), and as this machine's kernel enforces them on a real process in a real cgroup v2
(loopback addresses: 127.0.0.1 allowed, 127.0.0.2 not, on the same listening port; IPv6 and
IPv4-mapped IPv6 too). Needs root and a cgroup v2 hierarchy; skipped, saying why, without."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edged.runtime import egressfilter
from edged.runtime.egressfilter import EgressFilterError, build_program

MOUNTINFO = """\
22 1 0:21 / /proc rw,nosuid - proc proc rw
35 25 0:30 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
37 35 0:32 / /sys/fs/cgroup/memory rw,nosuid shared:11 - cgroup cgroup rw,memory
"""


def test_the_cgroup_v2_mount_and_own_path_are_read_from_proc() -> None:
    assert egressfilter.cgroup2_mount(MOUNTINFO) == Path("/sys/fs/cgroup/unified")
    assert egressfilter.cgroup2_mount(MOUNTINFO.replace("cgroup2 cgroup2", "cgroup cgroup")) is None
    proc = "4:memory:/x\n0::/system.slice/edged.service\n"
    assert egressfilter.own_cgroup2(proc) == "/system.slice/edged.service"
    assert egressfilter.own_cgroup2("4:memory:/x\n") is None


def test_programs_are_small_and_bounded() -> None:
    # header loads (1 or 4 words + the port), per rule a port check, the address checks of
    # each non-zero mask word, allow; then deny
    v4 = build_program([(8080, "127.0.0.1/32"), (443, "")], 4)
    assert len(v4) // 8 == 2 + (1 + 3 + 2) + (1 + 2) + 2
    v6 = build_program([(8080, "127.0.0.1/32")], 6)  # as ::ffff:127.0.0.1/128: 4 words
    assert len(v6) // 8 == 5 + (1 + 4 * 3 + 2) + 2
    assert build_program([(8080, "fd00::/8")], 4) == build_program([], 4)  # v6 only
    with pytest.raises(EgressFilterError, match="at most 64"):
        build_program([(p, "") for p in range(1, 66)], 4)
    assert egressfilter.describe([(8080, "127.0.0.1/32"), (443, "")]) == (
        "127.0.0.1/32:8080",
        "*:443",
    )


def _unavailable() -> str:
    if os.geteuid() != 0:
        return "not root: cgroup BPF programs need CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN"
    try:
        egressfilter.egress_parent()
    except EgressFilterError as exc:
        return str(exc)
    return ""


@pytest.fixture
def cgroup_for(request: pytest.FixtureRequest) -> Iterator:
    if _unavailable():
        pytest.skip(_unavailable())
    made: list[Path] = []

    def make(rules: list[tuple[int, str]]) -> Path:
        path = egressfilter.prepare(f"test-{request.node.name[-40:]}-{len(made)}", rules)
        made.append(path)
        return path

    yield make
    for path in made:
        egressfilter.remove(str(path))
        assert not path.exists()


@pytest.fixture
def port() -> Iterator[int]:
    """A TCP port listening on every IPv4 and IPv6 loopback address."""
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", 0))
    s.listen(64)
    yield s.getsockname()[1]
    s.close()


def tries(cgroup: Path, targets: list[tuple[str, int]]) -> dict[str, str]:
    """A process joins ``cgroup`` and connects to each target: "ok" or the errno's name."""
    code = f"""
import errno, socket, sys
from edged.runtime import egressfilter
egressfilter.join({str(cgroup)!r})
for host, port in {targets!r}:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.settimeout(5)
        try:
            s.connect((host, port))
            print(host, port, "ok")
        except OSError as exc:
            print(host, port, errno.errorcode.get(exc.errno, exc.errno))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return {f"{h}:{p}": o for h, p, o in (line.split() for line in out.stdout.splitlines())}


def test_the_kernel_allows_only_the_rules_addresses(cgroup_for, port: int) -> None:
    other = port + 1 if port < 65535 else port - 1
    cg = cgroup_for([(port, "127.0.0.1/32"), (port, "::1/128")])
    got = tries(
        cg,
        [
            ("127.0.0.1", port),
            ("127.0.0.2", port),  # loopback too, listening: only the program says no
            ("::1", port),
            ("::ffff:127.0.0.1", port),  # a v4 rule covers its mapped v6 address ...
            ("::ffff:127.0.0.2", port),  # ... and a v6 socket is no way around it
            ("127.0.0.1", other),  # the port is the rule's too
        ],
    )
    assert got == {
        f"127.0.0.1:{port}": "ok",
        f"127.0.0.2:{port}": "EPERM",
        f"::1:{port}": "ok",
        f"::ffff:127.0.0.1:{port}": "ok",
        f"::ffff:127.0.0.2:{port}": "EPERM",
        f"127.0.0.1:{other}": "EPERM",
    }


def test_networks_and_port_only_rules(cgroup_for, port: int) -> None:
    other = port + 1 if port < 65535 else port - 1
    cg = cgroup_for([(port, "127.0.0.0/30"), (other, "")])
    got = tries(cg, [("127.0.0.3", port), ("127.0.0.4", port), ("127.0.0.9", other)])
    # .3 is in 127.0.0.0/30 (listening: ok); .4 is not; any address on the port-only rule
    # (nothing listens there: refused by the peer, not by the program)
    assert got == {
        f"127.0.0.3:{port}": "ok",
        f"127.0.0.4:{port}": "EPERM",
        f"127.0.0.9:{other}": "ECONNREFUSED",
    }


def test_no_rule_allows_nothing(cgroup_for, port: int) -> None:
    cg = cgroup_for([])
    assert set(tries(cg, [("127.0.0.1", port), ("::1", port)]).values()) == {"EPERM"}
