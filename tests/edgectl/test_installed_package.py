"""edgectl from an installed package, not from the checkout: a wheel of the project, built
from a copy of its sources and installed (``pip install --no-deps --no-index``) into a fresh
venv, then run from a directory outside the checkout.

Real pip, real venv, real processes. No network: the wheel is built without build isolation
(setuptools from the test venv) and the dependencies come from the test venv's site-packages,
which a ``.pth`` file adds to the fresh venv's path *after* the wheel is installed (so pip never
sees the checkout's editable install). The editable install's import hook is not loaded there:
only site directories run ``.pth`` files, and that path is a plain entry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("edgefleet", "edged", "hub", "edgectl")
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


def _run(*cmd: str | Path, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    out = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert out.returncode == 0, f"{cmd}: {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fresh venv's bin directory, edgefleet installed in it from a wheel."""
    tmp = tmp_path_factory.mktemp("installed")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in SOURCES:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    dist = tmp / "dist"
    _run(*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", dist, src, cwd=tmp)  # fmt: skip
    (wheel,) = dist.glob("edgefleet-*.whl")
    venv = tmp / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    python = venv / "bin" / "python"
    _run(*PIP, "--python", python, "install", "--no-deps", "--no-index", "-q", wheel, cwd=tmp)
    purelib = _run(
        python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp
    ).stdout.strip()
    deps = sysconfig.get_paths()["purelib"]  # this venv's: grpc, onnxruntime, numpy, onnx...
    (Path(purelib) / "edgefleet_test_dependencies.pth").write_text(deps + "\n")
    return venv / "bin"


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory with no checkout in it or above it."""
    assert REPO not in tmp_path.parents
    return tmp_path


def test_the_programs_answer_version_from_the_installed_package(
    installed: Path, elsewhere: Path
) -> None:
    # the wheel's: built from this checkout's pyproject.toml (the test venv's own metadata
    # may be an older install of it)
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for program in ("edgectl", "hub", "edged"):
        out = _run(installed / program, "--version", cwd=elsewhere).stdout
        assert out.splitlines()[0] == f"{program} {version}"


def test_edgectl_imports_from_the_install_and_finds_its_quickstart_files(
    installed: Path, elsewhere: Path
) -> None:
    script = (
        "import edgectl, edgefleet\n"
        "from edgectl.quickstart import packaged_example\n"
        "print(edgectl.__file__)\n"
        "print(edgefleet.__file__)\n"
        "for name in ('deployment.yaml', 'fleet-deployment.yaml'):\n"
        "    f = packaged_example(name)\n"
        "    assert 'kind: ModelDeployment' in f.read_text(), f\n"
        "    print(f)\n"
    )
    lines = _run(installed / "python", "-c", script, cwd=elsewhere).stdout.splitlines()
    venv = installed.parent
    assert len(lines) == 4
    for line in lines:
        assert Path(line).is_relative_to(venv), line
        assert not Path(line).is_relative_to(REPO), line


def test_the_hub_dashboard_finds_its_script_and_style_in_the_install(
    installed: Path, elsewhere: Path
) -> None:
    script = (
        "from importlib import resources\n"
        "import hub.api.dashboard\n"
        "print(hub.api.dashboard.__file__)\n"
        "for name in ('dashboard.js', 'dashboard.css'):\n"
        "    assert resources.files('hub.api.dashboard').joinpath('static', name).read_text()\n"
    )
    (line,) = _run(installed / "python", "-c", script, cwd=elsewhere).stdout.splitlines()
    assert Path(line).is_relative_to(installed.parent), line


def test_the_standalone_quickstart_runs_from_the_install(installed: Path, elsewhere: Path) -> None:
    """Its manifest from the package data, its edged started as ``python -m edged`` of the
    installed package; the inference checked against ONNX Runtime."""
    out = _run(
        installed / "edgectl", "quickstart", "--standalone", "--dir", elsewhere / "qs",
        cwd=elsewhere, timeout=150,
    ).stdout  # fmt: skip
    assert "matches ONNX Runtime called directly: True" in out, out
    assert "edged stopped on SIGTERM (exit code 0)" in out, out
    copied = (elsewhere / "qs" / "manifests" / "deployment.yaml").read_text()
    assert copied == (REPO / "edgectl" / "examples" / "deployment.yaml").read_text()
