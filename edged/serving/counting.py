"""edged's own counts of what it serves (docs/edged.md, "Serving"): the Prometheus
metrics of the replicas, of the desired state and of each socket's limits, and the
per-revision measures the hub reads (:class:`edged.serving.measuring.RevisionMeters`).

:class:`Counters` is told what happened (a request answered or refused, a replica restarted or
changing readiness, batches run, work overlapped with them, the answers a worker reports) and
keeps every count that depends on it; gauges of state are read when scraped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from edged.runtime.httpserver import HttpServer
from edged.serving.inference import InferenceMetrics
from edged.serving.measuring import RevisionMeters
from edged.state.desired import DesiredState
from edged.statusboard import StatusBoard
from edged.workloads import WorkloadName
from edgefleet.metrics import Registry

if TYPE_CHECKING:
    from edged.runtime.answerstats import AnswerTotals
    from edged.runtime.batchstats import BatchCounts
    from edged.runtime.overlapstats import OverlapTotals
    from edged.runtime.processes import Replica

# what each socket's limits did (runtime/httpserver.py ServerLimits): HttpServer.counters() key,
# metric name, help
SERVER_GAUGES = (
    ("connections", "edged_http_connections", "Open connections"),
    ("bufferedBytes", "edged_http_buffered_request_bytes", "Request body bytes being read"),
    ("refusedConnections", "edged_http_refused_connections", "Connections refused at the cap"),
    (
        "evictedIdleConnections",
        "edged_http_evicted_idle_connections",
        "Idle connections closed at the cap to make room",
    ),
    (
        "timedOutConnections",
        "edged_http_timed_out_connections",
        "Connections closed by a header, body or idle timeout",
    ),
    (
        "forbiddenConnections",
        "edged_http_forbidden_connections",
        "Connections refused (403) by the baselines' ingress users and groups",
    ),
    (
        "handedConnections",
        "edged_http_handed_connections",
        "Connections handed to the workers that serve their models, not closed or back yet",
    ),
    (
        "handedConnectionsTotal",
        "edged_http_handed_connections_handed",
        "Connections handed to workers so far",
    ),
)


class Counters:
    def __init__(
        self,
        registry: Registry,
        *,
        meters: RevisionMeters,
        board: StatusBoard,
        desired: DesiredState,
        replicas: Callable[[WorkloadName], list[Replica]],
    ) -> None:
        """``meters``: the per-revision measures; ``board``: told of refused requests (its
        ``Serving`` condition) and asked which revision a refused one was of; ``desired``:
        the accepted desired state (its generation and size are gauges); ``replicas``: a
        workload's replicas (the ready ones are a gauge)."""
        self._registry = registry
        self._meters = meters
        self._board = board
        self._replicas = replicas
        self.inference = InferenceMetrics(registry)
        self._restarts = registry.counter(
            "edged_replica_restarts_total",
            "Worker processes started again in a replica slot (after an exit or a kill)",
            ("workload",),
        )
        self._ready = registry.gauge("edged_replicas_ready", "Ready replicas", ("workload",))
        registry.gauge(
            "edged_desired_generation", "Generation of the accepted desired state"
        ).set_function(lambda: float(desired.generation))
        registry.gauge("edged_workloads", "Workloads in the desired state").set_function(
            lambda: float(len(desired.workloads))
        )

    def answered(self, rep: Replica, status: int, seconds: float) -> None:
        """A worker of ``rep`` answered a request with ``status`` after ``seconds``."""
        self.inference.answered(rep.workload, status, seconds)
        self._meters.answered(rep.workload, rep.revision, status, seconds)

    def refused(self, workload: str, version: str | None) -> None:
        """The router answered a request of ``workload`` 503 itself: an error of the revision
        it would have served (of ``version``, when asked for; else the wanted one)."""
        self.inference.refused(workload)
        self._board.refused(WorkloadName(workload))
        st = self._board.workload_status(WorkloadName(workload))
        revision = st.revision if st is not None else ""
        if st is not None and version is not None:
            revision = next(
                (r.revision for r in st.revisions if r.model_version == version), revision
            )
        self._meters.refused(workload, revision)

    def serving_changed(self, rep: Replica) -> None:
        """``rep`` became ready, or stopped being ready."""
        self._ready.labels(workload=rep.workload).set(
            sum(1 for r in self._replicas(rep.workload) if r.phase.value == "Ready")
        )

    def restarted(self, rep: Replica) -> None:
        self._restarts.labels(workload=rep.workload).inc()

    def batched(self, rep: Replica, delta: BatchCounts) -> None:
        self.inference.batched(rep.workload, delta)

    def overlapped(self, rep: Replica, delta: OverlapTotals) -> None:
        self.inference.overlapped(rep.workload, delta)

    def worker_answered(self, rep: Replica, delta: AnswerTotals) -> None:
        self.inference.worker_answered(rep.workload, delta)

    def watch_servers(self, servers: Mapping[str, HttpServer]) -> None:
        """What each socket's limits did (``socket`` label: the key), read when scraped."""
        for key, name, help_text in SERVER_GAUGES:
            gauge = self._registry.gauge(name, help_text, ("socket",))
            for socket_name, server in servers.items():
                gauge.labels(socket=socket_name).set_function(_counter_reader(server, key))


def _counter_reader(server: HttpServer, key: str) -> Callable[[], float]:
    return lambda: float(server.counters()[key])
