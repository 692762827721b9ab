"""edged: the edgefleet device daemon."""

import os

# edged starts its inference workers (fork + exec, through libuv) while it holds a live gRPC
# channel to its hub. With gRPC's fork support on, its fork handlers run in the child between
# fork and exec and abort about one start in five (ev_epoll1_linux.cc: "Check failed:
# next_worker->state == KICKED"), and each abort counts toward the crash-loop backoff. A
# worker execs at once and needs nothing of gRPC, so fork support is off, before anything in
# edged imports grpc (this package is imported first by `python -m edged` and the `edged`
# script). tests/e2e/test_worker_starts.py starts workers during a live Sync stream.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "0"


def __getattr__(name: str) -> str:
    """``edged.__version__``, read when asked (importlib.metadata is not free): edged.launcher
    imports this package too and starts before anything else on a device."""
    if name == "__version__":
        from edgefleet.versioning import installed_version

        version = installed_version()
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module 'edged' has no attribute {name!r}")
