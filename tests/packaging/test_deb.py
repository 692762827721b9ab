"""The Debian package: build it with packaging/deb/build, install it into a clean bookworm root
(chroot), run edged there, purge it and find nothing left."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from debroot import chroot, debian_root, snapshot

REPO = Path(__file__).parents[2]

pytestmark = [pytest.mark.scenario, pytest.mark.needs_root]


def test_package_installs_runs_and_purges_cleanly(tmp_path: Path) -> None:
    started = time.monotonic()
    out = tmp_path / "dist"
    build = subprocess.run(
        [str(REPO / "packaging" / "deb" / "build"), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (deb,) = out.glob("edgefleet_*.deb")
    contents = subprocess.run(
        ["dpkg-deb", "--contents", str(deb)], capture_output=True, text=True, check=True
    ).stdout
    for path in (
        "./opt/edgefleet/bin/edged",
        "./lib/systemd/system/edged.service",
        "./lib/systemd/system/edged-enroll.service",
        "./lib/systemd/system/hub.service",
        "./lib/udev/rules.d/70-edgefleet-accelerators.rules",
        "./etc/edged/edged.toml",
        "./usr/share/man/man8/edged.8.gz",
        "./usr/share/man/man8/hub.8.gz",
        "./usr/share/man/man1/edgectl.1.gz",
        "./usr/share/doc/edgefleet/examples/grafana-dashboard.json",
    ):
        assert path in contents, path
    assert "__pycache__" not in contents
    built = time.monotonic()

    with debian_root(tmp_path) as root:
        before = snapshot(root)
        shutil.copy(deb, root / "tmp" / deb.name)
        installed = chroot(root, "dpkg", "-i", f"/tmp/{deb.name}", check=False)
        assert installed.returncode == 0, installed.stdout + installed.stderr
        assert chroot(root, "getent", "passwd", "edged").stdout.startswith("edged:")
        assert chroot(root, "getent", "group", "edged").stdout.startswith("edged:")
        # deb-systemd-helper enabled edged (and its first-boot enrollment), not the hub
        wants = root / "etc" / "systemd" / "system" / "multi-user.target.wants"
        assert (wants / "edged.service").is_symlink()
        assert not (wants / "hub.service").exists()
        assert "hub 0.1.0" in chroot(root, "hub", "--version").stdout

        version = chroot(root, "edged", "--version")
        assert "edged 0.1.0" in version.stdout, version.stdout
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

        (root / "tmp" / deb.name).unlink()
        shutil.rmtree(root / "tmp" / "doctor", ignore_errors=True)
        purged = chroot(root, "dpkg", "--purge", "edgefleet", check=False)
        assert purged.returncode == 0, purged.stdout + purged.stderr
        left = snapshot(root) - before
        assert not left, f"left after purge: {sorted(left)[:20]}"
        assert chroot(root, "getent", "passwd", "edged", check=False).returncode != 0
    spent = time.monotonic() - built
    print(f"deb: built in {built - started:.0f}s, root+install+purge {spent:.0f}s")
