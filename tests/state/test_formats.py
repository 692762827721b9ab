"""The state format rule (edged.state.formats, docs/agent-updates.md "State formats"): this
release reads what the previous release writes, and what it writes on trial is read by the
previous release's own code, built from git history (packaging/releases.toml); after its
commit it writes its own formats."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_desired import workload, workloads

from edged.state import formats
from edged.state.baselines import load_baselines, save_baselines
from edged.state.desired import DesiredState
from edged.state.hubstate import AcceptedHubState, load_hub_state, save_hub_state
from edgefleet.errors import StateError
from edgefleet.persisting import read_json, write_json_atomic

REPO = Path(__file__).resolve().parents[2]
RELEASES = tomllib.loads((REPO / "packaging" / "releases.toml").read_text())["releases"]
PREVIOUS_VERSION, PREVIOUS = next(iter(RELEASES.items()))  # newest first


@pytest.fixture
def trial() -> Iterator[None]:
    formats.set_on_trial(True)
    yield
    formats.set_on_trial(False)


def previous_source(path: str) -> str:
    shown = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{PREVIOUS['commit']}:{path}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if shown.returncode != 0:
        pytest.skip(f"no git history for {PREVIOUS_VERSION}: {shown.stderr.strip()}")
    return shown.stdout


def previous_format(path: str) -> int:
    found = re.search(r"^FORMAT = (\d+)$", previous_source(path), re.M)
    return int(found.group(1)) if found else 0


PREVIOUS_FILES = {
    "state/desired.json": "edged/state/desired.py",
    "state/baselines.json": "edged/state/baselines.py",
    "state/hub.json": "edged/state/hubstate.py",
}


def test_every_state_file_with_a_format_is_in_the_table() -> None:
    assert set(formats.FORMATS) == set(PREVIOUS_FILES)
    for fmt in formats.FORMATS.values():
        assert fmt.writes in fmt.reads and fmt.trial_writes in fmt.reads


@pytest.mark.parametrize("name", sorted(PREVIOUS_FILES))
def test_this_release_reads_the_previous_ones_and_writes_what_it_reads_on_trial(
    name: str,
) -> None:
    before = previous_format(PREVIOUS_FILES[name])  # the previous release reads and writes it
    assert before in formats.FORMATS[name].reads, f"{name}: cannot read {PREVIOUS_VERSION}'s"
    assert formats.FORMATS[name].trial_writes == before, f"{name}: a rollback could not read it"


def test_a_trial_writes_the_previous_format_and_a_commit_its_own(
    tmp_path: Path, trial: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as a release that brings format 2 of desired.json would declare it
    monkeypatch.setitem(
        formats.FORMATS, "state/desired.json", formats.StateFormat(frozenset({1, 2}), 2, 1)
    )
    path = tmp_path / "desired.json"
    state = DesiredState(path)
    state.replace(workloads(workload("a")))
    assert read_json(path)["format"] == 1  # on trial: what the release before reads
    formats.committed()
    state.replace(workloads(workload("b")))
    assert read_json(path)["format"] == 2
    again = DesiredState(path)
    again.load()
    assert set(again.workloads) == {w for w in workloads(workload("b"))}


def test_a_format_this_release_does_not_read_is_refused(tmp_path: Path) -> None:
    write_json_atomic(tmp_path / "d.json", {"format": 9, "generation": 1, "workloads": []})
    with pytest.raises(StateError):
        DesiredState(tmp_path / "d.json").load()
    write_json_atomic(tmp_path / "b.json", {"format": 9, "baselines": []})
    with pytest.raises(StateError):
        load_baselines(tmp_path / "b.json")
    write_json_atomic(tmp_path / "h.json", {"format": 9, "generation": 1, "workloads": []})
    with pytest.raises(StateError):
        load_hub_state(tmp_path / "h.json")


def test_the_previous_release_reads_what_this_one_writes_on_trial(
    tmp_path: Path, trial: None
) -> None:
    """The rollback case for real: the previous release's own loaders (``git archive`` of its
    commit) read the state files this release wrote while on trial."""
    previous_source("pyproject.toml")  # skips without history
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", PREVIOUS["commit"], "edged", "edgefleet"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    old = tmp_path / "previous"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(old, filter="data")
    data = tmp_path / "d" / "state"
    DesiredState(data / "desired.json").replace(workloads(workload("a"), workload("b")))
    save_baselines(data / "baselines.json", ())
    save_hub_state(data / "hub.json", AcceptedHubState())
    names = sorted(str(n) for n in workloads(workload("a"), workload("b")))
    check = f"""
import sys
from pathlib import Path
from edged.state.desired import DesiredState
from edged.state.baselines import load_baselines
from edged.state.hubstate import load_hub_state
import edged.state.desired as d
assert d.__file__.startswith({str(old)!r}), d.__file__
data = Path({str(data)!r})
s = DesiredState(data / "desired.json"); s.load()
assert sorted(str(n) for n in s.workloads) == {names!r}
assert load_baselines(data / "baselines.json") == ()
assert load_hub_state(data / "hub.json").generation == 0
print("read by", {PREVIOUS_VERSION!r})
"""
    result = subprocess.run(
        [sys.executable, "-P", "-c", check],
        env={"PYTHONPATH": str(old), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"read by {PREVIOUS_VERSION}" in result.stdout
