"""A umockdev testbed that runs a command and plugs devices in and out under it.

Runs in the *system* Python (``gi`` + ``UMockdev``) under ``umockdev-wrapper``::

    umockdev-wrapper /usr/bin/python3 testbed.py [--device FILE.umockdev]... -- CMD...

The command (edged, a probe) inherits the testbed (``UMOCKDEV_DIR`` + ``LD_PRELOAD``), so its
pyudev sees the mocked devices and gets real uevents. Commands on stdin, one per line,
each answered ``ok`` (or ``error: ...``) on stdout:

* ``add FILE``: add the devices of FILE that are not there yet, each with an ``add`` uevent;
* ``remove FILE``: ``remove`` uevents for FILE's devices without children elsewhere (the
  leaves: device nodes), then remove them;
* ``quit`` (or end of input): SIGTERM the command, wait for it, exit with its status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import gi

gi.require_version("UMockdev", "1.0")
from gi.repository import UMockdev  # noqa: E402


def blocks(path: str) -> list[tuple[str, str]]:
    """(sysfs path, record text) of each device in a umockdev record file."""
    out = []
    for chunk in open(path).read().split("\n\n"):
        chunk = chunk.strip()
        if chunk:
            out.append(("/sys" + chunk.splitlines()[0][3:].strip(), chunk + "\n"))
    return out


def main() -> int:
    args = sys.argv[1:]
    sep = args.index("--")
    files = [args[i + 1] for i, a in enumerate(args[:sep]) if a == "--device"]
    command = args[sep + 1 :]
    bed = UMockdev.Testbed.new()
    root = bed.get_root_dir()
    for f in files:
        bed.add_from_file(f)
    child = subprocess.Popen(command)
    print(f"pid {child.pid}", flush=True)
    for line in sys.stdin:
        verb, _, arg = line.strip().partition(" ")
        try:
            if verb == "add":
                for sys_path, text in blocks(arg):
                    if not os.path.exists(root + sys_path):
                        bed.add_from_string(text)
                        bed.uevent(sys_path, "add")
            elif verb == "remove":
                paths = [p for p, _ in blocks(arg)]
                leaves = [p for p in paths if not any(q.startswith(p + "/") for q in paths)]
                for sys_path in leaves:
                    bed.uevent(sys_path, "remove")
                    bed.remove_device(sys_path)
            elif verb == "quit":
                break
            else:
                raise ValueError(f"unknown command {verb!r}")
            print("ok", flush=True)
        except Exception as exc:  # report, keep going
            print(f"error: {exc}", flush=True)
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
    try:
        return child.wait(60)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


if __name__ == "__main__":
    sys.exit(main())
