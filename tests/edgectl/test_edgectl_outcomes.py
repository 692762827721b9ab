"""Honest replies under faults: how edgectl reports a call whose reply never came.

The decision (``edgectl.client.translate``) is a table; then the real ``edgectl apply`` against
a real hub (``hubserving.ThreadedHub``: mutual TLS, SQLite) through a TCP relay that passes the
whole request to the hub and then cuts the connection before any of the reply comes back: the
hub applied it, edgectl cannot know, and says exactly that (exit 3, how to check) instead of
"refused"; a hub that cannot be reached at all is "cannot reach" (exit 3, nothing done)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from hubserving import ThreadedHub, make_hub_dir

from edgectl.client import EXIT_REFUSED, EXIT_UNREACHABLE, translate

EDGECTL = str(Path(sys.executable).with_name("edgectl"))
C = grpc.StatusCode


@pytest.mark.parametrize(
    ("code", "details", "method", "exit_code", "words"),
    [
        (C.INVALID_ARGUMENT, "documents[0]: bad", "Apply", EXIT_REFUSED, "documents[0]"),
        (C.UNAVAILABLE, "Socket closed", "Apply", EXIT_UNREACHABLE, "the outcome is unknown"),
        (C.DEADLINE_EXCEEDED, "Deadline Exceeded", "Delete", EXIT_UNREACHABLE, "outcome"),
        (C.INTERNAL, "RST_STREAM", "PushArtifact", EXIT_UNREACHABLE, "edgectl get models"),
        (
            C.UNAVAILABLE,
            "failed to connect to all addresses; last error: Connection refused",
            "Apply",
            EXIT_UNREACHABLE,
            "cannot reach the hub",
        ),  # nothing was sent: nothing was done
        (C.UNAVAILABLE, "Socket closed", "List", EXIT_UNREACHABLE, "cannot reach the hub"),
        (C.INTERNAL, "oops", "Get", EXIT_REFUSED, "oops"),  # reads: nothing to be unknown
        (C.ABORTED, "changed concurrently", "Apply", EXIT_REFUSED, "changed concurrently"),
    ],
)
def test_translate_table(
    code: grpc.StatusCode, details: str, method: str, exit_code: int, words: str
) -> None:
    error = translate(code, details, "hub:7443", method)
    assert (error.exit_code, words in error.message) == (exit_code, True), error.message


class ReplyCutter:
    """Relays 127.0.0.1:port to a hub; once the client has sent ``after`` bytes (the request),
    nothing more comes back from the hub and both sides are closed shortly after."""

    def __init__(self, target: int, after: int) -> None:
        self.target, self.after = target, after
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            hub = socket.create_connection(("127.0.0.1", self.target))
            sent = threading.Event()
            threading.Thread(target=self._up, args=(client, hub, sent), daemon=True).start()
            threading.Thread(target=self._down, args=(hub, client, sent), daemon=True).start()

    def _up(self, client: socket.socket, hub: socket.socket, sent: threading.Event) -> None:
        total = 0
        try:
            while data := client.recv(65536):
                hub.sendall(data)
                total += len(data)
                if total >= self.after:
                    sent.set()
        except OSError:
            pass

    def _down(self, hub: socket.socket, client: socket.socket, sent: threading.Event) -> None:
        try:
            while not sent.is_set() and (data := hub.recv(65536)):
                if sent.is_set():
                    break
                client.sendall(data)
            threading.Event().wait(1.0)  # the hub gets the time to apply
        except OSError:
            pass
        for s in (client, hub):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # wakes the other relay thread too
            s.close()

    def close(self) -> None:
        self.listener.close()


def _config(hub_config: Path, port: int, tmp_path: Path) -> Path:
    text = hub_config.read_text()
    out = tmp_path / "via-relay.toml"
    lines = [f'hub = "127.0.0.1:{port}"' if line.startswith("hub =") else line
             for line in text.splitlines()]  # fmt: skip
    out.write_text("\n".join(lines) + "\n")
    return out


def test_a_lost_reply_is_reported_as_an_unknown_outcome(tmp_path: Path) -> None:
    import asyncio

    paths = asyncio.run(make_hub_dir(tmp_path / "hub"))
    annotation = "x" * 200_000  # the request is far bigger than the handshake
    manifest = tmp_path / "d.yaml"
    manifest.write_text(
        "apiVersion: edgefleet.io/v1\nkind: ModelDeployment\n"
        f"metadata: {{name: big, annotations: {{note: {annotation}}}}}\n"
        "spec: {model: {name: m, version: '1'}, replicas: {perDevice: 1}}\n"
    )
    with ThreadedHub(paths) as threaded:
        assert threaded.hub is not None
        relay = ReplyCutter(threaded.hub.port, after=200_000)
        try:
            config = _config(paths.admin_config, relay.port, tmp_path)
            out = subprocess.run(
                [EDGECTL, "--config", str(config), "apply", "-f", str(manifest)],
                capture_output=True, text=True, timeout=60, check=False, env=dict(os.environ),
            )  # fmt: skip
        finally:
            relay.close()
        assert out.returncode == EXIT_UNREACHABLE, out.stdout + out.stderr
        assert "the outcome is unknown" in out.stderr and "--dry-run" in out.stderr
        assert "Traceback" not in out.stderr
        hub = threaded.hub
        assert "big" in threaded.run(_deployments(hub))  # it was in fact applied

        # a hub that cannot be reached at all: nothing was sent, and edgectl says so
        dead = socket.create_server(("127.0.0.1", 0))
        port = dead.getsockname()[1]
        dead.close()
        out = subprocess.run(
            [EDGECTL, "--config", str(_config(paths.admin_config, port, tmp_path)), "apply",
             "-f", str(manifest)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert out.returncode == EXIT_UNREACHABLE
        assert "cannot reach the hub" in out.stderr and "unknown" not in out.stderr


async def _deployments(hub: object) -> set[str]:
    return set(hub.ctx.cache.deployments)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("code", "details", "method", "again"),
    [
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", "List", True),  # a read
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", "Apply", True),  # idempotent
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", "CreateToken", False),  # maybe done
        (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses", "CreateToken", True),
        (
            grpc.StatusCode.UNAVAILABLE,
            "this hub replica (h pid 1) does not lead; admin writes go to the leading replica",
            "PushArtifact",
            True,
        ),
        (  # a deposed leader's write, refused by its term's fence (docs/etcd.md): not done
            grpc.StatusCode.UNAVAILABLE,
            "the hub's store failed: replica r0 no longer leads (term 7 is over): controller "
            "write refused",
            "CreateToken",
            True,
        ),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", "List", False),
        (grpc.StatusCode.INVALID_ARGUMENT, "documents[0]: bad", "Apply", False),
    ],
)
def test_which_failed_calls_go_to_the_next_replica(
    code: grpc.StatusCode, details: str, method: str, again: bool
) -> None:
    from edgectl.client import outcome_unknown, try_next_replica

    assert try_next_replica(code, details, method) is again
    if "lead" in details:  # a follower's (or a deposed leader's) refusal: nothing was done
        assert not outcome_unknown(code, details, "h:1", method)


def test_a_context_keeps_every_replica_address(tmp_path: Path) -> None:
    import tomllib

    from edgectl.client import AdminConfig, parse_admin_config
    from edgectl.configuring import render

    replicas = AdminConfig(
        hub="a.example:7443",
        hubs=("a.example:7443", "b.example:7443"),
        ca_certificate=tmp_path / "ca.crt",
        certificate=tmp_path / "admin.crt",
        key=tmp_path / "admin.key",
    )
    text = render({"eu": replicas}, "eu")
    assert 'hub = ["a.example:7443", "b.example:7443"]' in text
    parsed = parse_admin_config(tomllib.loads(text), source="admin.toml", base=tmp_path)
    assert parsed.addresses == ("a.example:7443", "b.example:7443")
    with pytest.raises(Exception, match="hub"):
        parse_admin_config(
            {"hub": [], "caCertificate": "c", "certificate": "c", "key": "k"},
            source="admin.toml",
            base=tmp_path,
        )
