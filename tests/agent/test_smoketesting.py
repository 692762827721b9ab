"""The smoke test before the switch: the new slot's own ``edged check`` against this device's
config and state, for real (a release tree built from this checkout with another version)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from slottreetesting import install_tree

from edged.agent.checking import check
from edged.agent.installing import InstallRefused
from edged.agent.smoketesting import slot_environ, smoke_test


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_a_good_release_passes_as_its_own_version(tmp_path: Path) -> None:
    data = tmp_path / "d"
    slot = install_tree(data, "b", "0.2.1")
    run(smoke_test(slot, "0.2.1", data_dir=data, config_path=None))
    with pytest.raises(InstallRefused, match=r"reports version '0\.2\.1', not 0\.2\.9"):
        run(smoke_test(slot, "0.2.9", data_dir=data, config_path=None))


def test_a_release_that_cannot_import_its_runtime_fails(tmp_path: Path) -> None:
    data = tmp_path / "d"

    def broken(lib: Path) -> None:
        (lib / "edged" / "daemon.py").write_text("raise ImportError('built without grpc')\n")

    slot = install_tree(data, "b", "0.2.1", patch=broken)
    with pytest.raises(InstallRefused) as err:
        run(smoke_test(slot, "0.2.1", data_dir=data, config_path=None))
    assert err.value.reason == "SmokeTestFailed"
    assert "RuntimeImportFailed" in err.value.message and "built without grpc" in err.value.message


def test_a_release_that_cannot_read_this_state_fails(tmp_path: Path) -> None:
    data = tmp_path / "d"
    (data / "state").mkdir(parents=True)
    (data / "state" / "desired.json").write_text(json.dumps({"format": 9}))
    slot = install_tree(data, "b", "0.2.1")
    with pytest.raises(InstallRefused, match="StateUnreadable"):
        run(smoke_test(slot, "0.2.1", data_dir=data, config_path=None))


def test_an_invalid_config_fails(tmp_path: Path) -> None:
    data = tmp_path / "d"
    config = tmp_path / "edged.toml"
    config.write_text("[bogus]\nx = 1\n")
    slot = install_tree(data, "b", "0.2.1")
    with pytest.raises(InstallRefused, match="ConfigInvalid"):
        run(smoke_test(slot, "0.2.1", data_dir=data, config_path=config))


def test_a_check_that_hangs_is_stopped(tmp_path: Path) -> None:
    data = tmp_path / "d"

    def hangs(lib: Path) -> None:
        (lib / "edged" / "__main__.py").write_text("import time\ntime.sleep(60)\n")

    slot = install_tree(data, "b", "0.2.1", patch=hangs)
    with pytest.raises(InstallRefused, match="did not answer within 1s"):
        run(smoke_test(slot, "0.2.1", data_dir=data, config_path=None, timeout_s=1))


def test_the_check_reads_only(tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir()
    assert check(None, data).ok
    assert list(data.iterdir()) == []


def test_the_running_slot_is_replaced_on_the_path() -> None:
    env = slot_environ(
        {"PYTHONPATH": "/d/agent/slots/a/lib:/src", "NOTIFY_SOCKET": "@x"},
        Path("/d/agent/slots/b/lib"),
        Path("/d"),
    )
    assert env == {"PYTHONPATH": "/d/agent/slots/b/lib:/src"}
