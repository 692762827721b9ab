"""The soak harness's command line (docs/soak.md)::

    .venv/bin/python -m tests.soak.run --seed 7 --duration 3600 --dir /tmp/soak-7

Runs the fleet under the seed's faults and operator actions for ``--duration`` seconds, waits
for it to converge, judges the invariants and writes the report into ``--dir``. Exits 0 when
every invariant held, 1 otherwise (the report names the seed and the events around each
failure)."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    for path in (HERE.parent.parent, HERE.parent, HERE.parent / "e2e", HERE):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    from soakrun import Settings, run

    parser = argparse.ArgumentParser(prog="python -m tests.soak.run", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of faults")
    parser.add_argument("--dir", type=Path, default=None, help="where the run and report go")
    parser.add_argument("--real-devices", type=int, default=2)
    parser.add_argument("--sim-devices", type=int, default=50)
    parser.add_argument("--converge-within", type=float, default=180.0)
    parser.add_argument("--fault-gap", type=float, default=8.0, help="mean seconds between faults")
    parser.add_argument("--action-gap", type=float, default=2.0, help="seconds between calls")
    parser.add_argument(
        "--disk-mib", type=int, default=64, help="size of the root's and dev-0's tmpfs (MiB)"
    )
    parser.add_argument(
        "--vm-devices",
        type=int,
        default=0,
        help="lab VMs (the device image in QEMU) whose power the faults cut; needs the VM lab's "
        "tools and root, or a built image in $EDGEFLEET_SOAK_VM_IMAGE",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.vm_devices <= 4:
        parser.error(f"--vm-devices: 0 to 4 (each is a 2-vCPU TCG guest), got {args.vm_devices}")
    if args.disk_mib < 16:
        parser.error(f"--disk-mib: at least 16 (a hub's state fits), got {args.disk_mib}")
    directory = args.dir or Path(tempfile.mkdtemp(prefix=f"soak-{args.seed}-"))
    settings = Settings(
        seed=args.seed,
        duration=args.duration,
        directory=directory,
        real_devices=args.real_devices,
        sim_devices=args.sim_devices,
        converge_within=args.converge_within,
        fault_gap=args.fault_gap,
        action_gap=args.action_gap,
        disk_mib=args.disk_mib,
        vm_devices=args.vm_devices,
    )
    # SIGTERM (a CI job stopped, a terminal closed) ends the run as Ctrl-C does: through its
    # cleanup, which stops the fleet; by default it left every hub, etcd member and edged
    # running, with the harness's mounts and namespaces
    signal.signal(signal.SIGTERM, _interrupted)
    result = run(settings)
    print(f"report: {directory / 'report.txt'}, {directory / 'report.json'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
