"""Suite-wide collection order: the longest tests first.

``scripts/test`` runs the suite on several pytest-xdist workers. Workers take tests in
collection order, so a long scenario collected last (the Debian package builds under
``tests/packaging``) would run alone at the end while the other workers sit idle. Sorting the
long ones to the front lets the short tests fill in around them. The order within each group
is the collection order, so it is the same on every worker (xdist requires that).
"""

from __future__ import annotations

import pytest


def _weight(item: pytest.Item) -> int:
    path = str(item.fspath)
    if "debhelper_build" in getattr(item, "fixturenames", ()):
        # the Debian package build (minutes) first; what installs the packages after the other
        # scenarios, so that it finds the build made and does not hold a worker waiting for it
        return 2 if "needs_root" in item.keywords else 0
    if "/tests/packaging/" in path and "scenario" in item.keywords:
        return 1  # chroot installs: minutes each
    if "scenario" in item.keywords:
        return 1
    return 3


@pytest.hookimpl(trylast=True)  # after the directory conftests have added their markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_weight)  # sort is stable
