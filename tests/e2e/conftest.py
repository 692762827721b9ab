"""End-to-end scenarios: real ``edged run`` processes, real ONNX Runtime workers, real sockets.

Nothing is faked. Models are tiny MLPs built with ``onnx`` in a temp dir. Every test here is
marked ``scenario``; ``pytest -m scenario`` runs only these, ``-m "not scenario"`` skips them.
The ``edged_factory`` fixture fails the test if an edged or worker process it started is still
alive afterwards (unless the test failed first), and a failed test's report ends with the
tail of each edged's log.

The fleet fixtures, real processes all:

* ``hub``: ``hub init`` then ``hub serve`` in the test's tmp dir, stopped at the end. A module
  gives ``hub init`` more arguments by overriding ``hub_init_args`` (``("--tuf",)``).
* ``device``: a factory, ``device(name, labels, via=PROXY)``: a device enrolled with the hub
  (through a proxy when ``via`` is given) and started.
* ``devices``: ``fleet_size`` devices ``dev-0``... with ``site=a``, enrolled and started, with
  ``device_config`` as their edged.toml (``{absent}``: a root file that is not there; a module
  overrides ``fleet_size`` and ``device_config``).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll, enrolled_devices
from harness import Edged, wait_for

from edgefleet.demo import TINY_MLP, build_mlp


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.scenario)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "manifests"
    d.mkdir()
    build_mlp(d / "mlp.onnx", TINY_MLP, seed=1)
    return d


# whether the test's call failed; the logs of the edgeds it started
CALL_FAILED = pytest.StashKey[bool]()
EDGED_LOGS = pytest.StashKey[list[Path]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
        if report.failed:  # what edged said: the cause is often there, not in the assertion
            for log_path in item.stash.get(EDGED_LOGS, []):
                try:
                    lines = log_path.read_text(errors="replace").splitlines()
                except OSError:
                    continue
                report.sections.append((f"{log_path.name} (last 60 lines)", "\n".join(lines[-60:])))
    return report


@pytest.fixture
def edged_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Edged]]:
    started: list[Edged] = []

    def make(manifests: Path | None, data: Path | None = None, config: str | None = None) -> Edged:
        e = Edged(
            data or tmp_path / "data",
            manifests,
            tmp_path / f"edged-{len(started)}.log",
            config=config,
        )
        started.append(e)
        request.node.stash.setdefault(EDGED_LOGS, []).append(e.log_path)
        return e

    yield make
    leaked = []
    for e in started:
        if e.launched is not None and e.launched.running():
            e.launched.kill()
            leaked.append(f"edged {e.launched.pid}")
    for e in started:
        for pid in e.all_pids:

            def gone(pid: int = pid) -> bool:
                try:
                    p = psutil.Process(pid)
                    return p.status() == psutil.STATUS_ZOMBIE
                except psutil.NoSuchProcess:
                    return True

            try:
                wait_for(gone, 10, f"process {pid} to exit")
            except AssertionError:
                os.kill(pid, signal.SIGKILL)
                leaked.append(f"pid {pid}")
    # after a failed test the processes it did not get to stop are only cleaned up: the
    # failure is already reported
    assert not leaked or request.node.stash.get(CALL_FAILED, False), (
        f"processes left running: {leaked}"
    )


@pytest.fixture
def hub_init_args() -> tuple[str, ...]:
    """What ``hub init`` is given beyond its data dir and address (a module may override)."""
    return ()


@pytest.fixture
def hub(tmp_path: Path, hub_init_args: tuple[str, ...]) -> Iterator[HubProcess]:
    h = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init(*hub_init_args).start()
    yield h
    h.stop()


@pytest.fixture
def device(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> Iterator[Callable[..., Edged]]:
    started: list[Edged] = []

    def make(name: str, labels: dict[str, str], *, via: str | None = None) -> Edged:
        data = tmp_path / name
        out = enroll(hub, data, name, labels, via=via)
        assert out.returncode == 0, out.stdout + out.stderr
        if via is not None:  # talk to the hub through the proxy from now on
            link = data / "hub" / "link.json"
            doc = json.loads(link.read_text())
            doc["hub"] = via
            link.write_text(json.dumps(doc))
        e = edged_factory(
            None, data=data, config=SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
        )
        started.append(e)
        return e.start()

    yield make
    for e in started:
        if e.proc is not None and e.proc.poll() is None:
            e.terminate()


@pytest.fixture
def fleet_size() -> int:
    """How many devices ``devices`` starts (a module may override)."""
    return 2


@pytest.fixture
def device_config() -> str:
    """The edged.toml of each device ``devices`` starts (a module may override)."""
    return SIGNED_DEVICE_CONFIG


@pytest.fixture
def devices(
    hub: HubProcess,
    tmp_path: Path,
    edged_factory: Callable[..., Edged],
    fleet_size: int,
    device_config: str,
) -> Iterator[list[Edged]]:
    with enrolled_devices(hub, tmp_path, edged_factory, fleet_size, device_config) as started:
        yield started
