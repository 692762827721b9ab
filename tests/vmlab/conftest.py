"""The VM lab: the device image booted in QEMU (TCG) against a real hub on the host.

What is real: the image built by ``packaging/image/build`` (debootstrap, the project's .debs,
systemd, the Debian cloud kernel, cgroup v2), a seed disk by ``packaging/image/seed``, QEMU
guests with user networking restricted to the host's loopback, ``hub init``/``hub serve``/
``hub token create`` and ``edgectl`` as processes on the host. The one test-only part is the
image's command agent (``--test-agent``, packaging/image/lab), the lab's channel into a guest.

The lab runs only when selected (``-m vmlab``; ``.ci/run`` runs it in one pytest process,
``-n 0``, in the background while the checks and the suite run): the rest of the suite
deselects it. Selected without QEMU, the tools or
root, it is skipped with the reason on a development machine, and FAILS where ``CI`` is set.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab import LABELS, LabHub, Vm, build_image, make_seed, missing_tools


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "vmlab" in (config.option.markexpr or ""):
        return
    # the marker, not the keyword: every item here has "vmlab" (its folder) as a keyword
    lab = [i for i in items if i.get_closest_marker("vmlab") is not None]
    if lab:
        config.hook.pytest_deselected(items=lab)
        items[:] = [i for i in items if i.get_closest_marker("vmlab") is None]


def lab_reason() -> str:
    missing = missing_tools()
    if missing:
        return f"the VM lab needs {', '.join(missing)} (scripts/install-system-deps)"
    if os.geteuid() != 0:
        return "the VM lab needs root (the image build chroots)"
    return ""


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab's image: the production image plus the test agent (cached by the build)."""
    reason = lab_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the VM lab: {reason}")
        pytest.skip(reason)
    prebuilt = os.environ.get("EDGEFLEET_VMLAB_IMAGE")
    if prebuilt:  # an image built with --test-agent beforehand (development, bench/vmboot.py)
        return Path(prebuilt)
    # one image per session: under pytest-xdist the workers' base folders share a parent of
    # the session's own; without it, the parent is shared by every session of this user
    # (pytest-of-USER), and an image there would outlive the sources it was built from (the
    # build's cache, keyed by those sources, makes a new session's copy cheap)
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return build_image(base / "vmlab-image", base)


@pytest.fixture(scope="session")
def hub(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabHub]:
    d = tmp_path_factory.mktemp("hub")
    h = LabHub(d / "data", d / "hub.log").init().start()
    yield h
    h.stop()


@pytest.fixture(scope="session")
def seeded(
    image: Path, hub: LabHub, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Vm, str]]:
    """The lab's device: one VM booted from the image with a seed from ``hub token create``
    (labels site=lab), shared by the lab's modules in order (test_device, test_limits,
    test_powercut, test_upgrade: one first boot, the costliest part under TCG). Yields it and
    the token."""
    d = tmp_path_factory.mktemp("device")
    token = make_seed(d / "seed.img", hub, labels=LABELS)
    vm = Vm(image, d / "vm", hub, d / "seed.img").start()
    yield vm, token
    vm.stop()
