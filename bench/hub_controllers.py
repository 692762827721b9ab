"""The hub's work per change (BENCHMARKS.md, "Hub work per change"): the cost of one rollout
step and of one device report, at 1,000 and 10,000 simulated devices with 50 deployments.

In process, no network: a ``memory://`` store, the cache filled directly, the real rollout
controller and projector (:mod:`hub.controllers.rollout`, :mod:`hub.state.projector`) driven
pass by pass. The fleet: N devices in 50 groups (label ``group``), one deployment per group
(``perDevice: 1``, ``maxSurge: 10%``), every device serving its deployment's 1.0.0.

* **rollout step**: 2.0.0 is applied to one deployment; after each step its devices given
  2.0.0 report it Ready, and the controller's reaction is timed: the next step written and
  the devices it changes projected again. Median over the rollout's steps.
* **device report**: a device of a finished deployment reports a phase change (its workload
  Loading, then Ready again); the controller's reaction is timed. Median over 20 reports.

Figures: CPU seconds per change (``time.process_time``: the machine is shared) and devices
projected per change, against N and against the devices the change touched. The same bench
runs on the code before issue 30's per-key controllers (``git worktree add /tmp/old d958de4``,
``PYTHONPATH=/tmp/old python bench/hub_controllers.py``): there a pass sweeps every deployment
and a step projects every device.

    .venv/bin/python bench/hub_controllers.py [--devices 1000 10000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEPLOYMENTS = 50
REPORTS = 20
SHA = {"1.0.0": "a" * 64, "2.0.0": "b" * 64}


def manifest(group: int, version: str) -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": f"dep-{group}"},
        "spec": {
            "model": {"name": "bench", "version": version},
            "replicas": {"perDevice": 1},
            "placement": {"nodeSelector": {"group": f"g{group}"}},
            "rollout": {"maxSurge": "10%", "maxUnavailable": 0},
        },
    }


class Fleet:
    """The cache, the controller and the projector of one simulated fleet."""

    def __init__(self, devices: int, deployments: int = DEPLOYMENTS) -> None:
        self.n = devices
        self.deployments = deployments
        self.projected = 0

    async def start(self) -> None:
        from hub.decide.devices import Device, DevicePhase
        from hub.state import storekeys
        from hub.state.cache import Cache
        from hub.state.projector import Projector
        from hub.state.sessions import Sessions
        from hub.state.store import open_hub_store
        from hub.state.writer import DeviceWriter

        self.store = await open_hub_store("memory://", data_dir=Path("/nonexistent"))
        cache = self.cache = Cache()
        for version, sha in SHA.items():
            cache.models[("bench", version)] = storekeys.ModelRecord(
                "bench", version, sha, 1, b"", 0.0
            )
        for i in range(self.n):
            name = f"d{i:05d}"
            cache.devices[name] = Device(
                name, labels={"group": f"g{i % self.deployments}"}, phase=DevicePhase.READY
            )
        self.writer = DeviceWriter(self.store, cache)
        self.projector = Projector(self.store, cache, Sessions(), region="eu")
        self.rollouts = self._controller()
        counted = self.projector.project

        async def project(names: Any) -> None:
            names = set(names)
            self.projected += len(names)
            await counted(names)

        self.projector.project = project  # type: ignore[method-assign]
        for group in range(self.deployments):
            self.apply(group, "1.0.0")
        await self.settle()
        for _ in range(40):  # every device reports 1.0.0 Ready until every rollout is complete
            for name in list(cache.devices):
                self.report(name, ready=True)
            await self.settle()
            if all(s.phase.value == "Complete" for s in cache.rollouts.values()):
                break
        else:
            raise SystemExit("the fleet's first rollouts did not complete")

    def _controller(self) -> Any:
        from hub.controllers.rollout import RolloutController

        # no tick: what is timed is the reaction to a change, and a rollout's timer would
        # queue its deployment again in the middle of a slow machine's measurement
        return RolloutController(self.store, self.cache, self.projector, self.writer, tick=3600.0)

    def apply(self, group: int, version: str) -> None:
        stored = self.cache.stored.get(("ModelDeployment", f"dep-{group}"))
        self.cache.put_object(manifest(group, version), (stored.revision if stored else 0) + 1)

    def report(self, name: str, *, ready: bool, group: int | None = None) -> None:
        """``name`` reports the version its desired state holds for its deployment."""
        from hub.decide.devices import RevisionPhase, RevisionReport, WorkloadReport

        device = self.cache.devices[name]
        dep = f"dep-{int(device.labels['group'][1:])}"
        revision = self.cache.revision_for(dep, name)
        record = self.cache.desired.get(name)
        if revision is None or record is None or dep not in record.deployments:
            return
        version = revision.model[1]
        phase = RevisionPhase.READY if ready else RevisionPhase.LOADING
        rev = RevisionReport(version, SHA[version], phase, 1 if ready else 0, wanted=True)
        workload = WorkloadReport(version, desired_replicas=1, ready_replicas=rev.ready_replicas)
        workload = WorkloadReport(
            version, desired_replicas=1, ready_replicas=rev.ready_replicas, revisions=(rev,)
        )
        self.writer.update(device.with_(workloads={dep: workload}))

    async def react(self) -> None:
        """The projector's batch of what was marked (an apply marks every device: a rollout
        decides once they are placed), the controller's reaction, then the projector's batch."""
        await self.projector._project_marked()
        drain = getattr(self.rollouts, "drain", None)
        if drain is not None:  # per-key controllers: the keys the change feed queued
            await drain()
        else:  # before: one pass over every deployment
            await self.rollouts._pass()
        await self.projector._project_marked()

    async def settle(self) -> None:
        for _ in range(4):
            await self.react()

    def updated(self, dep: str) -> frozenset[str]:
        state = self.cache.rollouts[dep]
        return frozenset(state.updated)


async def measure(devices: int, deployments: int = DEPLOYMENTS) -> dict[str, Any]:
    fleet = Fleet(devices, deployments)
    t0 = time.monotonic()
    await fleet.start()
    setup_s = time.monotonic() - t0
    # -- rollout steps of dep-0 -------------------------------------------------------------
    fleet.apply(0, "2.0.0")
    await fleet.react()  # the new revision (the apply's own cost, not a step)
    steps: list[tuple[float, int, int]] = []
    for _ in range(40):
        state = fleet.cache.rollouts["dep-0"]
        if state.phase.value == "Complete":
            break
        before = fleet.updated("dep-0")
        for name in sorted(before):
            fleet.report(name, ready=True)
        fleet.projected = 0
        cpu = time.process_time()
        await fleet.react()
        cpu = time.process_time() - cpu
        touched = len(fleet.updated("dep-0") - before)
        if touched:
            steps.append((cpu, fleet.projected, touched))
        await fleet.settle()
    # -- device reports of finished deployments ---------------------------------------------
    reports: list[tuple[float, int]] = []
    for i in range(REPORTS):
        name = f"d{(i * 7 + 1) % devices:05d}"
        fleet.report(name, ready=False)
        await fleet.settle()
        fleet.report(name, ready=True)
        fleet.projected = 0
        cpu = time.process_time()
        await fleet.react()
        reports.append((time.process_time() - cpu, fleet.projected))
        await fleet.settle()
    step_cpu = statistics.median(s[0] for s in steps) if steps else float("nan")
    return {
        "devices": devices,
        "deployments": deployments,
        "setup_s": round(setup_s, 1),
        "steps": len(steps),
        "step_cpu_ms": round(step_cpu * 1000, 3),
        "step_projected": statistics.median(s[1] for s in steps) if steps else 0,
        "step_touched": statistics.median(s[2] for s in steps) if steps else 0,
        "report_cpu_ms": round(statistics.median(r[0] for r in reports) * 1000, 3),
        "report_projected": statistics.median(r[1] for r in reports),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument(
        "--deployments",
        type=int,
        default=DEPLOYMENTS,
        help="deployments the fleet is split into (default 50; 500 at 10,000 devices keeps a "
        "deployment's devices at 1,000's: a report's cost then stays that of 1,000)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from edgefleet.logs import configure_logging

    configure_logging("warning")
    import hub

    results = [asyncio.run(measure(n, args.deployments)) for n in args.devices]
    if args.json:
        print(json.dumps({"code": hub.__file__, "results": results}, indent=2))
        return
    print(f"code: {hub.__file__}")
    print(
        f"{'devices':>8} {'deps':>5} {'step ms':>9} {'projected':>9} {'touched':>8} "
        f"{'ms/touched':>10} {'report ms':>9} {'projected':>9}"
    )
    for r in results:
        per = r["step_cpu_ms"] / r["step_touched"] if r["step_touched"] else float("nan")
        print(
            f"{r['devices']:>8} {r['deployments']:>5} {r['step_cpu_ms']:>9.2f} "
            f"{r['step_projected']:>9} {r['step_touched']:>8} {per:>10.3f} "
            f"{r['report_cpu_ms']:>9.2f} {r['report_projected']:>9}"
        )
    if len(results) > 1:
        a, b = results[0], results[-1]
        print(
            f"x{b['devices'] / a['devices']:g} devices: step cost x"
            f"{b['step_cpu_ms'] / a['step_cpu_ms']:.1f}, report cost x"
            f"{b['report_cpu_ms'] / a['report_cpu_ms']:.1f}"
        )


if __name__ == "__main__":
    main()
