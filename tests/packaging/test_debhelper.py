"""The debhelper packages (debian/): dpkg-buildpackage builds edgefleet-common (the venv under
/opt/edgefleet), edgefleet-edged, edgefleet-hub and edgefleet-edgectl from a copy of the tree
(once per session: conftest.debhelper_build, which test_deb.py installs), each holds what it
should and nothing of another, and lintian finds no error and no warning (every remaining tag
is overridden with its reason in debian/*.lintian-overrides). Real dpkg-buildpackage,
debhelper, pip and lintian (Debian packages debhelper, lintian: scripts/install-system-deps)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from debhelper import DebhelperBuild

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(1800)]  # the build: minutes

EXPECTED = {
    "edgefleet-common": ["./opt/edgefleet/bin/edged", "./opt/edgefleet/bin/edged-launcher",
                         "./opt/edgefleet/bin/python",
                         "./usr/share/doc/edgefleet-common/copyright"],
    "edgefleet-edged": ["./usr/bin/edged", "./lib/systemd/system/edged.service",
                        "./lib/systemd/system/edged-enroll.service",
                        "./lib/udev/rules.d/70-edgefleet-accelerators.rules",
                        "./etc/edged/edged.toml", "./usr/share/man/man8/edged.8.gz"],
    "edgefleet-hub": ["./usr/bin/hub", "./lib/systemd/system/hub.service",
                      "./usr/share/man/man8/hub.8.gz",
                      "./usr/share/doc/edgefleet-hub/examples/edgefleet.json",
                      "./usr/share/doc/edgefleet-hub/examples/edgefleet-rules.yaml"],
    "edgefleet-edgectl": ["./usr/bin/edgectl", "./usr/share/man/man1/edgectl.1.gz"],
}  # fmt: skip


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)


def test_dpkg_buildpackage_builds_the_split_packages_and_lintian_finds_no_error(
    debhelper_build: DebhelperBuild,
) -> None:
    build = debhelper_build
    assert build.returncode == 0, build.output
    debs, tmp_path = build.debs, build.directory
    assert set(debs) == set(EXPECTED)
    listed = {
        name: _run("dpkg-deb", "--contents", str(deb), cwd=tmp_path).stdout
        for name, deb in debs.items()
    }
    for name, paths in EXPECTED.items():
        for path in paths:
            assert f" {path}" in listed[name], f"{name} lacks {path}"
    assert "./opt/" not in listed["edgefleet-edged"] + listed["edgefleet-hub"]
    # the hub's dashboard extra (aiohttp) is in the venv: hub serve --dashboard-listen runs
    assert re.search(r" \./opt/edgefleet/lib/python3\.\d+/site-packages/aiohttp/web\.py\n",
                     listed["edgefleet-common"]), "the venv lacks the dashboard extra"  # fmt: skip
    fields = _run("dpkg-deb", "--field", str(debs["edgefleet-edged"]), cwd=tmp_path).stdout
    assert "Depends:" in fields and "edgefleet-common (= " in fields and "adduser" in fields
    scripts = {
        name: _run("dpkg-deb", "--info", str(debs[name]), "postinst", cwd=tmp_path).stdout
        for name in ("edgefleet-edged", "edgefleet-hub")
    }
    # units through deb-systemd-helper: edged's enabled on a first install, the hub's not
    # (it needs hub init first); never systemctl enable/start by hand
    assert "deb-systemd-helper enable 'edged.service'" in scripts["edgefleet-edged"]
    assert "was-enabled defaults to true" in scripts["edgefleet-edged"]
    assert "hub.service" in scripts["edgefleet-hub"]
    assert "was-enabled defaults to true" not in scripts["edgefleet-hub"]
    assert not any(f"systemctl {verb}" in text for text in scripts.values() for verb in (
        "enable", "start", "restart"))  # fmt: skip
    lint = _run(
        "lintian", "--fail-on", "error", "--tag-display-limit", "0", *map(str, debs.values()),
        cwd=tmp_path,
    )  # fmt: skip
    tags = [line for line in lint.stdout.splitlines() if line[:2] in ("E:", "W:")]
    assert lint.returncode == 0 and tags == [], lint.stdout[-4000:] + lint.stderr[-2000:]
