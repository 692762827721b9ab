"""Packaging: the Debian package installed into a real Debian root, the Yocto layer's recipes.

What is real: ``packaging/deb/build`` (pip, dpkg-deb), a bookworm root made by ``debootstrap``
(cached, see debroot.py), ``dpkg`` inside it via ``chroot``. Tests that need root or debootstrap
skip with the reason when those are missing; CI (.ci/run) runs as root with debootstrap.
"""

from __future__ import annotations

import pytest
from debroot import ROOT_REASON


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "needs_root" in item.keywords and ROOT_REASON:
            item.add_marker(pytest.mark.skip(reason=ROOT_REASON))
