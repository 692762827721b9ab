"""Hub replicas on one etcd store: what ``hub serve`` adds when its store is etcd.

Every replica serves device streams (its devices' records go to the store through its own
device writer), enrollment and admin reads. One replica leads (:mod:`hub.store.electing`):

* the controllers (projection, rollouts, lifecycle, compaction) run only on the leader, each
  writing through a :class:`~hub.store.electing.FencedStore`;
* admin writes (apply, delete, cordon, revoke, push, tokens, rollout actions) are served by the
  leader only: a follower refuses them with UNAVAILABLE naming the leader (:class:`LeaderWrites`),
  so that every change the controllers act on is made where they run;
* a replica that becomes leader first reloads its cache from the store (:func:`reload_cache`),
  as the previous leader may have changed anything since this replica started; then the
  controllers project everything again.

Not built yet: followers' caches following the store by a watch (a follower's admin reads
show what it loaded at start plus its own devices), and devices and edgectl failing over
between replicas' addresses.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from edgefleet.logs import get_logger
from hub.caching import Cache
from hub.sessions import Sessions
from hub.store.electing import Elector
from hub.store.protocol import Store

log = get_logger(__name__)

ADMIN_WRITES = frozenset(
    f"/edgefleet.v1.AdminService/{m}"
    for m in (
        "Apply",
        "Delete",
        "Cordon",
        "Uncordon",
        "RevokeDevice",
        "PushArtifact",
        "CreateToken",
        "RolloutAction",
    )
)
"""AdminService methods that write: served by the leading replica only."""


def replica_identity(listen: str = "") -> str:
    """Who a replica is, in the leader key: host, process and (when known) address."""
    where = f" {listen}" if listen else ""
    return f"{socket.gethostname()} pid {os.getpid()}{where}"


async def reload_cache(cache: Cache, store: Store, sessions: Sessions) -> None:
    """Replace ``cache``'s contents (in place: every component holds it) with the store's,
    except the records of devices connected to this replica (its own are newer)."""
    fresh = await Cache.load(store)
    for name, device in cache.devices.items():
        if sessions.get(name) is not None:
            fresh.devices[name] = device
    for f in dataclasses.fields(Cache):
        if f.name != "trust_roots":  # installed from the data directory, not the store
            setattr(cache, f.name, getattr(fresh, f.name))
    log.info("cache reloaded", devices=len(cache.devices), deployments=len(cache.deployments))


class LeaderWrites(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses admin writes on a replica that does not lead (UNAVAILABLE, naming the leader)."""

    def __init__(self, elector: Elector) -> None:
        self.elector = elector

    def _message(self) -> str:
        leader = self.elector.leader or "none yet (an election is under way)"
        return (
            f"this hub replica ({self.elector.identity}) does not lead; admin writes go to the "
            f"leading replica: {leader}"
        )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or str(details.method) not in ADMIN_WRITES or self.elector.leading:
            return handler
        message = self._message()

        async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)

        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
        return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)
