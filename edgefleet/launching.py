"""Starting edgefleet programs on this machine: free loopback ports for a hub, and the one
helper that starts edged processes (used by the quickstart, the tests and the benchmarks)."""

from __future__ import annotations


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A free port P on ``host`` with P + 1 free too: a hub's mTLS port and its enrollment port
    (the quickstart, benchmarks and tests run hubs on loopback). A later bind may still lose a
    race for them; callers start the hub right away."""
    import socket

    for _ in range(100):
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port >= 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind((host, port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no two free consecutive ports on {host}")
