"""The import contracts in pyproject.toml ([tool.importlinter]) hold, and they would catch a
forbidden import: lint-imports runs on a copy of the packages with one bad import added."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("edgefleet", "edged", "hub", "edgectl")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter not installed")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy, before the installed checkout
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("edgectl/__init__.py", "import edged.daemon", "edgectl (the operator's tool)"),
        ("edgefleet/errors.py", "import hub.server", "the core (edgefleet) imports none"),
        ("hub/__init__.py", "from edged import cli", "the hub never imports edged"),
        ("edged/__init__.py", "import hub", "edged (the device) never imports the hub"),
        ("edged/state/desired.py", "import edged.reconcile.planning", "edged's layers"),
        ("edged/runtime/processes.py", "from edged import daemon", "edged's layers"),
        # the launcher, every part of it, imports the standard library only
        ("edged/launcher/cleanup.py", "import edgefleet.logs", "edged.launcher imports nothing"),
        ("edged/launcher/state.py", "import orjson", "edged.launcher imports nothing"),
        # the deciders are pure: no gRPC, no generated stubs, no store or cache
        ("hub/decide/desired.py", "import grpc", "hub.decide (the deciders) imports no gRPC"),
        ("hub/decide/regionslice.py", "from edgefleet.v1 import federation_pb2", "hub.decide ("),
        ("hub/decide/undo.py", "from hub.state.cache import Cache", "hub.decide (the deciders)"),
        # the hub's wings: api > controllers > state > decide, never upwards
        ("hub/state/cache.py", "from hub.controllers import rollout", "the hub's wings"),
        ("hub/controllers/lifecycle.py", "from hub.api import devicesync", "the hub's wings"),
        ("hub/api/auth.py", "from hub import wiring", "the hub's wings"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tree: Path, module: str, line: str, contract: str
) -> None:
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    result = _lint(tree)
    assert result.returncode != 0
    # that contract is the one broken (every contract's name is listed, kept or broken)
    broken = [line for line in result.stdout.splitlines() if line.endswith(" BROKEN")]
    assert any(contract in line for line in broken), result.stdout
