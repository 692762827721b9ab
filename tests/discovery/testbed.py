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


def blocks(path: str) -> list[tuple[str, str, str]]:
    """(sysfs path, record text, device node or "") of each device in a umockdev record file."""
    out = []
    with open(path) as f:
        chunks = [c.strip() for c in f.read().split("\n\n")]
    for chunk in filter(None, chunks):
        lines = chunk.splitlines()
        node = next((line[3:].strip() for line in lines if line.startswith("N: ")), "")
        out.append(("/sys" + lines[0][3:].strip(), chunk + "\n", node))
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
    removed_nodes: set[str] = set()
    child = subprocess.Popen(command, stdout=sys.stderr)  # our stdout answers commands
    print(f"pid {child.pid}", flush=True)
    for line in sys.stdin:
        verb, _, arg = line.strip().partition(" ")
        try:
            if verb == "add":
                for sys_path, record, node in blocks(arg):
                    if os.path.exists(root + sys_path):
                        continue
                    text = record
                    if node in removed_nodes:
                        # umockdev 0.17 cannot create a node twice: drop "N:", make the file
                        text = "".join(
                            line for line in record.splitlines(True) if not line.startswith("N: ")
                        )
                        with open(f"{root}/dev/{node}", "w"):
                            pass
                    bed.add_from_string(text)
                    bed.uevent(sys_path, "add")
            elif verb == "remove":
                found = blocks(arg)
                paths = [p for p, _, _ in found]
                for sys_path, _, node in found:
                    if any(q.startswith(sys_path + "/") for q in paths):
                        continue  # not a leaf: the parent (PCI device) stays
                    bed.uevent(sys_path, "remove")
                    bed.remove_device(sys_path)
                    if node and os.path.lexists(f"{root}/dev/{node}"):
                        os.unlink(f"{root}/dev/{node}")  # as devtmpfs does
                        removed_nodes.add(node)
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
