"""The test tree's own rules: tests import their helpers by bare module name (``pythonpath``
in pyproject.toml and pytest's rootdir insertion put each test folder on ``sys.path``), so two
helper modules of one name in two folders shadow each other, and which one a test gets
depends on what was collected before it (seen: ``federationtesting`` in tests/e2e and
tests/hub, fine alone, an ImportError in the whole suite)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_name_is_unique_across_the_tree() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name in ("conftest.py", "__init__.py") or "__pycache__" in path.parts:
            continue
        seen[path.name].append(str(path.relative_to(TESTS)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


def test_no_test_imports_the_tests_folder_as_a_package() -> None:
    """``from tests.x import y`` works only when the repository root happens to be on
    ``sys.path`` (another module put it there), so a file run alone fails to import: helpers
    are imported by bare name, like every other test does."""
    offenders = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("*.py")
        if "__pycache__" not in path.parts
        and any(
            line.lstrip().startswith(("from tests.", "import tests.", "from tests import"))
            for line in path.read_text().splitlines()
        )
    ]
    assert offenders == []
