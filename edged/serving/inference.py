"""Open Inference Protocol v2 (REST) for applications on the device.

The router keeps, per model name, the replicas that are ready; a request goes to the one with
the fewest requests in flight, of the first workload of the name (in ``serving_order``) that
has one: a name given by two workloads is served by one, and by the other at once when the
first goes. An infer request it cannot route is answered 503 and reported (``refused``), so
that it counts as an error of the workload, as a worker's own 5xx does. Request bodies are
not parsed here: the worker decodes them (``runtime/tensors.py``), so the control process
stays small and its per-request cost is one HTTP parse, one frame write and one frame read.

Routes: ``GET /v2``, ``GET /v2/health/live``, ``GET /v2/health/ready``,
``GET /v2/models/{name}[/versions/{v}]``, ``GET /v2/models/{name}[/versions/{v}]/ready``,
``POST /v2/models/{name}[/versions/{v}]/infer``; the system shared-memory extension's
``/v2/systemsharedmemory/...`` (``sharedmemory.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from edged import __version__
from edged.runtime.answerstats import BOUNDS
from edged.runtime.framing import PROXY_STATUS, U32, FrameType, encode_frame
from edged.runtime.httpserver import Request, Response
from edged.serving.bounding import request_body_limit
from edged.serving.sharedmemory import PREFIX as SHM_PREFIX
from edged.serving.sharedmemory import SharedMemory, ShmAnswer, ShmError, peer_uid
from edged.workloads import DesiredWorkload, WorkloadName, serving_order
from edgefleet.metrics import CounterChild, HistogramChild, Registry

if TYPE_CHECKING:
    from edged.runtime.answerstats import AnswerTotals
    from edged.runtime.batchstats import BatchCounts
    from edged.runtime.httpserver import HttpConnection, HttpServer
    from edged.runtime.overlapstats import OverlapTotals
    from edged.runtime.processes import Replica


@dataclass
class ModelEntry:
    """A model name this device is meant to serve.

    ``workloads``: the workloads that give the name, in serving order (``serving_order`` in
    ``edged/workloads.py``); the first is the one it is meant to be served by, its version is
    ``version``. ``replicas``: the ready replicas of every workload of the name (one still
    draining after its workload was deleted included), so that routing never waits for a
    replica to become ready again when the workloads change."""

    name: str
    workloads: tuple[str, ...]
    version: str
    replicas: list[Replica] = field(default_factory=list)
    body_limit: tuple[int, str] | None = None  # from the ready replicas' inputs

    @property
    def workload(self) -> str:
        return self.workloads[0] if self.workloads else ""


_OTHER_PATHS = frozenset({"/v2", "/v2/", "/v2/health/live", "/v2/health/ready"})
# Requests that are not inference requests take no body worth reading.
OTHER_BODY_LIMIT = 64 * 1024


LATENCY_BUCKETS = BOUNDS


class InferenceMetrics:
    """Requests answered by workers (or by edged, 503, when no replica was ready), by workload
        and code, and their latency (of those workers answered), by workload
        (``workload`` is the one label name every edged metric uses for a workload); the batches
        workers ran, the requests merged into them and ONNX Runtime's time in them, by workload
        (as of each worker's last liveness probe: ``runtime/batchstats.py``); and the work workers
        did while ONNX Runtime ran a batch, likewise (``runtime/overlapstats.py``); and the answers
    workers report they wrote, with the time they held them (``runtime/answerstats.py``)."""

    def __init__(self, registry: Registry) -> None:
        self._requests = registry.counter(
            "edged_inference_requests_total",
            "Inference requests answered by workers, or 503 by edged when none was ready",
            ("workload", "code"),
        )
        self._latency = registry.histogram(
            "edged_inference_request_duration_seconds",
            "Time from forwarding a request to a worker to its answer",
            ("workload",),
            buckets=LATENCY_BUCKETS,
        )
        self._batches = registry.counter(
            "edged_inference_batches_total",
            "Batches workers ran to completion (requests merged by dynamic batching)",
            ("workload",),
        )
        self._batched = registry.counter(
            "edged_inference_batched_requests_total",
            "Requests in the batches workers ran to completion",
            ("workload",),
        )
        self._compute = registry.counter(
            "edged_inference_compute_seconds_total",
            "Seconds ONNX Runtime spent running those batches (no decoding or encoding)",
            ("workload",),
        )
        self._overlap = tuple(
            registry.counter(name, help_text, ("workload",))
            for name, help_text in (
                (
                    "edged_inference_overlapped_decodes_total",
                    "Requests workers read and decoded while ONNX Runtime ran a batch",
                ),
                (
                    "edged_inference_overlapped_encodes_total",
                    "Answers workers encoded while ONNX Runtime ran the next batch",
                ),
                (
                    "edged_inference_staged_batches_total",
                    "Batches workers handed to ONNX Runtime before the running one ended",
                ),
            )
        )
        self._worker_latency = registry.histogram(
            "edged_inference_worker_duration_seconds",
            "Time workers held the requests they answered, from reading each to writing its "
            "answer, as they report it (checked against edged's own count and time)",
            ("workload",),
            buckets=LATENCY_BUCKETS,
        )
        self._worker_errors = registry.counter(
            "edged_inference_worker_errors_total",
            "Answers with a status of 500 or more that workers report they wrote",
            ("workload",),
        )
        self._req_children: dict[tuple[str, int], CounterChild] = {}
        self._lat_children: dict[str, HistogramChild] = {}

    def answered(self, workload: str, status: int, seconds: float) -> None:
        key = (workload, status)
        c = self._req_children.get(key)
        if c is None:
            c = self._req_children[key] = self._requests.labels(workload=workload, code=str(status))
        c.inc()
        h = self._lat_children.get(workload)
        if h is None:
            h = self._lat_children[workload] = self._latency.labels(workload=workload)
        h.observe(seconds)

    def refused(self, workload: str, status: int = 503) -> None:
        """edged answered a request of ``workload`` itself (no ready replica): counted under
        its code, with no latency (no worker was asked)."""
        key = (workload, status)
        c = self._req_children.get(key)
        if c is None:
            c = self._req_children[key] = self._requests.labels(workload=workload, code=str(status))
        c.inc()

    def batched(self, workload: str, delta: BatchCounts) -> None:
        self._batches.labels(workload=workload).inc(delta.batches)
        self._batched.labels(workload=workload).inc(delta.requests)
        self._compute.labels(workload=workload).inc(delta.compute_s)

    def worker_answered(self, workload: str, delta: AnswerTotals) -> None:
        self._worker_latency.labels(workload=workload).add(delta.buckets, delta.seconds)
        if delta.errors:
            self._worker_errors.labels(workload=workload).inc(delta.errors)

    def overlapped(self, workload: str, delta: OverlapTotals) -> None:
        decodes, encodes, staged = self._overlap
        decodes.labels(workload=workload).inc(delta.decoded)
        encodes.labels(workload=workload).inc(delta.encoded)
        staged.labels(workload=workload).inc(delta.staged)


class InferenceRouter:
    def __init__(
        self,
        ready: Callable[[], bool],
        *,
        max_request_bytes: int = 64 << 20,
        refused: Callable[[str, str | None], None] | None = None,
        shared_memory: SharedMemory | None = None,
    ) -> None:
        """``refused(workload, version)``: the router answered an infer request of that
        workload 503 itself (no ready replica); ``version``: the one asked for, if any.
        ``shared_memory``: the system shared-memory extension's regions (None: off)."""
        self._models: dict[str, ModelEntry] = {}
        self._shm = shared_memory
        self._ready = ready
        self._ceiling = max_request_bytes
        self._refused = refused
        self._server: HttpServer | None = None  # the inference socket's, once it serves
        self._adopting: set[asyncio.Task[None]] = set()

    # -- the data path without the control process (docs/edged.md) ----------------------------
    def serve_with(self, server: HttpServer) -> None:
        """Hand ``server``'s infer connections to the workers that serve their models."""
        self._server = server
        server.state.handoff = self.handoff
        self._push_routes()

    def handoff(self, conn: HttpConnection, req: Request) -> bool:
        """Called with a connection's first request since it was idle, headers read: hand
        the connection to the worker that serves it, if that one takes connections."""
        path = req.path
        if not (path.startswith("/v2/models/") and path.endswith("/infer")):
            return False
        parts = path[11:-6].split("/")
        version = None
        if len(parts) == 3 and parts[1] == "versions":
            version = parts[2]
        elif len(parts) != 1:
            return False
        entry = self._models.get(parts[0])
        if entry is None:
            return False
        # a worker holds at most half the cap: one that never closes what it is handed (it
        # runs a model edged does not trust) cannot take every connection from the others
        share = self._server.limits.max_connections // 2 if self._server is not None else 0
        reps = [
            r for r in self._candidates(entry, version) if r.can_hand_off and _handed(r) < share
        ]
        if not reps:
            return False
        best = reps[0] if len(reps) == 1 else min(reps, key=_handed)
        uid: int | None = None
        if self._shm is not None:  # a proxied request naming a region needs its client's uid
            try:
                uid = peer_uid(conn)
            except ShmError:
                uid = None
        fd = conn.dup_fd()
        if fd is None:
            return False
        try:
            ok = best.hand_off(fd, conn.raw(), uid)
        finally:
            os.close(fd)
        if ok:
            conn_state = self._server.state if self._server is not None else None
            if conn_state is not None:
                conn_state.handed_total += 1
        return ok

    def handed(self, rep: Replica, delta: int) -> None:
        if self._server is not None:
            state = self._server.state
            state.handed = max(0, state.handed + delta)

    def returned(self, sock: socket.socket, keep: bool = False) -> None:
        """A worker handed a connection back (idle): serve it here again (``keep``: for
        good, never handed again: it uses shared memory, edged's to serve)."""
        server = self._server
        if server is None:
            sock.close()
            return
        task = asyncio.ensure_future(server.adopt(sock, keep_here=keep))
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    def close_direct(self) -> None:
        """edged stops: every worker closes its handed connections once idle."""
        for entry in self._models.values():
            for rep in entry.replicas:
                if rep.handoff is not None and rep.channel is not None:
                    rep.channel.send(FrameType.CLOSE)

    def proxy(self, rep: Replica, req_id: int, payload: bytes) -> None:
        """A request a worker got on a handed connection and does not serve itself: routed
        here as if it came here, answered to that worker."""
        data = bytes(payload)
        try:
            (hlen,) = U32.unpack_from(data, 0)
            head = orjson.loads(data[U32.size : U32.size + hlen])
            req = Request(_ProxiedConn(rep.uid_of(int(head.get("conn", 0)))))  # type: ignore[arg-type]
            req.method = str(head["method"])
            req.path = str(head["path"])
            req.query = str(head.get("query", ""))
            req.headers = {str(k): str(v) for k, v in dict(head["headers"]).items()}
            req.keep_alive = bool(head.get("keepAlive", True))
        except (ValueError, KeyError, TypeError, AttributeError):
            return  # a malformed frame: the worker's request waits for its connection's end
        req.body = data[U32.size + hlen :]
        self.handle(req, _ProxyAnswer(rep, req_id, req.keep_alive))

    def _push_routes(self) -> None:
        """Tell each ready worker what it serves on handed connections (ROUTE)."""
        if self._server is None:
            return
        limits = dataclasses.asdict(self._server.limits)
        table = {
            name: list(e.body_limit if e.body_limit is not None else (self._ceiling, ""))
            for name, e in self._models.items()
        }
        other = [OTHER_BODY_LIMIT, "requests other than infer take no body"]
        for entry in self._models.values():
            unversioned = self._candidates(entry, None)
            for rep in entry.replicas:
                server = dict(limits)
                memory = rep.spec.limits.memory_bytes
                if memory:  # bodies being read count against the worker's memory
                    server["max_buffered_bytes"] = min(
                        server["max_buffered_bytes"], max(1 << 20, memory // 4)
                    )
                doc = {
                    "unversioned": rep in unversioned,
                    "limits": table,
                    "other": other,
                    "server": server,
                }
                rep.route(orjson.dumps(doc))

    # -- kept current by the daemon -----------------------------------------------------------
    def route(self, workloads: Mapping[WorkloadName, DesiredWorkload]) -> None:
        """Route each model name of the desired ``workloads`` to them in serving order
        (:func:`edged.workloads.serving_order`), each with its deployment's model version."""
        self.set_models(
            {
                model: tuple((w, workloads[w].deployment.spec.model.version) for w in names)
                for model, names in serving_order(workloads).items()
            }
        )

    def set_models(self, entries: dict[str, tuple[tuple[str, str], ...]]) -> None:
        """Known models: name -> its workloads in serving order, each ``(workload, version)``.
        Ready replicas of kept names stay, whichever workload they belong to."""
        new: dict[str, ModelEntry] = {}
        for name, workloads in entries.items():
            old = self._models.get(name)
            entry = ModelEntry(name, tuple(w for w, _ in workloads), workloads[0][1])
            if old is not None:
                entry.replicas = old.replicas
                entry.body_limit = old.body_limit
            new[name] = entry
        self._models = new
        self._push_routes()

    def replica_ready(self, rep: Replica, ready: bool) -> None:
        name = rep.spec.model_name
        entry = self._models.get(name)
        if entry is None:
            if not ready:
                return
            entry = ModelEntry(name, (rep.workload,), rep.spec.model_version)
            self._models[name] = entry
        if ready and rep not in entry.replicas:
            entry.replicas.append(rep)
        elif not ready and rep in entry.replicas:
            entry.replicas.remove(rep)
        else:
            return
        if entry.replicas:  # else keep the last one: the model is coming back
            entry.body_limit = max(self._replica_body_limit(r) for r in entry.replicas)
        self._push_routes()

    def _replica_body_limit(self, rep: Replica) -> tuple[int, str]:
        meta = rep.metadata
        batching = meta.get("batching") or {}
        return request_body_limit(
            meta.get("inputs") or [],
            max_batch=int(batching.get("maxBatchSize", rep.spec.max_batch_size)),
            batchable=bool(batching.get("batchable", False)),
            memory_bytes=rep.spec.limits.memory_bytes,
            ceiling=self._ceiling,
        )

    def body_limit(self, req: Request) -> tuple[int, str] | None:
        """The body limit of a request (headers read, body not): see ``bounding.py``."""
        path = req.path
        if req.method == "POST" and path.startswith("/v2/models/") and path.endswith("/infer"):
            entry = self._models.get(path[11:].split("/", 1)[0])
            if entry is not None:
                return entry.body_limit  # None before a replica was ready: the ceiling
        return OTHER_BODY_LIMIT, "requests other than infer take no body"

    # -- the handler --------------------------------------------------------------------------
    def handle(self, req: Request, resp: Response) -> None:
        path = req.path
        if path.startswith("/v2/models/"):
            parts = path[11:].split("/")
            name = parts[0]
            rest = parts[1:]
            version = None
            if len(rest) >= 2 and rest[0] == "versions":
                version, rest = rest[1], rest[2:]
            entry = self._models.get(name)
            if entry is None:
                resp.send_error(404, f"model {name!r} is not served on this device")
                return
            action = rest[0] if rest else ""
            if len(rest) > 1 or action not in ("", "ready", "infer"):
                resp.send_error(404, f"no such endpoint: {path}")
                return
            if (
                version is not None
                and version != entry.version
                and not any(r.spec.model_version == version for r in entry.replicas)
            ):
                resp.send_error(404, f"model {name!r} has no version {version!r} on this device")
                return
            if action == "infer":
                if req.method != "POST":
                    resp.send_error(405, "use POST for infer")
                    return
                self._infer(entry, version, req, resp)
            elif req.method != "GET":
                resp.send_error(405, "use GET")
            elif action == "ready":
                ready = bool(self._candidates(entry, version))
                resp.send_json(200 if ready else 503, {"name": name, "ready": ready})
            else:
                self._metadata(entry, version, resp)
            return
        if path.startswith(SHM_PREFIX) and self._shm is not None:
            self._shm.handle(req, resp)
            return
        if path not in _OTHER_PATHS:
            resp.send_error(404, f"no such endpoint: {path}")
        elif req.method != "GET":
            resp.send_error(405, "use GET")
        elif path == "/v2/health/live":
            resp.send_json(200, {"live": True})
        elif path == "/v2/health/ready":
            ready = self._ready()
            resp.send_json(200 if ready else 503, {"ready": ready})
        else:
            extensions = ["binary_tensor_data"]
            if self._shm is not None:
                extensions.append("system_shared_memory")
            resp.send_json(200, {"name": "edged", "version": __version__, "extensions": extensions})

    def _candidates(self, entry: ModelEntry, version: str | None) -> list[Replica]:
        """The ready replicas a request goes to: those of the first workload in serving order
        that has one (of ``version``, when given), else of any workload of the name (one whose
        workload was deleted, while it drains)."""
        reps = entry.replicas
        if version is not None:
            reps = [r for r in reps if r.spec.model_version == version]
        if len(entry.workloads) > 1 and reps:
            for workload in entry.workloads:
                mine = [r for r in reps if r.workload == workload]
                if mine:
                    return mine
        return reps

    def _infer(self, entry: ModelEntry, version: str | None, req: Request, resp: Response) -> None:
        reps = self._candidates(entry, version)
        if not reps:
            resp.send_error(503, f"model {entry.name!r} has no ready replica")
            if self._refused is not None:  # an error of that workload's, as a worker's 5xx
                self._refused(entry.workload, version)
            return
        shm = self._shm
        if shm is not None and shm.wants(req):
            limit = entry.body_limit[0] if entry.body_limit is not None else self._ceiling
            try:
                outs = shm.rewrite(req, limit)
            except ShmError as exc:
                resp.send_error(exc.status, str(exc))
                return
            if outs:
                resp = ShmAnswer(resp, outs)
        best = reps[0]
        if len(reps) > 1:
            best = min(reps, key=_inflight)
        best.forward(req, resp)

    def _metadata(self, entry: ModelEntry, version: str | None, resp: Response) -> None:
        reps = self._candidates(entry, version)
        if not reps:
            resp.send_error(503, f"model {entry.name!r} has no ready replica yet")
            return
        meta: dict[str, Any] = reps[0].metadata
        versions = sorted({r.spec.model_version for r in entry.replicas})
        resp.send_json(
            200,
            {
                "name": entry.name,
                "versions": versions,
                "platform": meta.get("platform", "onnxruntime_onnx"),
                "inputs": meta.get("inputs", []),
                "outputs": meta.get("outputs", []),
            },
        )


def _inflight(rep: Replica) -> int:
    return rep.inflight


def _handed(rep: Replica) -> int:
    return len(rep.handoff.open) if rep.handoff is not None else 0


class _ProxiedConn:
    """Who sent a proxied request: its client's uid, as asked when its connection was handed
    (None: not asked; the shared-memory extension then refuses it)."""

    def __init__(self, uid: int | None) -> None:
        self.peer_uid = uid

    def socket(self) -> None:
        return None


class _ProxyAnswer(Response):
    """A proxied request's answer: a PROXY_RESULT frame to the worker that asked."""

    __slots__ = ("_rep", "_req_id")

    def __init__(self, rep: Replica, req_id: int, keep_alive: bool) -> None:
        self._rep = rep
        self._req_id = req_id
        self.keep_alive = keep_alive
        self.data = None

    def send(
        self,
        status: int,
        body: bytes,
        content_type: bytes = b"application/json",
        headers: bytes = b"",
    ) -> None:
        if self.data is not None:
            return
        self.data = b""
        channel = self._rep.channel
        if channel is None or channel.transport is None:
            return
        payload = b"".join(
            (
                PROXY_STATUS.pack(status, len(content_type)),
                content_type,
                U32.pack(len(headers)),
                headers,
                body,
            )
        )
        channel.transport.write(encode_frame(FrameType.PROXY_RESULT, self._req_id, payload))
