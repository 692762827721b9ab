"""The device's half of model configuration (edged.state.modelconfigs), on a real
filesystem: checked before anything is written, read-only files, one rename per change with
readers never seeing a mix, the last good config kept on refusal, leftovers of a kill -9
removed, hostile documents refused."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from edged.state.modelconfigs import (
    CONFIG_FILE,
    DATA_LINK,
    ConfigRefused,
    ConfigVolumes,
)
from edgefleet.api.modelconfigs import config_digest
from edgefleet.configschemas import parse_schema
from edgefleet.modelprocessing import PROCESSING_KEY

SCHEMA = parse_schema(
    json.dumps(
        {"type": "object", "properties": {"threshold": {"type": "number", "maximum": 1}}}
    ).encode()
)


def doc(threshold: float, **files: str) -> dict[str, Any]:
    return {"data": {"threshold": threshold}, "files": files}


def test_written_read_only_and_swapped_whole(tmp_path: Path) -> None:
    volumes = ConfigVolumes(tmp_path / "configs")
    first = volumes.write("det", doc(0.5, **{"labels.txt": "a\n"}), SCHEMA)
    assert first == config_digest(doc(0.5, **{"labels.txt": "a\n"}))
    path = volumes.config_path("det")
    assert json.loads(path.read_text()) == doc(0.5, **{"labels.txt": "a\n"})
    assert (path.parent / "files" / "labels.txt").read_text() == "a\n"
    version = (path.parent / DATA_LINK).resolve()
    assert stat.S_IMODE(version.stat().st_mode) == 0o555
    assert stat.S_IMODE((version / CONFIG_FILE).stat().st_mode) == 0o444
    assert volumes.digest("det") == first
    assert volumes.write("det", doc(0.5, **{"labels.txt": "a\n"}), SCHEMA) == first  # unchanged

    # a reader in a loop sees one whole version or the other, never a mix or nothing
    seen: set[float] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.add(json.loads(path.read_text())["data"]["threshold"])

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(30):
        volumes.write("det", doc(0.1 * (i % 10)), SCHEMA)
    stop.set()
    reader.join()
    assert seen <= {0.5, *(0.1 * i for i in range(10))}
    assert not (path.parent / "files" / "labels.txt").exists()  # the new version has none
    versions = [p for p in path.parent.iterdir() if p.name.startswith("..v-")]
    assert len(versions) == 1  # the old ones are gone


def test_a_refused_config_changes_nothing(tmp_path: Path) -> None:
    volumes = ConfigVolumes(tmp_path)
    good = volumes.write("det", doc(0.5), SCHEMA)
    for bad, message in (
        (doc(1.5), "data.threshold: must be at most 1"),
        ({"data": {}, "files": {"../escape": "x"}}, "not a plain file name"),
        ({"data": {}, "files": {".hidden": "x"}}, "not a plain file name"),
        ({"data": {}, "files": {"a": 3}}, "must be text"),
        ({"data": {}, "files": {}, "more": 1}, "data and files"),
        ({"data": {"x": "y" * 300_000}, "files": {}}, "bytes, more than"),
    ):
        with pytest.raises(ConfigRefused, match=message):
            volumes.write("det", bad, SCHEMA)
        assert volumes.digest("det") == good
    with pytest.raises(ConfigRefused):
        volumes.write("../etc", doc(0.5), None)
    assert not (tmp_path.parent / "etc").exists()


def test_a_malformed_processing_section_is_refused_before_any_worker_sees_it(
    tmp_path: Path,
) -> None:
    volumes = ConfigVolumes(tmp_path)
    good = volumes.write("det", doc(0.5), None)
    bad = {"data": {PROCESSING_KEY: {"outputs": {"logits": {"threshold": "high"}}}}, "files": {}}
    with pytest.raises(ConfigRefused) as err:
        volumes.write("det", bad, None)
    assert "the config's processing is invalid" in str(err.value)
    assert f"data[{PROCESSING_KEY!r}].outputs['logits'].threshold: must be a finite" in str(
        err.value
    )
    assert volumes.digest("det") == good


def test_leftovers_of_a_cut_write_are_removed_and_the_config_survives(tmp_path: Path) -> None:
    volumes = ConfigVolumes(tmp_path)
    digest = volumes.write("det", doc(0.5), None)
    half = tmp_path / "det" / "..v-deadbeef0000-0000"
    half.mkdir()
    (half / CONFIG_FILE).write_text("{")
    again = ConfigVolumes(tmp_path)  # a new edged after kill -9 or a reboot
    again.clean()
    assert not half.exists()
    assert again.digest("det") == digest
    again.remove("det")
    assert again.digest("det") is None and not (tmp_path / "det").exists()
