"""The ``hub`` command. The hub is not built yet; this prints what is planned."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="hub",
        description="edgefleet hub: regional control plane (enrollment, desired state, rollouts). "
        "Not implemented yet: devices run standalone with `edged run --manifests DIR`.",
    )
    p.parse_args(argv)
    p.print_help()
    return 0
