"""The Yocto layer: python3-edgefleet's RDEPENDS are the recipes of pyproject's dependencies, the
layer is compatible with current releases, and the recipes pass oelint-adv with no errors."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
LAYER = REPO / "yocto-layer" / "meta-edgefleet"
RECIPES = sorted(LAYER.glob("recipes-*/*/*.bb"))

# pyproject [project] dependency -> the OpenEmbedded recipe that provides it
RECIPE_OF = {
    "httptools": "python3-httptools",
    "orjson": "python3-orjson",
    "pyyaml": "python3-pyyaml",
    "uvloop": "python3-uvloop",
    "numpy": "python3-numpy",
    "onnxruntime": "python3-onnxruntime",
    "pyudev": "python3-pyudev",
    "psutil": "python3-psutil",
    "cryptography": "python3-cryptography",
    "grpcio": "python3-grpcio",
    "protobuf": "python3-protobuf",
    "tuf": "python3-tuf",  # with securesystemslib: recipes-devtools/python in this layer
}
# what the standard library split into packages needs on top
STDLIB = {"python3-core", "python3-asyncio"}


def rdepends(recipe: Path) -> set[str]:
    text = recipe.read_text().replace("\\\n", " ")
    found = re.search(r'^RDEPENDS:\$\{PN\} \+?= "([^"]*)"', text, re.MULTILINE)
    assert found, f"no RDEPENDS in {recipe.name}"
    return set(found.group(1).split())


def test_python_recipe_rdepends_match_pyproject() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower() for d in deps}
    unmapped = names - set(RECIPE_OF)
    assert not unmapped, f"add to RECIPE_OF (and the recipe): {unmapped}"
    recipe = LAYER / "recipes-edgefleet" / "edgefleet" / "python3-edgefleet_0.1.0.bb"
    assert rdepends(recipe) == {RECIPE_OF[n] for n in names} | STDLIB


def test_recipe_versions_follow_pyproject() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for recipe in (LAYER / "recipes-edgefleet" / "edgefleet").glob("*.bb"):
        assert recipe.stem.endswith(f"_{version}"), recipe.name


def test_vendored_python_recipes_satisfy_pyproject() -> None:
    """The layer's own recipes for what meta-python lacks (python-tuf and securesystemslib):
    their versions are ones pyproject (and python-tuf's own requirement) accept, and tuf's
    recipe depends on securesystemslib's."""
    from packaging.requirements import Requirement

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {Requirement(d).name.lower(): Requirement(d).specifier for d in deps}
    wanted["securesystemslib"] = Requirement("securesystemslib~=1.0").specifier  # tuf's own
    ours = {
        r.stem.split("_")[0].removeprefix("python3-"): r
        for r in (LAYER / "recipes-devtools" / "python").glob("*.bb")
    }
    assert set(ours) == {"tuf", "securesystemslib"}
    for name, recipe in ours.items():
        assert recipe.stem.split("_")[1] in wanted[name], recipe.name
    assert "python3-securesystemslib" in rdepends(ours["tuf"])


def test_layer_is_compatible_with_current_releases() -> None:
    conf = (LAYER / "conf" / "layer.conf").read_text()
    compat = re.search(r'LAYERSERIES_COMPAT_edgefleet = "([^"]*)"', conf)
    assert compat is not None
    assert {"scarthgap", "styhead", "walnascar"} <= set(compat.group(1).split())


def test_edged_recipe_installs_units_config_and_udev_rules() -> None:
    text = (LAYER / "recipes-edgefleet" / "edgefleet" / "edged_0.1.0.bb").read_text()
    for needle in (
        "inherit systemd useradd",
        "edged.service edged-enroll.service",
        "packaging/config/edged.toml",
        "packaging/udev/70-edgefleet-accelerators.rules",
    ):
        assert needle in text, needle


def test_recipes_pass_oelint_adv_with_no_errors() -> None:
    oelint = shutil.which("oelint-adv", path=str(Path(sys.executable).parent))
    if oelint is None:
        pytest.skip("oelint-adv is not installed (pip install -e '.[dev]')")
    result = subprocess.run(
        [oelint, "--quiet", *map(str, RECIPES)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    errors = [line for line in (result.stdout + result.stderr).splitlines() if ":error:" in line]
    assert not errors, "\n".join(errors)
