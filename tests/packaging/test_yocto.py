"""The Yocto layer: python3-edgefleet's RDEPENDS are the recipes of pyproject's dependencies, the
recipes install what the Debian packages install on a device (one table, read against both
sides' files), the layer is compatible with current releases, and the recipes pass oelint-adv
with no errors. No bitbake build runs here (docs/packaging.md, Yocto, says why)."""

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
    recipe = LAYER / "recipes-edgefleet" / "edgefleet" / "python3-edgefleet_0.2.0.bb"
    assert rdepends(recipe) == {RECIPE_OF[n] for n in names} | STDLIB


def test_the_recipe_gives_older_setuptools_the_license_as_a_table() -> None:
    """pyproject.toml's SPDX license string needs setuptools >= 77; the recipe's sed turns it
    into the table the layer's series' setuptools (69 to 76) read: it must find the line."""
    recipe = (LAYER / "recipes-edgefleet" / "edgefleet" / "python3-edgefleet_0.2.0.bb").read_text()
    found = re.search(r"sed -i 's/\^(.*)\$/(.*)/' \$\{S\}/pyproject.toml", recipe)
    assert found, "the recipe no longer rewrites pyproject.toml's license"
    text = (REPO / "pyproject.toml").read_text()
    assert re.search(f"^{found.group(1)}$", text, re.MULTILINE), found.group(1)
    table = tomllib.loads(f"[project]\n{found.group(2)}\n")["project"]["license"]
    assert table == {"text": tomllib.loads(text)["project"]["license"]}


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
    fast = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted.update({Requirement(d).name.lower(): Requirement(d).specifier for d in fast["fast"]})
    assert set(ours) == {"tuf", "securesystemslib", "pysimdjson"}
    for name, recipe in ours.items():
        assert recipe.stem.split("_")[1] in wanted[name], recipe.name
    assert "python3-securesystemslib" in rdepends(ours["tuf"])


def test_the_fast_extra_is_recommended_like_debian_installs_it() -> None:
    """pyproject's ``fast`` extra (pysimdjson): the Debian venv installs it (stage-venv builds
    ``.[fast,dashboard]``); the Yocto image gets it through python3-edgefleet's RRECOMMENDS (an
    image may leave it out: workers then decode JSON with orjson alone)."""
    assert '"$repo[fast,' in (REPO / "packaging" / "deb" / "stage-venv").read_text()
    recipe = LAYER / "recipes-edgefleet" / "edgefleet" / "python3-edgefleet_0.2.0.bb"
    found = re.search(r'^RRECOMMENDS:\$\{PN\} \+?= "([^"]*)"', recipe.read_text(), re.MULTILINE)
    assert found is not None and found.group(1).split() == ["python3-pysimdjson"]


def test_layer_is_compatible_with_current_releases() -> None:
    conf = (LAYER / "conf" / "layer.conf").read_text()
    compat = re.search(r'LAYERSERIES_COMPAT_edgefleet = "([^"]*)"', conf)
    assert compat is not None
    assert {"scarthgap", "styhead", "walnascar"} <= set(compat.group(1).split())


def test_edged_recipe_installs_units_config_and_udev_rules() -> None:
    text = (LAYER / "recipes-edgefleet" / "edgefleet" / "edged_0.2.0.bb").read_text()
    for needle in (
        "inherit systemd useradd",
        "edged.service edged-enroll.service",
        "packaging/config/edged.toml",
        "packaging/udev/70-edgefleet-accelerators.rules",
    ):
        assert needle in text, needle


SITE = "/opt/edgefleet/lib/python3/site-packages"  # the venv's (python3.X in the real path)

# What a device gets, file by file: where the Debian packages put it (edgefleet-edged's
# debian/*.install, *.links and *.manpages; the venv of edgefleet-common under /opt/edgefleet)
# and where the Yocto recipes do (edged's do_install, python3-edgefleet's PEP 517 install,
# the layer's Python recipes). None on one side: not installed there, for the reason given.
DEVICE_FILES: dict[str, tuple[str | None, str | None, str]] = {
    "edged unit": (
        "/lib/systemd/system/edged.service",
        "${systemd_system_unitdir}/edged.service",
        "",
    ),
    "first-boot enrollment unit": (
        "/lib/systemd/system/edged-enroll.service",
        "${systemd_system_unitdir}/edged-enroll.service",
        "",
    ),
    "accelerator udev rules": (
        "/lib/udev/rules.d/70-edgefleet-accelerators.rules",
        "${nonarch_base_libdir}/udev/rules.d/70-edgefleet-accelerators.rules",
        "",
    ),
    "tmpfiles.d entry (/run/systemd/dynamic-uid before edged's namespace)": (
        "/usr/lib/tmpfiles.d/edged.conf",
        "${nonarch_libdir}/tmpfiles.d/edged.conf",
        "",
    ),
    "default config (a conffile)": ("/etc/edged/edged.toml", "${sysconfdir}/edged/edged.toml", ""),
    "edged command": ("/usr/bin/edged", "${bindir}/edged", ""),
    "the edged tree": (f"{SITE}/edged", "${PYTHON_SITEPACKAGES_DIR}/edged", ""),
    "the shared core": (f"{SITE}/edgefleet", "${PYTHON_SITEPACKAGES_DIR}/edgefleet", ""),
    "JSON tensors' fast path": (
        f"{SITE}/simdjson",
        "${PYTHON_SITEPACKAGES_DIR}/simdjson",
        "",
    ),
    "edged man page": (
        "/usr/share/man/man8/edged.8.gz",
        None,
        "Yocto images leave documentation out (the doc packages); the man page is built from "
        "`edged --help` by debian/rules",
    ),
}


def _debian_edged_paths() -> set[str]:
    """What edgefleet-edged installs, from its debhelper files (destinations, absolute)."""
    debian = REPO / "debian"
    out: set[str] = set()
    for line in (debian / "edgefleet-edged.install").read_text().splitlines():
        if line.strip():
            source, dest = line.split()
            out.add("/" + dest.strip("/") + "/" + Path(source).name)
    for line in (debian / "edgefleet-edged.links").read_text().splitlines():
        if line.strip():
            out.add("/" + line.split()[1])
    for line in (debian / "edgefleet-edged.manpages").read_text().splitlines():
        if line.strip():
            name = Path(line).name
            out.add(f"/usr/share/man/man{name.rsplit('.', 1)[1]}/{name}.gz")
    return out


def _yocto_installed() -> set[str]:
    """What the recipes install, in bitbake's variables: edged's do_install destinations, the
    console scripts and packages of python3-edgefleet (pyproject), the layer's Python recipes'
    top-level modules."""
    recipe = (LAYER / "recipes-edgefleet" / "edgefleet" / "edged_0.2.0.bb").read_text()
    body = recipe.split("do_install() {", 1)[1].split("\n}", 1)[0]
    out = {m for m in re.findall(r"\$\{D\}(\$\{\w+\}[\w./${}-]*)", body) if "." in m}
    units = re.search(r"for unit in ([\w. -]+); do", body)
    assert units is not None
    out |= {f"${{systemd_system_unitdir}}/{u}" for u in units.group(1).split()}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    out |= {f"${{bindir}}/{script}" for script in project["project"]["scripts"]}
    found = project["tool"]["setuptools"]["packages"]["find"]["include"]
    out |= {f"${{PYTHON_SITEPACKAGES_DIR}}/{pattern.rstrip('*')}" for pattern in found}
    if (LAYER / "recipes-devtools" / "python" / "python3-pysimdjson_6.0.2.bb").exists():
        out.add("${PYTHON_SITEPACKAGES_DIR}/simdjson")  # pysimdjson's package is simdjson
    return out


def test_debian_side_of_the_table_is_what_the_packages_install() -> None:
    debian = {deb for deb, _, _ in DEVICE_FILES.values() if deb and not deb.startswith("/opt/")}
    assert debian == _debian_edged_paths()  # both ways: a new file needs a row
    # the venv's side: edgefleet-common ships /opt/edgefleet whole, built with pip from the tree
    assert (REPO / "debian" / "edgefleet-common.install").read_text().split() == ["opt/edgefleet"]


def test_yocto_side_of_the_table_is_what_the_recipes_install() -> None:
    yocto = {path for _, path, _ in DEVICE_FILES.values() if path}
    installed = _yocto_installed()
    assert yocto <= installed, f"not installed by the recipes: {yocto - installed}"


def test_every_difference_says_why() -> None:
    for role, (deb, yocto, why) in DEVICE_FILES.items():
        assert (deb is None or yocto is None) == bool(why), role


def test_yocto_rewrites_the_units_for_its_paths() -> None:
    """The units run /opt/edgefleet/bin/edged (Debian's venv); the recipe points them at
    ${bindir}, where python3-edgefleet's console scripts are."""
    recipe = (LAYER / "recipes-edgefleet" / "edgefleet" / "edged_0.2.0.bb").read_text()
    assert "sed -e 's,/opt/edgefleet/bin/,${bindir}/,g'" in recipe
    for unit in ("edged.service", "edged-enroll.service"):
        text = (REPO / "packaging" / "systemd" / unit).read_text()
        assert "/opt/edgefleet/" not in text.replace("/opt/edgefleet/bin/", "")


def test_both_make_the_edged_group_the_unit_names() -> None:
    """edged.service runs as root with Group=edged: both packagings create that group."""
    assert (
        "adduser --quiet --system --group"
        in (REPO / "debian" / "edgefleet-edged.postinst").read_text()
    )
    recipe = (LAYER / "recipes-edgefleet" / "edgefleet" / "edged_0.2.0.bb").read_text()
    assert 'GROUPADD_PARAM:${PN} = "--system edged"' in recipe


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
