"""Run under umockdev: prints the accelerators edged discovers, as JSON (one line).

``python probe.py [--touch /dev/NODE]...``: ``--touch`` creates a device node file in the
testbed that is not a udev device (like /dev/nvidia0). (Permissions are tested with records:
the tests run as root, for whom every node is accessible.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from edged.discovery.classifying import merge
from edged.discovery.udev import read_records


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--touch", action="append", default=[])
    args = p.parse_args()
    root = os.environ.get("UMOCKDEV_DIR")
    if not root:
        sys.exit("probe.py must run under umockdev (UMOCKDEV_DIR is not set)")
    for node in args.touch:
        path = root + node
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
    print(json.dumps([a.to_json() for a in merge(read_records())]))


if __name__ == "__main__":
    main()
