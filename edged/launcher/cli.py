"""``edged-launcher``'s command line (:mod:`edged.launcher`): ``cleanup``, or the launcher's
own options and edged's arguments; a launcher that fails runs the package's edged without it.
Stdlib only."""

from __future__ import annotations

import os
import sys

from edged.launcher.cleanup import CLEANUP, cleanup_main
from edged.launcher.state import _warn, data_dir_of
from edged.launcher.supervising import STOP_TIMEOUT_S, TRIAL_RESTART_DELAY_S, Launcher

USAGE = """usage: edged-launcher [--launcher-package-path DIR] [--launcher-python PYTHON]
                      [--launcher-stop-timeout SECONDS] EDGED-ARGS...
       edged-launcher cleanup [CGROUP-DIR]
Runs `python -m edged EDGED-ARGS` from the committed or trial slot (docs/agent-updates.md);
cleanup readies a stopped unit's cgroup for its next start, keeping workers (ExecStopPost=)."""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [CLEANUP]:
        return cleanup_main(args[1:])
    options: dict[str, str] = {}
    while args and args[0].startswith("--launcher-"):
        key, sep, value = args.pop(0).partition("=")
        if not sep:
            if not args:
                sys.stderr.write(f"edged-launcher: {key} needs a value\n{USAGE}\n")
                return 2
            value = args.pop(0)
        options[key] = value
    unknown = set(options) - {
        "--launcher-package-path",
        "--launcher-python",
        "--launcher-stop-timeout",
        "--launcher-restart-delay",
    }
    if unknown or not args or args[0] in ("-h", "--help"):
        sys.stderr.write(
            (f"edged-launcher: unknown {sorted(unknown)}\n" if unknown else "") + USAGE + "\n"
        )
        return 2
    try:
        stop_timeout = float(options.get("--launcher-stop-timeout", STOP_TIMEOUT_S))
        restart_delay = float(options.get("--launcher-restart-delay", TRIAL_RESTART_DELAY_S))
    except ValueError as exc:
        sys.stderr.write(f"edged-launcher: {exc}\n")
        return 2
    python = options.get("--launcher-python", sys.executable)
    package_path = options.get("--launcher-package-path", "")
    launcher = None
    try:
        launcher = Launcher(
            args,
            data_dir=data_dir_of(args, dict(os.environ)),
            package_path=package_path,
            python=python,
            stop_timeout_s=stop_timeout,
            restart_delay_s=restart_delay,
        )
        return launcher.run()
    except Exception as exc:  # a fault of the launcher must not keep edged from running
        _warn(f"launcher failed ({exc!r}): running the package's edged without it")
        if launcher is not None:
            launcher.stop_child()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LISTEN_")}
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(([package_path] if package_path else []) + paths)
        os.execve(python, [python, "-P", "-m", "edged", *args], env)
