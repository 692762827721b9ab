"""The debhelper packages (edgefleet-common, -edged, -hub, -edgectl, built once per session by
conftest.debhelper_build) installed into a clean bookworm root (chroot): the edged user made,
edged's units enabled through deb-systemd-helper and the hub's not, the three programs run
there (``edged doctor``, ``hub --version``), and a purge of the four leaves nothing."""

from __future__ import annotations

import shutil
import time
import tomllib
from pathlib import Path

import pytest
from debhelper import PACKAGES, DebhelperBuild
from debroot import chroot, debian_root, snapshot

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]

pytestmark = [
    pytest.mark.scenario,
    pytest.mark.needs_root,
    pytest.mark.timeout(1800),  # the debhelper build when this test runs first: minutes
]


def test_packages_install_run_and_purge_cleanly(
    debhelper_build: DebhelperBuild, tmp_path: Path
) -> None:
    assert debhelper_build.returncode == 0, debhelper_build.output
    debs = [debhelper_build.debs[name] for name in PACKAGES]
    started = time.monotonic()
    with debian_root(tmp_path) as root:
        before = snapshot(root)
        for deb in debs:
            shutil.copy(deb, root / "tmp" / deb.name)
        installed = chroot(root, "dpkg", "-i", *(f"/tmp/{d.name}" for d in debs), check=False)
        assert installed.returncode == 0, installed.stdout + installed.stderr
        assert chroot(root, "getent", "passwd", "edged").stdout.startswith("edged:")
        assert chroot(root, "getent", "group", "edged").stdout.startswith("edged:")
        # deb-systemd-helper enabled edged (and its first-boot enrollment), not the hub
        wants = root / "etc" / "systemd" / "system" / "multi-user.target.wants"
        assert (wants / "edged.service").is_symlink()
        assert not (wants / "hub.service").exists()
        assert f"hub {VERSION}" in chroot(root, "hub", "--version").stdout
        assert f"edgectl {VERSION}" in chroot(root, "edgectl", "--version").stdout

        version = chroot(root, "edged", "--version")
        assert f"edged {VERSION}" in version.stdout, version.stdout
        assert "onnxruntime" in version.stdout
        doctor = chroot(root, "edged", "doctor", "--data-dir", "/tmp/doctor", check=False)
        assert doctor.returncode in (0, 1), doctor.stderr  # 1: something missing, reported
        assert "Traceback" not in doctor.stderr, doctor.stderr
        assert doctor.stdout.strip(), "doctor printed nothing"
        config = chroot(
            root,
            "/opt/edgefleet/bin/python",
            "-c",
            "from pathlib import Path; from edged.config import load_config; "
            "print(load_config(Path('/etc/edged/edged.toml')).paths.data_dir)",
        )
        assert config.stdout.strip() == "/var/lib/edged"
        for page in ("man8/edged.8.gz", "man8/hub.8.gz", "man1/edgectl.1.gz"):
            assert (root / "usr" / "share" / "man" / page).is_file(), page

        for deb in debs:
            (root / "tmp" / deb.name).unlink()
        shutil.rmtree(root / "tmp" / "doctor", ignore_errors=True)
        purged = chroot(root, "dpkg", "--purge", *reversed(PACKAGES), check=False)
        assert purged.returncode == 0, purged.stdout + purged.stderr
        left = snapshot(root) - before
        assert not left, f"left after purge: {sorted(left)[:20]}"
        assert chroot(root, "getent", "passwd", "edged", check=False).returncode != 0
    print(f"debhelper packages: root+install+purge {time.monotonic() - started:.0f}s")
