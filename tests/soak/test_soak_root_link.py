"""The region's link to its root cut as a WAN is (soaknet.RootLink, docs/soak.md): a real root
and a real regional hub, the region dialling its root across a veth into a namespace the test
makes; the cut takes the far side of the veth down, so the region's packets are dropped, not
refused. The region must notice by its own keepalive (hub.controllers.parentlink: a 20 s ping, 10 s
to answer, which gRPC also sets as the socket's TCP_USER_TIMEOUT), the root by its server's
(hub.server: 60 s, 20 s), and the link must come back when the veth does. The root's
loopback, where the operator calls it, is not cut."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from fleet import HubProcess
from harness import wait_for
from soakfleet import NsHubProcess
from soaknet import ReplicaNet, make_replica, make_root_link

from hub.controllers.parentlink.link import CHANNEL_OPTIONS
from hub.server import SERVER_OPTIONS


def notice_bound(options: list[tuple[str, int]]) -> float:
    """Seconds within which a gRPC side with these ``options`` ends a stream gone silent, as
    they state it: its keepalive time (counted from the last bytes it read) plus its keepalive
    timeout. gRPC times the ping out by ``grpc.http2.ping_timeout_ms`` (60 s unless set), so
    each side sets that to its keepalive timeout: unset, the region took 76-80 s and the root
    118-121 s here, and this test failed."""
    values = dict(options)
    return (values["grpc.keepalive_time_ms"] + values["grpc.keepalive_timeout_ms"]) / 1000


# the stated bounds, with 30 s of slack for a loaded machine; the region's reconnection backoff
# is at most 30 s once the link is back
REGION_NOTICES_S = notice_bound(CHANNEL_OPTIONS)  # 30 s
ROOT_NOTICES_S = notice_bound(SERVER_OPTIONS)  # 80 s
SLACK_S = 30.0
RECONNECT_S = 30.0 + SLACK_S


def region_status(root: HubProcess) -> dict[str, Any]:
    """``edgectl get region eu`` at the root, over the loopback the cut leaves alone."""
    status: dict[str, Any] = json.loads(root.edgectl("get", "region", "eu", "-o", "json").stdout)[
        "status"
    ]
    return status


def lost_lines(log: Path, start: int) -> list[str]:
    return [x for x in log.read_text()[start:].splitlines() if "parent link lost" in x]


@pytest.mark.scenario
@pytest.mark.timeout(420)
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@pytest.mark.parametrize("where", ["host", "namespace"])
def test_a_cut_root_link_drops_the_regions_packets_and_heals(tmp_path: Path, where: str) -> None:
    """``where`` the region runs: on the host (as eu-r0), or in a namespace of its own (as
    eu-r1), reaching the link's address through a relay in that namespace."""
    root = HubProcess(tmp_path / "root", tmp_path / "root.log")
    link = make_root_link(f"soakt{os.getpid()}-root-link", root.port)
    assert not isinstance(link, str), link  # as root, the namespace must be made
    eu = NsHubProcess(tmp_path / "eu", tmp_path / "eu.log")
    nets: list[ReplicaNet] = []
    try:
        root.init("--region", "root", "--san", link.ip).start()
        token, pin = root.token("--for-region", "eu")
        eu.init("--region", "eu", "--parent", root.address, "--token", token,
                "--parent-ca-hash", pin)  # fmt: skip
        parent = eu.data / "parent.json"
        doc = json.loads(parent.read_text())
        doc["parent"] = link.address  # the region dials its root across the veth
        parent.write_text(json.dumps(doc))
        if where == "namespace":
            net = make_replica(f"soakt{os.getpid()}-eu", tmp_path, [], inward=[],
                               exposed=[eu.port, eu.port + 1],
                               outward=[(link.ip, link.root_port)])  # fmt: skip
            assert not isinstance(net, str), net
            nets.append(net)
            eu.python = net.wrapper
        eu.start()
        wait_for(lambda: region_status(root)["connected"], 60, "eu to connect to its root")
        assert region_status(root)["streamsHere"]

        mark = len(eu.log.read_text())
        cut_at = time.monotonic()
        link.cut()
        # the region: its stream stalls and its keepalive ends it; a reset would say so
        wait_for(lambda: lost_lines(eu.log, mark), REGION_NOTICES_S + SLACK_S,
                 "the region to notice its root gone")  # fmt: skip
        region_noticed = time.monotonic() - cut_at
        first = lost_lines(eu.log, mark)[0]
        assert "UNAVAILABLE" in first, first
        # gRPC's keepalive (its ping unanswered) or the TCP_USER_TIMEOUT it sets to the same
        # timeout on the socket ("Connection timed out"): unsent data or an unanswered ping
        assert re.search(r"keepalive|timed out|[Tt]imeout", first), first
        assert not re.search(r"reset|[Rr]efused|unreachable", first), first
        # the root: still answering the operator on its loopback; the region shown cut off
        # once its server's keepalive gives up on the stalled stream
        wait_for(lambda: not region_status(root)["connected"], ROOT_NOTICES_S + SLACK_S,
                 "the root to show eu disconnected")  # fmt: skip
        root_noticed = time.monotonic() - cut_at

        healed_at = time.monotonic()
        link.heal()
        wait_for(lambda: region_status(root)["connected"], RECONNECT_S,
                 "eu to connect again once the link is back")  # fmt: skip
        print(
            f"region noticed after {region_noticed:.1f} s, root after {root_noticed:.1f} s, "
            f"connected again {time.monotonic() - healed_at:.1f} s after the heal"
        )
    finally:
        eu.stop()
        root.stop()
        link.close()
        for net in nets:
            net.close()
