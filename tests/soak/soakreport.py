"""The end of a soak run: the convergence wait, the final reads, each invariant judged with its
figures, and the report (``report.json``, ``report.txt``, ``events.jsonl`` in the run's
directory). A failed invariant names the seed and prints the events around it."""

from __future__ import annotations

import math
import re
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from soakhistory import check, describe
from soakplan import BROKEN, CLASSES, DEPLOYMENTS, VM_DEPLOYMENT, Action, Plan
from soakrun import (
    PLACED,
    STEADY,
    FaultRunner,
    Operator,
    Recorder,
    Sampler,
    Settings,
    dump_json,
    edged_status,
)

from edgectl.client import ClientError

WINDOW = 15.0  # seconds of events shown either side of a failure


# -- convergence ----------------------------------------------------------------------------
def converge(fleet: Any, operator: Operator, rec: Recorder, within: float) -> dict[str, Any]:
    """Wait until every device runs what the root says, ``within`` seconds at most."""
    began = rec.now()
    problems: list[str] = ["not checked yet"]
    while rec.now() - began < within:
        refused: list[str] = []
        problems = _problems(fleet, operator, refused)
        if not problems:
            seconds = rec.now() - began
            rec.event("run", f"converged {seconds:.1f}s after the faults ended")
            out = {"converged": True, "seconds": round(seconds, 2), "bound_s": within}
            if refused:  # held by their own anti-rollback guard, and the region says so
                rec.event("run", f"devices refusing a downgrade, named by the region: {refused}")
                out["refused"] = refused
            return out
        time.sleep(2.0)
    rec.event("violation", f"not converged within {within:g}s: {problems[:5]}")
    return {
        "converged": False,
        "seconds": None,
        "bound_s": within,
        "problems": problems[:20],
        "views": _views(fleet, operator),
    }


class Lag:
    """Convergence lag over the run (``convergence-lag.png``): every few seconds, the devices
    out of step with the root (the convergence check's own judgement, ``_problems``); each
    real device's lag is the seconds since it was last in step (0 when in step), and the
    simulated devices' the seconds since all of them were."""

    def __init__(self, fleet: Any, operator: Operator, rec: Recorder) -> None:
        self.fleet, self.operator, self.rec = fleet, operator, rec
        names = [f"dev-{i}" for i in range(len(fleet.edged))]
        self.last_in_step = {n: 0.0 for n in [*names, "simulated"]}
        self.series: dict[str, list[tuple[float, float] | None]] = {
            n: [] for n in self.last_in_step
        }

    def sample(self) -> None:
        t = self.rec.now()
        problems = _problems(self.fleet, self.operator)
        if any(p.startswith("root: ") for p in problems):
            return  # the root did not answer: nothing known of what it wants
        out = {p.split(":", 1)[0] for p in problems}
        sims_out = any(name.startswith("sim-") or "simulated" in name for name in out)
        for name in self.last_in_step:
            behind = sims_out if name == "simulated" else name in out
            if not behind:
                self.last_in_step[name] = t
            self.series[name].append((round(t, 2), round(t - self.last_in_step[name], 2)))


def _views(fleet: Any, operator: Operator) -> dict[str, Any]:
    """What the root and the region say of each deployment, and what each device runs: the
    evidence kept in report.json when the fleet did not converge."""
    views: dict[str, Any] = {}
    for hub in ("root", "eu-r0"):
        for name in (STEADY, PLACED, *DEPLOYMENTS):
            try:
                with operator.client(hub) as client:
                    doc = client.get("ModelDeployment", name)
                views[f"{hub}/{name}"] = {"spec": doc.get("spec"), "status": doc.get("status")}
            except ClientError as exc:
                views[f"{hub}/{name}"] = str(exc)
    for i, e in enumerate(fleet.edged):
        views[f"dev-{i}"] = (edged_status(e.data) or {}).get("workloads")
    return views


def refusal(
    failing: dict[str, Any], device: str, allowed: dict[tuple[str, str], float] | None = None
) -> str | None:
    """The region's word that ``device`` refuses the deployment's signed metadata as a
    rollback (pure): the device's anti-rollback guard, by design (docs/trust.md), which an
    operator's downgrade or a re-created deployment meets without a publisher's rollback
    allowance: once a device accepted a model's newer metadata (the broken 9.0.0, pushed
    last), it refuses the older ones, 1.0.0 and 1.1.0 alike. Such a device converges to the
    region naming it, not to the version. The region may name the refusal of the version it
    went back to rather than the root's (its rollout rolled back on the refusal). Its model
    version guard is the same design (``ModelVersionRollback``: below the highest version it
    accepted, no allowance in force): seed 62's run E ended with dev-1 refusing soak-b 1.0.0
    so after it accepted 9.0.0, the last allowance push of 1.0.0 having failed while the root
    was down; the check named only the metadata guard.

    ``allowed``: the rollback allowances in force in the root's signed targets, ``(name,
    version) -> expires`` (:func:`allowances_in_force`). A model version refusal of a version
    an allowance covers is not by design: the device should have taken it (docs/trust.md,
    "Rollback allowance"), so it is not excused. The metadata guard stays excused: a later
    allowance push of another version of the model signs its metadata newer."""
    said = str(failing.get(device, ""))
    found = _REFUSED_ROLLBACK.match(said)
    if found is None:
        return None
    guard = _VERSION_GUARD.match(said)
    if guard is not None and (guard["name"], guard["version"]) in (allowed or {}):
        return None
    return said


_REFUSED_ROLLBACK = re.compile(r"[0-9][^ ]* Refused: (MetadataRollback|ModelVersionRollback):")
_VERSION_GUARD = re.compile(
    r"[0-9][^ ]* Refused: ModelVersionRollback: (?P<name>[^ ]+) (?P<version>[^ ]+) is older"
)


def allowances_in_force(tuf_dir: Path, now: float) -> dict[tuple[str, str], float]:
    """The rollback allowances the root's publishers sign into their delegated targets
    (``TUF/delegated/ROLE.json``, docs/trust.md) that have not expired at ``now``: ``(name,
    version) -> expires``. The root's own repository files, written by rename: what the
    devices are given, through the region, once it has caught up. Unreadable files count as
    no allowance (the convergence check then excuses nothing less than before)."""
    from tuf.api.metadata import Targets

    from edgefleet.errors import EdgefleetError
    from edgefleet.trust import tufmeta

    out: dict[tuple[str, str], float] = {}
    for path in sorted((tuf_dir / "delegated").glob("*.json")):
        try:
            signed, _ = tufmeta.parse(path.read_bytes(), Targets, what=path.name)
            for target_path, target in signed.targets.items():
                grant = tufmeta.rollback_grant(target, what=target_path)
                if grant is not None and grant.expires > now:
                    out[(grant.name, grant.version)] = grant.expires
        except (OSError, EdgefleetError):
            continue
    return out


def _problems(fleet: Any, operator: Operator, refused: list[str] | None = None) -> list[str]:
    """What keeps the fleet from what the root wants; ``refused`` gets the devices that
    refuse it by design and are named for it by the region (:func:`refusal`)."""
    problems: list[str] = []
    try:
        with operator.client("root") as client:
            desired = {}
            for name in (STEADY, PLACED, *DEPLOYMENTS, *([VM_DEPLOYMENT] if fleet.vms else [])):
                try:
                    desired[name] = client.get("ModelDeployment", name)
                except ClientError as exc:
                    if exc.code != "NOT_FOUND":
                        return [f"root: {exc}"]
    except ClientError as exc:
        return [f"root: {exc}"]
    statuses = [edged_status(e.data) for e in fleet.edged]
    sims = fleet.sims().get("devices", {})
    allowed = allowances_in_force(fleet.root.data / "tuf", time.time())
    total = ((desired.get(PLACED) or {}).get("spec") or {}).get("replicas", {}).get("total")
    holding = []
    for i, status in enumerate(statuses):
        work = next((w for w in (status or {}).get("workloads", []) if w.get("name") == PLACED),
                    None)  # fmt: skip
        if work is None:
            continue
        holding.append(f"dev-{i}")
        if not work.get("replicas") or not all(r.get("ready") for r in work["replicas"]):
            problems.append(f"dev-{i}: {PLACED} not ready")
    if len(holding) != total:
        problems.append(f"{PLACED} on {holding}, {total} wanted")
    problems += _vm_problems(fleet, desired.get(VM_DEPLOYMENT), allowed)
    for name in (STEADY, *DEPLOYMENTS):
        doc = desired.get(name)
        spec = (doc or {}).get("spec", {})
        version = spec.get("model", {}).get("version")
        status = (doc or {}).get("status", {})
        # the region's own rollout: the root's status.rollout is of the root's own devices
        # (none here) and says Complete for a revision its region rolled back (docs/soak.md)
        region = status.get("regions", {}).get("eu") or {}
        phase = (region.get("rollout") or {}).get("phase", "")
        failing = region.get("failing") or {}
        if name == "soak-sim":
            for sim, held in sims.items():
                if held.get(name) != version:
                    problems.append(f"{sim}: {name} {held.get(name)} (the root: {version})")
            if doc is not None and len(sims) < fleet.sim_devices:
                problems.append(f"{len(sims)} of {fleet.sim_devices} simulated devices heard from")
            continue
        per_device = spec.get("replicas", {}).get("perDevice", 1)
        serving = set()
        for i, status in enumerate(statuses):
            if status is None:
                problems.append(f"dev-{i}: no status")
                continue
            work = next((w for w in status.get("workloads", []) if w.get("name") == name), None)
            if doc is None:
                if work is not None:
                    problems.append(f"dev-{i}: runs {name}, deleted at the root")
                continue
            said = refusal(failing, f"dev-{i}", allowed)
            if said is None and refusal(failing, f"dev-{i}") is not None:
                problems.append(
                    f"dev-{i}: {name} {str(failing[f'dev-{i}'])[:120]}, though an allowance "
                    "in the root's signed targets covers that version"
                )
                continue
            if said is not None:
                if refused is not None:
                    refused.append(f"dev-{i}: {name} {said[:120]}")
                continue
            if work is None:
                problems.append(f"dev-{i}: does not run {name}")
                continue
            replicas = work.get("replicas", [])
            versions = {str(r.get("version")) for r in replicas}
            ready = [r for r in replicas if r.get("ready")]
            if len(ready) != per_device or len(replicas) != per_device or len(versions) != 1:
                problems.append(
                    f"dev-{i}: {name} replicas {len(ready)}/{len(replicas)} ready "
                    f"of {per_device}, versions {sorted(versions)}"
                )
                continue
            serving |= versions
        if doc is None or len(serving) != 1:
            if len(serving) > 1:
                problems.append(f"{name}: devices serve {sorted(serving)}")
            continue
        (served,) = serving
        if served == BROKEN:
            problems.append(f"{name}: devices serve the broken version")
        elif served != version and phase != "RolledBack":
            problems.append(f"{name}: devices serve {served}, the root wants {version} ({phase})")
    return problems


def _vm_problems(
    fleet: Any, doc: dict[str, Any] | None, allowed: dict[tuple[str, str], float]
) -> list[str]:
    """What keeps the lab VMs (``--vm-devices``) from soak-v at the root's version, one ready
    replica each, or a refusal by design that the region names (:func:`refusal`)."""
    problems: list[str] = []
    if not fleet.vms:
        return problems
    spec = (doc or {}).get("spec", {})
    version = spec.get("model", {}).get("version")
    region = ((doc or {}).get("status", {}).get("regions", {}) or {}).get("eu") or {}
    phase = (region.get("rollout") or {}).get("phase", "")
    failing = region.get("failing") or {}
    for k, vm in enumerate(fleet.vms):
        status = vm.status()
        if status is None:
            problems.append(f"vm-{k}: no status (booting, or cut)")
            continue
        if doc is None:
            continue
        name = str(status.get("device", {}).get("name") or status.get("name") or f"vm-{k}")
        if refusal(failing, name, allowed) is not None:
            continue
        work = next(
            (w for w in status.get("workloads", []) if w.get("name") == VM_DEPLOYMENT), None
        )
        replicas = (work or {}).get("replicas", [])
        ready = {str(r.get("version")) for r in replicas if r.get("ready")}
        if len(replicas) != 1 or not ready:
            problems.append(f"vm-{k}: {VM_DEPLOYMENT} replicas {replicas}")
        elif ready != {version} and phase != "RolledBack":
            problems.append(f"vm-{k}: {VM_DEPLOYMENT} {sorted(ready)}, the root wants {version}")
    return problems


def final_reads(operator: Operator, rec: Recorder, plan: Plan) -> None:
    """One read of every key at the end, at each hub that serves it: in the history, these
    are what "no acknowledged write lost" is checked against."""
    names = (STEADY, PLACED, *DEPLOYMENTS, *([VM_DEPLOYMENT] if plan.vm_updates else []))
    reads = [Action(0, "read", f"ModelDeployment/{n}", "root") for n in names]
    for hub in ("eu-r0", "eu-r1"):
        reads += [Action(0, "read", f"PriorityClass/{n}", hub) for n in CLASSES]
        # every device the operator's stream tried to enroll: there at both replicas, or not
        reads += [Action(0, "read", a.key, hub) for a in plan.enrollments]
    for action in reads:
        for _ in range(10):  # a read that fails is not in the history: try again
            op = operator.perform(action, "final")
            if op is not None and op.outcome == "ok":
                break
            time.sleep(1)


# -- the invariants ---------------------------------------------------------------------------
def judge(
    settings: Settings,
    plan: Plan,
    rec: Recorder,
    faults: FaultRunner,
    sampler: Sampler,
    convergence: dict[str, Any],
    chaos_end: float,
    integrity: list[dict[str, Any]],
) -> dict[str, Any]:
    failures: list[dict[str, Any]] = []
    # 1. linearizability of the history (no acknowledged write lost, no stale read)
    lin = check(rec.ops)
    outcomes = Counter(f"{op.kind}:{op.outcome}" for op in rec.ops)
    enrolled = Counter(
        op.outcome for op in rec.ops if op.key.startswith("Device/") and op.kind == "write"
    )
    lin_figures = {
        "enrollments": dict(sorted(enrolled.items())),
        "rollback_allowances": dict(sorted(rec.allowances.items())),
        "operations": len(rec.ops),
        "by_outcome": dict(sorted(outcomes.items())),
        "keys": {k.key: {"ops": k.ops, "linearizable": k.ok} for k in lin.keys},
    }
    for k in lin.failures:
        at = k.stuck_at.start if k.stuck_at is not None else chaos_end
        failures.append({"invariant": "linearizable", "t": at, "text": describe(k)})
    # 2. convergence after the faults
    if not convergence["converged"]:
        failures.append(
            {
                "invariant": "converged",
                "t": chaos_end,
                "text": f"not converged within {convergence['bound_s']}s: "
                f"{convergence.get('problems', [])[:5]}",
            }
        )
    # 3. the rollout budget, sampled on the devices
    budget = {
        "samples": sampler.budget_samples,
        "max_switching": sampler.budget_max,
        "budget": 1,
        "violations": len(sampler.budget_violations),
    }
    for v in sampler.budget_violations[:3]:
        failures.append({"invariant": "rollout budget", "t": v["t"], "text": str(v)})
    # 4. inference outside the device's own faults
    for device, figures in sampler.inference.items():
        for e in figures["unexcused"][:3]:
            failures.append(
                {
                    "invariant": "inference",
                    "t": e["t"],
                    "text": f"{device}: {STEADY} answered {e['status']} outside a "
                    "fault of that device",
                }
            )
    inference = {
        d: {k: v for k, v in f.items() if k not in ("unexcused", "times")}
        | {"unexcused": len(f["unexcused"])}
        for d, f in sampler.inference.items()
    }
    # 5. no replica of soak-t moved off a device Ready and connected in its own view
    unexcused = [m for m in sampler.moves if m["excused"] is None]
    for m in unexcused[:3]:
        failures.append(
            {
                "invariant": "ready moves",
                "t": m["t"],
                "text": f"{PLACED} moved off {m['device']}, connected in its own view with "
                f"no fault of its own or of its replica in the {sampler.lookback:g}s before",
            }
        )
    moves = {
        "ok": not unexcused,
        "moves": len(sampler.moves),
        "excused": len(sampler.moves) - len(unexcused),
        "unexcused": len(unexcused),
        "lookback_s": sampler.lookback,
        "samples": sum(len(v) for v in sampler.views.values()),
        "each": sampler.moves[:50],
    }
    # 6. growth of RSS and descriptors, per process life (a restarted process starts again)
    growth = _growth(sampler.resources, _etcd_ready(getattr(sampler, "etcd_samples", {})))
    # a hub replica that started again takes its devices' connections back: one descriptor
    # each, on top of the bound (the first samples of its life come before they reconnect)
    devices = settings.real_devices + settings.sim_devices
    # the harness itself (a self-check): its relays carry the connections of the devices in a
    # namespace and of those at eu-r1, two descriptors and two threads each, on top of the bound
    threads = _thread_growth(getattr(sampler, "harness_threads", []))
    if "harness" in growth:
        growth["harness"].update(threads)
    for name, figures in _etcd_lives(getattr(sampler, "etcd_samples", {}), growth).items():
        growth[name]["etcd"] = figures
    for name, g in growth.items():
        slack = devices if name.startswith("eu-") else 2 * devices if name == "harness" else 0
        fd_bound = settings.fd_growth + slack
        g["fd_bound"] = fd_bound
        grew = g.get("thread_growth", 0) > fd_bound
        if g["rss_growth_mib"] > settings.rss_growth_mib or g["fd_growth"] > fd_bound or grew:
            more = f", threads +{g['thread_growth']}" if "thread_growth" in g else ""
            failures.append(
                {
                    "invariant": "growth",
                    "t": g["last_t"],
                    "text": f"{name}: RSS +{g['rss_growth_mib']:.1f} MiB, "
                    f"descriptors +{g['fd_growth']}{more} over {g['seconds']:.0f}s",
                }
            )
    exhausted = getattr(sampler, "harness_exhausted", None)
    if exhausted is not None:
        failures.append(
            {
                "invariant": "growth",
                "t": growth.get("harness", {}).get("last_t", rec.now()),
                "text": f"the harness ended the chaos early: {exhausted}",
            }
        )
    sims_ended = getattr(sampler, "sims_ended", None)
    if sims_ended is not None:  # every simulated device silent from then on: not evidence
        failures.append(
            {
                "invariant": "growth",
                "t": rec.now(),
                "text": f"the harness: the simulated devices' process ended ({sims_ended})",
            }
        )
    # 7. nothing half-written: every store, state file and artifact after the power cut
    for c in integrity:
        if not c["ok"]:
            failures.append(
                {"invariant": "intact", "t": rec.now(), "text": f"{c['what']}: {c['detail']}"}
            )
    harness_errors = [e for e in rec.events if e["kind"] in ("harness-error", "fault-error")]
    by_kind = Counter(f"{w['kind']}:{w['action']}" for w in faults.windows)
    for f in failures:
        f["window"] = [e for e in rec.events if abs(e["t"] - f["t"]) <= WINDOW]
    return {
        "ok": not failures,
        "seed": settings.seed,
        "duration_s": settings.duration,
        "devices": {"real": settings.real_devices, "simulated": settings.sim_devices},
        "faults": {
            "not_run_here": dict(getattr(sampler.fleet, "unsupported", {})),
            "total": len(faults.windows),
            "by_kind": dict(sorted(by_kind.items())),
            "planned": len(plan.faults),
        },
        "actions": {"planned": len(plan.actions)},
        "invariants": {
            "linearizable": {"ok": lin.ok, **lin_figures},
            "converged": {"ok": convergence["converged"], **convergence},
            "rollout_budget": {"ok": not sampler.budget_violations, **budget},
            "inference": {
                "ok": not any(f["unexcused"] for f in sampler.inference.values()),
                "grace_s": 30,
                "devices": inference,
            },
            "ready_moves": moves,
            "intact": {"ok": all(c["ok"] for c in integrity), "checks": integrity},
            "growth": {
                "ok": not any(f["invariant"] == "growth" for f in failures),
                "bounds": {"rss_mib": settings.rss_growth_mib, "fds": settings.fd_growth},
                "processes": growth,
            },
        },
        "harness_errors": [e["text"] for e in harness_errors][:20],
        "failures": failures,
    }


def _etcd_ready(samples: dict[str, list[dict[str, Any]]]) -> dict[tuple[str, int], float]:
    """When each etcd member's life (name, pid) first answered its ``/metrics``: it had
    loaded its snapshot and replayed its WAL by then."""
    out: dict[tuple[str, int], float] = {}
    for name, series in samples.items():
        for s in series:
            out.setdefault((name, int(s["pid"])), float(s["t"]))
    return out


def _growth(
    resources: dict[str, list[tuple[float, int, int, int]]],
    ready_at: dict[tuple[str, int], float] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per process name: its longest life (one pid), from the median of its first samples
    (after 5 s, and once it answered where ``ready_at`` knows when: an etcd member loading
    its data from a slow disk took 94 s, and its growth counted the load: seed 62, run E)
    to the median of its last ones."""
    ready_at = ready_at or {}
    out: dict[str, dict[str, Any]] = {}
    for name, samples in resources.items():
        lives: dict[int, list[tuple[float, int, int, int]]] = {}
        for s in samples:
            lives.setdefault(s[1], []).append(s)
        life = max(lives.values(), key=lambda v: v[-1][0] - v[0][0])
        ready = ready_at.get((name, life[0][1]), -math.inf)
        settled = [s for s in life if s[0] - life[0][0] >= 5.0 and s[0] >= ready] or life
        head, tail = settled[:3], settled[-3:]
        rss0 = statistics.median(s[2] for s in head)
        rss1 = statistics.median(s[2] for s in tail)
        fd0 = statistics.median(s[3] for s in head)
        fd1 = statistics.median(s[3] for s in tail)
        out[name] = {
            "pid": life[0][1],
            "lives": len(lives),
            "seconds": round(tail[-1][0] - head[0][0], 1),
            "rss_mib": [round(rss0 / 2**20, 1), round(rss1 / 2**20, 1)],
            "rss_growth_mib": round((rss1 - rss0) / 2**20, 1),
            "fds": [int(fd0), int(fd1)],
            "fd_growth": int(fd1 - fd0),
            "last_t": tail[-1][0],
        }
    return out


def _etcd_lives(
    samples: dict[str, list[dict[str, Any]]], growth: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per etcd member, over the life its growth is judged on (the same pid): the raft
    entries it committed, the bytes it wrote to its WAL, the snapshots it saved, its Go heap
    at the first and last sample (pure: the sampler's figures in, the report's out). What
    the member holds since its last snapshot is in memory (docs/etcd.md)."""
    out = {}
    for name, series in samples.items():
        pid = growth.get(name, {}).get("pid")
        life = [s for s in series if s["pid"] == pid]
        if len(life) < 2:
            continue
        first, last = life[0], life[-1]

        def delta(key: str, a: dict[str, Any] = first, b: dict[str, Any] = last) -> int:
            return int(b.get(key, 0)) - int(a.get(key, 0))

        out[name] = {
            "seconds": round(last["t"] - first["t"], 1),
            "entries": delta("entries"),
            "wal_mb": round(delta("wal_bytes") / 1e6, 1),
            "snapshots": delta("snapshots"),
            "heap_mib": [
                round(first.get("heap_bytes", 0) / 2**20, 1),
                round(last.get("heap_bytes", 0) / 2**20, 1),
            ],
        }
    return out


def _thread_growth(samples: list[tuple[float, int]]) -> dict[str, Any]:
    """The harness's threads, as ``_growth`` judges descriptors: the median of its first
    samples (after 5 s) to the median of its last ones."""
    if not samples:
        return {}
    settled = [s for s in samples if s[0] - samples[0][0] >= 5.0] or samples
    t0 = statistics.median(s[1] for s in settled[:3])
    t1 = statistics.median(s[1] for s in settled[-3:])
    return {"threads": [int(t0), int(t1)], "thread_growth": int(t1 - t0)}


# -- the report -----------------------------------------------------------------------------
def write_report(
    settings: Settings,
    plan: Plan,
    rec: Recorder,
    faults: FaultRunner,
    sampler: Sampler,
    result: dict[str, Any],
) -> None:
    d = settings.directory
    from soakplots import plot_run

    errors = {device: f["times"] for device, f in sampler.inference.items()}
    lags = getattr(sampler, "lags", None)
    result["plots"] = plot_run(d, sampler.resources, errors, faults.windows, rec.now(), lags)
    dump_json(
        d / "report.json",
        {**result, "fault_windows": faults.windows, "resources": sampler.resources},
    )
    with (d / "events.jsonl").open("w") as f:
        import json

        for e in rec.events:
            f.write(json.dumps(e, default=str) + "\n")
    text = render(result)
    (d / "report.txt").write_text(text)
    print(text, flush=True)


def render(result: dict[str, Any]) -> str:
    inv = result["invariants"]
    lines = [
        f"soak run: seed {result['seed']}, {result['duration_s']:g}s of faults and actions, "
        f"{result['devices']['real']} real + {result['devices']['simulated']} simulated devices: "
        + ("PASSED" if result["ok"] else "FAILED"),
        f"faults injected: {result['faults']['total']} "
        + ", ".join(f"{k} {v}" for k, v in result["faults"]["by_kind"].items()),
        *(
            f"fault kind not run here: {kind}: {why}"
            for kind, why in result["faults"]["not_run_here"].items()
        ),
        f"operations: {inv['linearizable']['operations']} "
        + ", ".join(f"{k} {v}" for k, v in inv["linearizable"]["by_outcome"].items()),
        "token enrollments at either replica (a token, then edged enroll with it): "
        + (", ".join(f"{k} {v}" for k, v in inv["linearizable"]["enrollments"].items()) or "none")
        + "; each device read at both replicas at the end",
        "rollback allowances (a version pushed again with --allow-rollback before its apply): "
        + (
            ", ".join(f"{k} {v}" for k, v in inv["linearizable"]["rollback_allowances"].items())
            or "none"
        ),
        f"[{'ok' if inv['linearizable']['ok'] else 'FAIL'}] linearizable: "
        + ", ".join(f"{k} ({v['ops']} ops)" for k, v in inv["linearizable"]["keys"].items()),
        f"[{'ok' if inv['converged']['ok'] else 'FAIL'}] converged: "
        + (
            f"{inv['converged']['seconds']}s after the faults"
            if inv["converged"]["seconds"] is not None
            else "not within the bound: " + "; ".join(inv["converged"].get("problems", [])[:5])
        )
        + f" (bound {inv['converged']['bound_s']:g}s)"
        + (
            f"; refusing a downgrade by design, named by the region: "
            f"{len(inv['converged']['refused'])} ({inv['converged']['refused'][0]}, ...)"
            if inv["converged"].get("refused")
            else ""
        ),
        f"[{'ok' if inv['rollout_budget']['ok'] else 'FAIL'}] rollout budget: at most "
        f"{inv['rollout_budget']['max_switching']} devices switching at once (budget 1) over "
        f"{inv['rollout_budget']['samples']} samples",
        f"[{'ok' if inv['inference']['ok'] else 'FAIL'}] inference outside device faults: "
        + ", ".join(
            f"{d}: {f['requests']} requests, {f['errors']} errors "
            f"({f['errors_excused']} in the device's fault windows)"
            for d, f in inv["inference"]["devices"].items()
        ),
        f"[{'ok' if inv['ready_moves']['ok'] else 'FAIL'}] no replica moved off a Ready device: "
        f"{inv['ready_moves']['moves']} moves of {PLACED} seen on the devices, "
        f"{inv['ready_moves']['excused']} after a fault of the device or its replica or a "
        f"disconnection in its own view (look-back {inv['ready_moves']['lookback_s']:g}s), "
        f"{inv['ready_moves']['unexcused']} off a Ready device, over "
        f"{inv['ready_moves']['samples']} samples",
    ]
    lines.append(
        f"[{'ok' if inv['intact']['ok'] else 'FAIL'}] intact after a power cut of every hub, "
        f"edged and VM: {sum(c['ok'] for c in inv['intact']['checks'])} of "
        f"{len(inv['intact']['checks'])} checks pass"
    )
    lines += [
        f"    {'ok' if c['ok'] else 'FAIL'} {c['what']}: {c['detail']}"
        for c in inv["intact"]["checks"]
    ]
    lines.append(
        f"[{'ok' if inv['growth']['ok'] else 'FAIL'}] growth (bound RSS "
        f"+{inv['growth']['bounds']['rss_mib']:g} MiB, +{inv['growth']['bounds']['fds']} fds):"
    )
    for name, g in inv["growth"]["processes"].items():
        lines.append(
            f"    {name}: RSS {g['rss_mib'][0]} -> {g['rss_mib'][1]} MiB, fds "
            f"{g['fds'][0]} -> {g['fds'][1]}"
            + (f", threads {g['threads'][0]} -> {g['threads'][1]}" if "threads" in g else "")
            + f" over {g['seconds']:g}s ({g['lives']} lives)"
        )
        if "etcd" in g:
            e = g["etcd"]
            lines.append(
                f"      etcd's own figures over {e['seconds']:g}s of that life: "
                f"{e['entries']} entries committed, {e['wal_mb']:g} MB to its WAL, "
                f"{e['snapshots']} snapshots, Go heap {e['heap_mib'][0]} -> "
                f"{e['heap_mib'][1]} MiB"
            )
    for plot in result.get("plots", []):
        series = ", ".join(f"{name} {colour}" for name, colour in plot["series"].items())
        lines.append(
            f"plot {plot['file']}: t {plot['t']} s, y {plot['y']}, fault windows shaded; {series}"
        )
    if result["harness_errors"]:
        lines.append(f"harness errors: {result['harness_errors'][:5]}")
    for f in result["failures"]:
        lines.append(f"FAILED {f['invariant']} at t={f['t']:.1f}s (seed {result['seed']}):")
        lines += [f"  {line}" for line in f["text"].splitlines()]
        lines.append(f"  events within {WINDOW:g}s:")
        lines += [f"    {e['t']:8.2f} {e['kind']}: {e['text']}" for e in f["window"][:40]]
    if not result["ok"]:
        lines.append(
            f"reproduce: python -m tests.soak.run --seed {result['seed']} "
            f"--duration {result['duration_s']:g}"
        )
    return "\n".join(lines) + "\n"


__all__ = ["Lag", "converge", "final_reads", "judge", "math", "write_report"]
