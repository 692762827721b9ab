"""One soak run: the fleet (soakfleet), the plan from the seed (soakplan), four threads while it
runs — the operator's calls (two clients at once, every call recorded in the history), the
faults, steady inference traffic on every real device, a sampler (each device's replicas of
``soak-a`` for the rollout budget; RSS and descriptors of every hub, etcd and edged) — then the
convergence wait, the final reads, the invariants and the report (soakreport)."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import math
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil
from soakfleet import PLACED, SIM_SITE, SITE, STEADY, Fleet, Target, device_timers
from soakhistory import Op
from soakplan import BROKEN, ENROLL, KILL, POWER, VM_DEPLOYMENT, Action, Fault, Plan, make_plan
from soakvms import VM_SITE

from edgectl.client import AdminClient, ClientError, load_admin_config
from edgectl.errors import EXIT_UNREACHABLE
from edgefleet.devicestatus import send_request
from edgefleet.inference import infer_path, infer_request_body
from edgefleet.launching import program_command

ANNOTATION = "soak.edgefleet.io/write"
ENROLLED_SITE = "enrolled"  # the label of devices the operator's stream enrolls: nothing runs there
BUDGET_DEPLOYMENT = "soak-a"  # maxSurge 0, maxUnavailable 1: one device switched at a time
BUDGET = 1
CALL_TIMEOUT = 10.0
ALLOWANCE_TTL = "2h"  # a rollback allowance's life: past the longest documented run
# after a fault on a device ends, how long its own errors and unavailability are excused
# (edged starts again, adopts or restarts its workers, loads a model)
DEVICE_GRACE = 30.0


@dataclass
class Settings:
    seed: int
    duration: float  # seconds of faults and operator actions
    directory: Path
    real_devices: int = 2
    sim_devices: int = 50
    converge_within: float = 180.0  # the stated bound: the fleet converges this soon after
    rss_growth_mib: float = 150.0  # the stated bounds on a process's growth over its life
    fd_growth: int = 64
    fault_gap: float = 8.0
    action_gap: float = 2.0
    disk_mib: int = 64  # the root's and dev-0's tmpfs (the full-disk faults fill them)
    vm_devices: int = 0  # lab VMs (soakvms): the device image in QEMU, power cuts


@dataclass
class Recorder:
    t0: float = field(default_factory=time.monotonic)
    events: list[dict[str, Any]] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    allowances: dict[str, int] = field(default_factory=dict)  # rollback allowances, by outcome

    def now(self) -> float:
        return time.monotonic() - self.t0

    def event(self, kind: str, text: str, **data: Any) -> None:
        with self.lock:
            self.events.append({"t": round(self.now(), 3), "kind": kind, "text": text, **data})


# -- documents ------------------------------------------------------------------------------
def deployment(
    name: str,
    version: str,
    value: str,
    *,
    replicas: int = 1,
    canary: bool = False,
    total: int | None = None,
) -> bytes:
    site = {"soak-sim": SIM_SITE, VM_DEPLOYMENT: VM_SITE}.get(name, SITE)
    rollout: dict[str, Any] = (
        {"maxSurge": "100%", "maxUnavailable": "100%"}  # simulated devices report no status
        if site == SIM_SITE
        else {"maxSurge": 0, "maxUnavailable": BUDGET, "progressDeadlineSeconds": 60}
    )
    if site == VM_SITE:  # a VM cut during its switch takes minutes to boot again under TCG
        rollout["progressDeadlineSeconds"] = 1800
    if canary and site == SITE:
        rollout["canary"] = {"steps": ["50%", {"pause": {"duration": "3s"}}]}
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "annotations": {ANNOTATION: value}},
        "spec": {
            "model": {"name": name, "version": version},
            "runtime": {"executionProviders": ["CPUExecutionProvider"]},
            "replicas": {"perDevice": replicas} if total is None else {"total": total},
            "placement": {"regions": ["eu"], "nodeSelector": {"site": site}},
            "probes": {"readiness": {"periodSeconds": 1, "timeoutSeconds": 1}},
            "rollout": rollout,
        },
    }
    return orjson.dumps(doc)


def priority_class(name: str, value: str) -> bytes:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "annotations": {ANNOTATION: value}},
        "spec": {"value": 7},
    }
    return orjson.dumps(doc)


# -- the operator -----------------------------------------------------------------------------
class Operator:
    """Makes each planned call and records it as an operation of the history: the outcome is
    ``ok``, ``fail`` (certainly no effect: refused, or never reached a hub) or ``unknown``."""

    def __init__(self, fleet: Fleet, rec: Recorder) -> None:
        assert fleet.root is not None
        self.rec = rec
        root = load_admin_config(fleet.root.admin_config)
        region = load_admin_config(fleet.replicas[0].admin_config)
        flipped = dataclasses.replace(region, hub=region.hubs[1], hubs=tuple(reversed(region.hubs)))
        self.configs = {"root": root, "eu-r0": region, "eu-r1": flipped}
        self.fleet = fleet
        self.enrolled: dict[str, str] = {}  # Device/NAME -> the value its enrollment wrote

    def client(self, hub: str) -> AdminClient:
        return AdminClient(self.configs[hub], timeout=CALL_TIMEOUT)

    def perform(self, action: Action, client_name: str) -> Op | None:
        kind, name = action.key.split("/")
        op_id = next(self.rec.ids)
        value = f"w{op_id}"
        start = self.rec.now()
        outcome = "ok"
        seen: str | None = None
        op_kind = "read" if action.op == "read" else "write"
        detail = ""
        try:
            with self.client(action.at_hub) as client:
                if action.op == ENROLL:
                    outcome, detail = self.enroll(client, action, name)
                    seen = value
                    if outcome != "fail":
                        self.enrolled[action.key] = value
                elif action.op == "apply":
                    if action.allow_rollback:
                        self.allow_rollback(kind, name, action.version)
                    doc = (
                        deployment(
                            name,
                            action.version,
                            value,
                            replicas=action.replicas,
                            canary=action.canary,
                            total=action.total,
                        )
                        if kind == "ModelDeployment"
                        else priority_class(name, value)
                    )
                    client.apply([doc])
                    seen = value
                elif action.op == "delete":
                    if client.delete(kind, name):
                        seen = None
                    else:  # it was not there: what the call saw, a read of "absent"
                        op_kind, seen = "read", None
                elif kind == "Device":  # present: the value its enrollment wrote
                    client.get(kind, name)
                    seen = self.enrolled.get(action.key, "present, never enrolled")
                else:
                    obj = client.get(kind, name)
                    seen = obj.get("metadata", {}).get("annotations", {}).get(ANNOTATION)
        except ClientError as exc:
            detail = str(exc)[:300]
            if exc.code == "NOT_FOUND" and action.op in ("read", "delete"):
                op_kind, seen = "read", None
            elif action.op == "read" or not _maybe_done(exc):
                outcome = "fail"
            else:
                outcome = "unknown"
        end = self.rec.now()
        op = Op(
            op_id,
            action.key,
            op_kind,
            seen if op_kind == "read" or action.op != "apply" else value,  # type: ignore[arg-type]
            start,
            end if outcome != "unknown" else math.inf,
            outcome,
            client_name,
        )  # type: ignore[arg-type]
        self.rec.event(
            "op",
            f"{action.op} {action.key} at {action.at_hub}: {outcome}",
            id=op_id,
            value=op.value,
            version=action.version,
            detail=detail,
            start=round(start, 3),
            end=round(end, 3),
        )
        with self.rec.lock:
            self.rec.ops.append(op)
        if action.read_after and outcome == "ok":
            self.perform(Action(action.at, "read", action.key, action.read_after), client_name)
        return op

    def allow_rollback(self, kind: str, name: str, version: str) -> None:
        """The version pushed again at the root with a rollback allowance (docs/trust.md: it
        is signed anew, so devices that accepted a newer version, the broken 9.0.0 included,
        take exactly these bytes again while it holds). Its outcome is counted and the apply
        goes on either way (without it, a device refuses the downgrade and the region names
        it: the convergence check accepts that)."""
        assert self.fleet.root is not None and kind == "ModelDeployment"
        path = self.fleet.directory / f"{name}-{version}.onnx"
        try:
            out = self.fleet.root.edgectl(
                "models", "push", str(path), "--name", name, "--version", version,
                "--allow-rollback", ALLOWANCE_TTL, check=False,
            )  # fmt: skip
            outcome = "ok" if out.returncode == 0 else "fail"
            detail = "" if outcome == "ok" else (out.stdout + out.stderr).strip()[-300:]
        except subprocess.TimeoutExpired:
            outcome, detail = "unknown", "edgectl models push did not finish in 120 s"
        with self.rec.lock:
            self.rec.allowances[outcome] = self.rec.allowances.get(outcome, 0) + 1
        self.rec.event(
            "allowance", f"push {name} {version} --allow-rollback at root: {outcome}",
            detail=detail,
        )  # fmt: skip

    def enroll(self, client: AdminClient, action: Action, name: str) -> tuple[str, str]:
        """A single-use token created at ``action.at_hub`` and ``edged enroll`` of a new
        device with it there: (outcome, detail). The token's refusal is a failure (no device);
        an enrollment that did not answer yes may have happened (unknown)."""
        try:
            token = client.create_token(
                single_use=True, ttl_s=600, description=f"soak {name}",
                labels={"site": ENROLLED_SITE},
            )  # fmt: skip
        except ClientError as exc:
            return "fail", f"token: {exc}"[:300]
        hub = self.fleet.replicas[int(action.at_hub[-1])]
        other = self.fleet.replicas[1 - int(action.at_hub[-1])]
        data = self.fleet.directory / "enrolled" / name
        cmd = program_command("edged", "enroll", "--hub", f"{hub.address},{other.address}",
                              "--ca-hash", token.ca_hash, "--data-dir", data, "--name", name,
                              "--enroll-address", f"127.0.0.1:{hub.port + 1}")  # fmt: skip
        if token.root_hash:
            cmd += ["--root-hash", token.root_hash]
        env = {**os.environ, "EDGED_TOKEN": token.token}
        try:
            out = subprocess.run(
                cmd, capture_output=True, text=True, timeout=60, env=env, cwd=hub.cwd, check=False
            )
        except subprocess.TimeoutExpired:
            return "unknown", "edged enroll did not finish in 60 s"
        if out.returncode == 0:
            return "ok", ""
        return "unknown", f"edged enroll exit {out.returncode}: {out.stderr.strip()[-300:]}"


def _maybe_done(exc: ClientError) -> bool:
    """Whether a failed change may still have been made (edgectl's own judgement: outcome
    unknown; and any answer that is not a refusal the hub decided)."""
    if exc.exit_code == EXIT_UNREACHABLE:
        return "outcome is unknown" in exc.message
    return exc.code not in (
        "INVALID_ARGUMENT",
        "FAILED_PRECONDITION",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "RESOURCE_EXHAUSTED",
        "ABORTED",
        "UNAVAILABLE",
    )


# -- faults ---------------------------------------------------------------------------------
class FaultRunner:
    """Runs the plan's faults in time order; ``restore`` ends every fault still on."""

    def __init__(self, fleet: Fleet, rec: Recorder, faults: list[Fault]) -> None:
        self.fleet = fleet
        self.rec = rec
        self.queue: list[tuple[float, int, str, Fault]] = []
        for i, f in enumerate(faults):
            heapq.heappush(self.queue, (f.at, i, "begin", f))
        self.windows: list[dict[str, Any]] = []  # what happened: target, action, begin, end
        self._open: dict[str, dict[str, Any]] = {}
        self.seq = len(faults)

    def run(self, stop: threading.Event) -> None:
        while self.queue and not stop.is_set():
            at, _, phase, fault = self.queue[0]
            delay = at - self.rec.now()
            if delay > 0:
                stop.wait(min(delay, 0.5))
                continue
            heapq.heappop(self.queue)
            try:
                (self._begin if phase == "begin" else self._end)(fault)
            except Exception as exc:
                self.rec.event("fault-error", f"{phase} {fault.action} {fault.target}: {exc!r}")

    def _begin(self, f: Fault) -> None:
        target = self.fleet.targets[f.target]
        if target.cut is not None:  # a link or a disk: no process
            target.cut()
            self._opened(f, None)
            return
        if target.jump is not None:  # a device's wall clock
            target.jump(f.offset)
            self._opened(f, None)
            return
        if target.slow is not None:  # a device's disk
            target.slow(f.delay)
            self._opened(f, None)
            return
        pid = target.pid()
        if pid is None:
            self.rec.event("fault", f"skipped {f.action} {f.target}: not running", target=f.target)
            return
        os.kill(pid, signal.SIGKILL if f.action in (KILL, POWER) else signal.SIGSTOP)
        self._opened(f, pid)

    def _opened(self, f: Fault, pid: int | None) -> None:
        window = {
            "target": f.target,
            "kind": f.kind,
            "action": f.action,
            "pid": pid,
            "planned_at": f.at,
            "begin": round(self.rec.now(), 3),
            "end": None,
        }
        self.windows.append(window)
        self._open[f.target] = window
        if f.offset:
            window["offset"] = f.offset
        by = f" by {f.offset:+g}s" if f.offset else ""
        if f.delay:  # slow I/O: seconds per operation
            window["delay"] = f.delay
            by = f", {f.delay:g}s per operation"
        self.rec.event(
            "fault", f"{f.action} {f.target}{by} (pid {pid}) for {f.duration:g}s", target=f.target
        )
        if f.kind == "worker":  # its edged starts it again
            window["end"] = window["begin"]
            del self._open[f.target]
            return
        self.seq += 1
        heapq.heappush(self.queue, (self.rec.now() + f.duration, self.seq, "end", f))

    def _end(self, f: Fault) -> None:
        window = self._open.pop(f.target, None)
        if window is None:
            return
        target = self.fleet.targets[f.target]
        if target.heal is not None:
            target.heal()
        elif f.action in (KILL, POWER):
            _restart(target)
        else:
            os.kill(window["pid"], signal.SIGCONT)
        window["end"] = round(self.rec.now(), 3)
        self.rec.event("fault", f"ended {f.action} {f.target}", target=f.target)

    def restore(self) -> None:
        self.queue.clear()
        for name in list(self._open):
            window = self._open[name]
            self._end(Fault(0, name, window["kind"], window["action"], 0))


def _restart(target: Target) -> None:
    assert target.restart is not None
    target.restart()


# -- what systemd does for them ---------------------------------------------------------------
# packaging/systemd/hub.service and edged.service: Restart=always, RestartSec=2s,
# StartLimitBurst=10 within StartLimitIntervalSec=10min
RESTART_SEC = 2.0
START_LIMIT = 10
START_LIMIT_INTERVAL = 600.0


class Supervisor:
    """Does for the hubs, edged and etcd members what their units do in the field: one that
    exits on its own, under no fault of the harness (a hub exits on purpose when its store
    refuses writes, tests/hub/test_hub_dead_store.py; an etcd member that could not start),
    is started again ``RESTART_SEC`` later; past
    the start limit it stays down, as systemd leaves it, and says so. Each start is an event
    (``supervisor``), so the report shows what a field device would have lived through."""

    def __init__(self, fleet: Fleet, rec: Recorder, faults: FaultRunner) -> None:
        self.fleet = fleet
        self.rec = rec
        self.faults = faults
        self.down_since: dict[str, float] = {}
        self.starts: dict[str, list[float]] = {}
        self.gave_up: set[str] = set()

    def check(self) -> None:
        now = self.rec.now()
        for name, target in self.fleet.targets.items():
            if target.kind not in ("hub", "edged", "etcd") or target.restart is None:
                continue
            if name in self.gave_up or name in self.faults._open or target.pid() is not None:
                self.down_since.pop(name, None)
                continue
            if now - self.down_since.setdefault(name, now) < RESTART_SEC:
                continue
            recent = [t for t in self.starts.get(name, []) if now - t < START_LIMIT_INTERVAL]
            if len(recent) >= START_LIMIT:
                self.gave_up.add(name)
                self.rec.event(
                    "supervisor",
                    f"{name} exited on its own again: {START_LIMIT} starts within "
                    f"{START_LIMIT_INTERVAL:g}s, left down (systemd's start limit)",
                    target=name,
                )
                continue
            self.starts[name] = [*recent, now]
            self.down_since.pop(name, None)
            self.rec.event(
                "supervisor",
                f"{name} exited on its own: started again (Restart=always)",
                target=name,
            )
            target.restart()


# -- traffic and sampling ---------------------------------------------------------------------
def infer_once(data: Path, name: str) -> int:
    body = infer_request_body({"input": [[0.5] * 64]})
    try:
        status, _, _ = send_request(
            str(data / "infer.sock"), "POST", infer_path(name), body, timeout=5.0
        )
        return status
    except (OSError, ValueError):
        return -1


def edged_status(data: Path) -> dict[str, Any] | None:
    try:
        status, body, _ = send_request(str(data / "edged.sock"), "GET", "/v1/status", timeout=2.0)
        if status != 200:
            return None
        doc: dict[str, Any] = orjson.loads(body)
        return doc
    except (OSError, ValueError):
        return None


def replicas_of(doc: dict[str, Any] | None, workload: str) -> tuple[set[str], set[str]] | None:
    """(versions with a ready replica, versions with a replica not ready); None: no workload.
    A replica draining before its exit (``Stopping``: its successor took over) is neither, as
    Kubernetes counts no terminating pod against a rollout's budget."""
    for w in (doc or {}).get("workloads", []):
        if w.get("name") == workload:
            replicas = w.get("replicas", [])
            if replicas and all(r.get("phase") == "Stopping" for r in replicas):
                return None  # removed (deleted at the root): every replica drains at once
            ready: set[str] = set()
            not_ready: set[str] = set()
            for r in w.get("replicas", []):
                if r.get("phase") == "Stopping" and not r.get("ready"):
                    continue
                (ready if r.get("ready") else not_ready).add(str(r.get("version", "?")))
            return ready, not_ready
    return None


ETCD_FIGURES = {
    "etcd_server_proposals_committed_total": "entries",
    "etcd_disk_wal_write_bytes_total": "wal_bytes",
    "etcd_debugging_snap_save_total_duration_seconds_count": "snapshots",
    "go_memstats_heap_inuse_bytes": "heap_bytes",
}


def etcd_figures(endpoint: str, timeout: float = 5.0) -> dict[str, int]:
    """The :data:`ETCD_FIGURES` of an etcd member's ``/metrics`` (Prometheus text)."""
    import urllib.request

    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=timeout) as answer:
        text = answer.read(4 * 2**20).decode()
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ETCD_FIGURES:
            out[ETCD_FIGURES[name]] = int(float(value))
    return out


def of_device(target: str, device: str) -> bool:
    """Whether a fault's target is the device's own: its edged, a worker of it, its disk."""
    return target == device or target.startswith(f"{device}-")


class Sampler:
    def __init__(self, fleet: Fleet, rec: Recorder, faults: FaultRunner) -> None:
        self.fleet = fleet
        self.rec = rec
        self.faults = faults
        self.resources: dict[
            str, list[tuple[float, int, int, int]]
        ] = {}  # name -> t, pid, rss, fds
        # the harness's own (t, threads): a leak in the harness fails the run with its figures
        # (descriptors in ``resources["harness"]``) before it runs out, rather than aborting it
        self.harness_threads: list[tuple[float, int]] = []
        self.harness_exhausted: str | None = None  # why the chaos ended early
        self.sims_ended: str | None = None  # when and how the simulated devices' process ended
        self.etcd_samples: dict[str, list[dict[str, Any]]] = {}  # etcd(): member -> samples
        self.budget_samples = 0
        self.budget_max = 0
        self.budget_violations: list[dict[str, Any]] = []
        self.inference: dict[str, dict[str, Any]] = {}
        self._served: dict[str, bool] = {}  # device -> soak-a was ready on it since it appeared
        # the devices' own view, each second: (t, connected to a hub, which replica, holds
        # soak-t); a device's removals of soak-t are judged against it (placement_moves)
        self.views: dict[str, list[tuple[float, bool, str, bool]]] = {}
        self.moves: list[dict[str, Any]] = []
        self.lags: dict[str, list[tuple[float, float] | None]] = {}  # soakreport.Lag's
        hubs = {h.address: f"eu-r{i}" for i, h in enumerate(fleet.replicas)}
        self._hub_names = hubs
        timers = device_timers(fleet.sim_devices)
        # a legitimate move needs the device silent for rescheduleAfter in the hub's view: in
        # its own view, not connected (or its replica stopped) within that long before
        self.lookback = timers["rescheduleAfter"] + 2 * timers["heartbeatInterval"] + 10.0

    def excused(
        self, device: str, t: float, *, serving: bool = False, until: float | None = None
    ) -> bool:
        """A fault on the device (its edged, or a worker of it) was on at ``t`` (or at any time
        from ``t`` to ``until``: a request's whole flight), or ended less than the grace
        before. ``serving`` (its inference): a jump of its clock excuses nothing (soakclock)."""
        last = t if until is None else until
        for w in self.faults.windows:
            if serving and w["kind"] == "clock":
                continue
            if of_device(w["target"], device):
                end = w["end"] if w["end"] is not None else math.inf
                if w["begin"] - 1.0 <= last and t <= end + DEVICE_GRACE:
                    return True
        return False

    def sample(self) -> None:
        t = self.rec.now()
        for name, pid in self.fleet.processes().items():
            try:
                p = psutil.Process(pid)
                if p.status() == psutil.STATUS_ZOMBIE:  # killed, not reaped yet
                    continue
                rss, fds = p.memory_info().rss, p.num_fds()
            except psutil.Error:
                continue
            self.resources.setdefault(name, []).append((round(t, 2), pid, rss, fds))
        self._harness(t)
        sims = self.fleet.sim_process
        if self.sims_ended is None and sims is not None and not sims.is_alive():
            self.sims_ended = f"exit code {sims.exitcode}, noticed at t={t:.1f}s"
            self.rec.event("violation", f"the simulated devices' process ended: {self.sims_ended}")
        switching = []
        for i, e in enumerate(self.fleet.edged):
            device = f"dev-{i}"
            doc = edged_status(e.data)
            self._view(device, t, doc)
            view = replicas_of(doc, BUDGET_DEPLOYMENT)
            if view is None:
                self._served[device] = False
                continue
            ready, not_ready = view
            if ready and not not_ready:
                self._served[device] = True
            if (
                (not_ready or not ready)
                and self._served.get(device)
                and not self.excused(device, t)
            ):
                work = next(w for w in doc["workloads"] if w.get("name") == BUDGET_DEPLOYMENT)
                phases = [f"{r.get('version')} {r.get('phase')}" for r in work.get("replicas", [])]
                switching.append(
                    {"device": device, "ready": sorted(ready), "not_ready": sorted(not_ready),
                     "replicas": phases}
                )  # fmt: skip
        self.budget_samples += 1
        self.budget_max = max(self.budget_max, len(switching))
        if len(switching) > BUDGET:
            violation = {"t": round(t, 3), "switching": switching}
            self.budget_violations.append(violation)
            self.rec.event(
                "violation", f"rollout budget: {len(switching)} devices switching", **violation
            )

    def etcd(self) -> None:
        """Each etcd member's own figures (its ``/metrics``): raft entries committed, bytes
        written to its WAL, snapshots saved, Go heap in use. A member keeps every entry since
        its last snapshot in memory (docs/etcd.md), so its RSS is read against these
        (``report.json``'s ``etcd``, beside its growth)."""
        t = self.rec.now()
        pids = self.fleet.processes()
        for i, member in enumerate(self.fleet.etcd):
            name = f"etcd-{i}"
            pid = pids.get(name)
            if pid is None:
                continue
            try:
                figures = etcd_figures(member.endpoint)
            except (OSError, ValueError):
                continue  # stopped, killed, starting: the next sample
            self.etcd_samples.setdefault(name, []).append({"t": round(t, 2), "pid": pid,
                                                          **figures})  # fmt: skip

    def _harness(self, t: float) -> None:
        """The harness's own RSS, descriptors and threads; past half its descriptor limit it
        asks the run to end its chaos now (the 1-hour run once aborted in gRPC's
        ``epoll_create1`` with every descriptor open, docs/soak.md)."""
        me = psutil.Process()
        fds, threads = me.num_fds(), me.num_threads()
        self.resources.setdefault("harness", []).append(
            (round(t, 2), me.pid, me.memory_info().rss, fds)
        )
        self.harness_threads.append((round(t, 2), threads))
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if self.harness_exhausted is None and limit > 0 and fds > limit // 2:
            self.harness_exhausted = f"{fds} descriptors open, the limit {limit}"
            self.rec.event("violation", f"the harness itself: {self.harness_exhausted}")

    def _view(self, device: str, t: float, doc: dict[str, Any] | None) -> None:
        """One sample of the device's own view; a removal of soak-t is judged at once."""
        hub = (doc or {}).get("hub") or {}
        connected = bool(doc is not None and hub.get("connected"))
        holds = replicas_of(doc, PLACED) is not None
        at = self._hub_names.get(str(hub.get("hub")), str(hub.get("hub")))
        views = self.views.setdefault(device, [])
        before = views[-1] if views else None
        views.append((round(t, 2), connected, at, holds))
        if before is None or doc is None or not before[3] or holds:
            return
        excuse = self.move_excuse(device, t)
        move = {"t": round(t, 3), "device": device, "excused": excuse}
        self.moves.append(move)
        if excuse is None:
            self.rec.event(
                "violation",
                f"{PLACED} moved off {device}, Ready and connected in its own view for the "
                f"{self.lookback:g}s before",
                **move,
            )
        else:
            self.rec.event("move", f"{PLACED} moved off {device}: {excuse}", **move)

    def move_excuse(self, device: str, t: float) -> str | None:
        """Why a removal at ``t`` may be legitimate (None: nothing): within the look-back the
        device had a fault of its own, was not connected in its own view, or was connected to a
        replica that was stopped (its stream open, nothing heard: edged's keepalive is 60 s)."""
        since = t - self.lookback
        for w in self.faults.windows:
            end = w["end"] if w["end"] is not None else math.inf
            if end < since or w["begin"] > t:
                continue
            # a jump of its clock alone does not silence a device (a connection it cannot make
            # while its clock is behind is excused below: not connected in its own view)
            if of_device(w["target"], device) and w["kind"] != "clock":
                return f"{w['action']} {w['target']} at {w['begin']:.1f}s"
        for at, connected, hub, _ in self.views.get(device, []):
            if not since <= at <= t:
                continue
            if not connected:
                return f"not connected at {at:.1f}s in its own view"
            for w in self.faults.windows:
                end = w["end"] if w["end"] is not None else math.inf
                if w["target"] == hub and w["begin"] - 1.0 <= at <= end + 1.0:
                    return f"its replica {hub} {w['action']} at {w['begin']:.1f}s"
        return None

    def traffic(self) -> None:
        for i, e in enumerate(self.fleet.edged):
            device = f"dev-{i}"
            # each request's own flight, from its start to its answer: one device stopped holds
            # the next ones' requests up to the timeout (seed 62: dev-4's request, dated at the
            # round's start, ran 5 s later, as dev-4 was killed, and was not excused)
            t = self.rec.now()
            status = infer_once(e.data, STEADY)
            answered = self.rec.now()
            figures = self.inference.setdefault(
                device,
                {"requests": 0, "errors": 0, "errors_excused": 0, "unexcused": [], "times": []},
            )
            figures["requests"] += 1
            if status == 200:
                continue
            figures["errors"] += 1
            figures["times"].append(round(t, 2))
            if self.excused(device, t, serving=True, until=answered):
                figures["errors_excused"] += 1
            else:
                figures["unexcused"].append(
                    {"t": round(t, 3), "answered": round(answered, 3), "status": status}
                )
                if len(figures["unexcused"]) <= 5:
                    self.rec.event(
                        "violation",
                        f"inference on {device} failed ({status}) outside a fault of that device",
                        device=device,
                    )


def every(period: float, stop: threading.Event, fn: Callable[[], None], rec: Recorder) -> None:
    while not stop.is_set():
        began = time.monotonic()
        try:
            fn()
        except Exception as exc:
            rec.event("harness-error", f"{getattr(fn, '__name__', fn)}: {exc!r}")
        stop.wait(max(0.0, period - (time.monotonic() - began)))


# -- the run ----------------------------------------------------------------------------------
def run(settings: Settings) -> dict[str, Any]:
    from soakintegrity import check_all, power_cut
    from soakreport import Lag, converge, final_reads, judge, write_report

    fleet = Fleet(
        settings.directory,
        real_devices=settings.real_devices,
        sim_devices=settings.sim_devices,
        disk_mib=settings.disk_mib,
        vm_devices=settings.vm_devices,
    )
    rec = Recorder()
    threads: list[threading.Thread] = []
    stop = threading.Event()
    actions_stop = threading.Event()
    try:
        fleet.start()
        fleet.wait_connected()
        rec.t0 = time.monotonic()
        rec.event("run", f"fleet up in {rec.t0 - fleet.started_at:.1f}s; seed {settings.seed}")
        targets = {name: t.kind for name, t in fleet.targets.items()}
        plan = make_plan(
            settings.seed,
            settings.duration,
            targets,
            fault_gap=settings.fault_gap,
            action_gap=settings.action_gap,
        )
        operator = Operator(fleet, rec)
        _apply_steady(operator, rec, fleet)
        deadline = time.monotonic() + 120
        while not all(infer_once(e.data, STEADY) == 200 for e in fleet.edged):
            assert time.monotonic() < deadline, "the steady deployment is not served"
            time.sleep(0.5)
        wait_placed(fleet, rec, 120)
        wait_vms_serving(fleet, rec, 900)
        rec.t0 = time.monotonic()
        rec.event("run", f"{STEADY} served on every device: the run starts")
        faults = FaultRunner(fleet, rec, plan.faults)
        sampler = Sampler(fleet, rec, faults)
        for i in range(2):  # two operators at once: their calls overlap in the history
            mine = plan.actions[i::2]
            threads.append(
                threading.Thread(
                    target=_operate, args=(operator, mine, f"op{i}", actions_stop, rec), daemon=True
                )
            )
        threads.append(
            threading.Thread(
                target=_operate,
                args=(operator, plan.enrollments, "enroller", actions_stop, rec),
                daemon=True,
            )
        )
        if plan.vm_updates:
            threads.append(
                threading.Thread(
                    target=_operate,
                    args=(operator, plan.vm_updates, "vm-operator", actions_stop, rec),
                    daemon=True,
                )
            )
        threads.append(threading.Thread(target=faults.run, args=(stop,), daemon=True))
        threads.append(
            threading.Thread(target=every, args=(1.0, stop, sampler.sample, rec), daemon=True)
        )
        threads.append(
            threading.Thread(target=every, args=(0.5, stop, sampler.traffic, rec), daemon=True)
        )
        threads.append(
            threading.Thread(target=every, args=(30.0, stop, sampler.etcd, rec), daemon=True)
        )
        supervisor = Supervisor(fleet, rec, faults)
        threads.append(
            threading.Thread(target=every, args=(0.5, stop, supervisor.check, rec), daemon=True)
        )
        lag = Lag(fleet, operator, rec)
        sampler.lags = lag.series
        threads.append(
            threading.Thread(target=every, args=(5.0, stop, lag.sample, rec), daemon=True)
        )
        for th in threads:
            th.start()
        while rec.now() < settings.duration and sampler.harness_exhausted is None:
            time.sleep(0.5)
        actions_stop.set()
        faults.restore()
        rec.event("run", "faults and actions over: convergence clock starts")
        for th in threads[: 5 if plan.vm_updates else 4]:  # the operators and the faults
            th.join(CALL_TIMEOUT * 6)
        chaos_end = rec.now()
        convergence = converge(fleet, operator, rec, settings.converge_within)
        final_reads(operator, rec, plan)
        stop.set()
        for th in threads:
            th.join(15)
        killed = power_cut(fleet)
        rec.event("run", f"power cut: {len(killed)} processes killed -9; checking what they left")
        integrity = check_all(fleet)
        result = judge(settings, plan, rec, faults, sampler, convergence, chaos_end, integrity)
        write_report(settings, plan, rec, faults, sampler, result)
        return result
    finally:
        stop.set()
        actions_stop.set()
        fleet.stop()


def _apply_steady(operator: Operator, rec: Recorder, fleet: Fleet) -> None:
    """``steady`` on every real device, ``soak-t`` on all but one (at least one)."""
    setup = [
        Action(0.0, "apply", f"ModelDeployment/{STEADY}", "root", "1.0.0"),
        Action(0.0, "apply", f"ModelDeployment/{PLACED}", "root", "1.0.0",
               total=placed_total(fleet)),
    ]  # fmt: skip
    if fleet.vms:
        setup.append(Action(0.0, "apply", f"ModelDeployment/{VM_DEPLOYMENT}", "root", "1.0.0"))
    for action in setup:
        deadline = time.monotonic() + 60
        while True:
            op = operator.perform(action, "setup")
            if op is not None and op.outcome == "ok":
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{action.key} was not applied: {rec.events[-1]}")
            time.sleep(1)


def wait_vms_serving(fleet: Fleet, rec: Recorder, timeout: float) -> None:
    """Until every lab VM serves soak-v (a download and a load under TCG); one that does not
    within ``timeout`` is a violation event and the run goes on (the convergence check names
    it)."""
    deadline = time.monotonic() + timeout
    for k, vm in enumerate(fleet.vms):
        while (view := replicas_of(vm.status(), VM_DEPLOYMENT)) is None or not view[0]:
            if time.monotonic() > deadline:
                rec.event("violation", f"vm-{k}: {VM_DEPLOYMENT} not served within {timeout:g}s")
                return
            time.sleep(2)


def placed_devices(fleet: Fleet) -> list[str]:
    """The devices where soak-t has a ready replica, in their own view."""
    out = []
    for i, e in enumerate(fleet.edged):
        view = replicas_of(edged_status(e.data), PLACED)
        if view is not None and view[0]:
            out.append(f"dev-{i}")
    return out


def wait_placed(fleet: Fleet, rec: Recorder, timeout: float) -> None:
    """Until soak-t runs on as many devices as it asks; if it does not within ``timeout``, the
    run goes on with a violation event (the convergence check reports it with the devices)."""
    deadline = time.monotonic() + timeout
    while len(placed := placed_devices(fleet)) != placed_total(fleet):
        if time.monotonic() > deadline:
            rec.event(
                "violation",
                f"{PLACED} runs on {placed} within {timeout:g}s of its apply, "
                f"{placed_total(fleet)} placed",
            )
            return
        time.sleep(0.5)


def placed_total(fleet: Fleet) -> int:
    """Every device but one (a spare to move to), or every device when there are two or
    fewer: then a device on the follower always holds one (docs/soak.md, defects)."""
    n = len(fleet.edged)
    return n if n <= 2 else n - 1


def _operate(
    operator: Operator, actions: list[Action], name: str, stop: threading.Event, rec: Recorder
) -> None:
    for action in actions:
        while not stop.is_set() and rec.now() < action.at:
            stop.wait(min(0.5, action.at - rec.now()))
        if stop.is_set():
            return
        try:
            operator.perform(action, name)
        except Exception as exc:
            rec.event("harness-error", f"{name} {action}: {exc!r}")


def dump_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)


__all__ = ["BROKEN", "Plan", "Settings", "run"]
