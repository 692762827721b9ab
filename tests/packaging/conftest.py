"""Packaging: the Debian packages installed into a real Debian root, the Yocto layer's recipes.

What is real: ``dpkg-buildpackage`` on ``debian/`` (debhelper, pip, lintian), built once per
session (:func:`debhelper_build`, shared by the tests that look into the packages and the one
that installs them), a bookworm root made by ``debootstrap`` (cached, see debroot.py),
``dpkg`` inside it via ``chroot``. Tests that need root, debootstrap or the debhelper tools
skip with the reason when those are missing; CI (.ci/run) runs as root with all of them.
"""

from __future__ import annotations

import pytest
from debhelper import TOOLS_REASON, DebhelperBuild, build_packages, shared_build
from debroot import ROOT_REASON


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "needs_root" in item.keywords and ROOT_REASON:
            item.add_marker(pytest.mark.skip(reason=ROOT_REASON))


@pytest.fixture(scope="session")
def debhelper_build(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> DebhelperBuild:
    """The debhelper packages, built once for the session (minutes), on whichever
    pytest-xdist worker asks first."""
    if TOOLS_REASON:
        pytest.skip(TOOLS_REASON)
    if worker_id == "master":  # one process: its own temporary directory
        return build_packages(tmp_path_factory.mktemp("debhelper"))
    return shared_build(tmp_path_factory.getbasetemp().parent)  # common to the workers
