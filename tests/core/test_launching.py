"""edgefleet.launching: real child processes (small Python modules written to a temp dir, and
a real ``edged run`` refusing its config); nothing faked. Each test stops what it started."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from edgefleet.launching import (
    Launched,
    LaunchError,
    free_port_pair,
    launch,
    program_command,
    start_edged,
    start_hub,
)

# A program that says it started, then sleeps; with "stubborn" it ignores SIGTERM.
SLEEPER = """\
import signal, sys, time
if "stubborn" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("started", flush=True)
time.sleep(60)
"""


@pytest.fixture
def programs(tmp_path: Path) -> Path:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "failing.py").write_text("import sys\nprint('no config here')\nsys.exit(2)\n")
    return tmp_path


def _started(p: Launched) -> bool:
    return "started" in p.log_tail()


def test_program_command_runs_a_program_as_a_module_of_this_python() -> None:
    command = program_command("edged", "run", Path("/d"))
    assert command == [sys.executable, "-m", "edged", "run", "/d"]
    assert program_command("hub", python="/opt/py")[:3] == ["/opt/py", "-m", "hub"]


def test_stop_sends_sigterm_and_returns_the_exit_code(programs: Path) -> None:
    p = launch("sleeper", log=programs / "s.log", cwd=programs)
    p.wait_until(lambda: _started(p), timeout=30, what="it to start")
    assert p.running()
    assert p.stop(10) == 0
    assert not p.running()
    assert p.stop() == 0  # stopping a stopped process changes nothing


def test_stop_kills_a_process_that_ignores_sigterm(programs: Path) -> None:
    p = launch("sleeper", "stubborn", log=programs / "s.log", cwd=programs)
    p.wait_until(lambda: _started(p), timeout=30, what="it to start")
    t0 = time.monotonic()
    assert p.stop(0.5) == -9
    assert time.monotonic() - t0 < 5


def test_terminate_then_stop_stops_several_at_once(programs: Path) -> None:
    ps = [launch("sleeper", log=programs / f"{i}.log", cwd=programs) for i in range(3)]
    for p in ps:
        p.wait_until(lambda p=p: _started(p), timeout=30, what="it to start")
        p.terminate()
    assert [p.stop(10) for p in ps] == [0, 0, 0]


def test_kill_is_sigkill(programs: Path) -> None:
    p = launch("sleeper", log=programs / "s.log", cwd=programs)
    assert p.kill() == -9


def test_waiting_fails_at_once_when_the_process_exits_and_shows_its_log(programs: Path) -> None:
    p = launch("failing", log=programs / "f.log", cwd=programs)
    with pytest.raises(LaunchError) as info:
        p.wait_until(lambda: False, timeout=30, what="something")
    text = str(info.value)
    assert "failing (pid" in text and "exited with code 2 while waiting for something" in text
    assert "no config here" in text


def test_waiting_times_out(programs: Path) -> None:
    p = launch("sleeper", log=programs / "s.log", cwd=programs)
    try:
        calls = []

        def never() -> bool:
            calls.append(1)
            raise OSError("not there yet")  # counts as "not yet", never escapes

        with pytest.raises(LaunchError, match=r"timed out after 0.3 s while waiting for it"):
            p.wait_until(never, timeout=0.3, what="it")
        assert len(calls) > 1
    finally:
        p.stop(10)


def test_start_edged_reports_an_edged_that_refuses_its_config(tmp_path: Path) -> None:
    config = tmp_path / "edged.toml"
    config.write_text("[reconcile]\nresyncPerod = '1s'\n")
    edged = start_edged(tmp_path / "data", config=config, log=tmp_path / "edged.log")
    assert edged.status_socket == tmp_path / "data" / "edged.sock"
    assert edged.inference_socket == tmp_path / "data" / "infer.sock"
    with pytest.raises(LaunchError) as info:
        edged.wait_ready(60)
    assert "exited with code 2" in str(info.value)
    assert 'resyncPerod: unknown field (did you mean "resyncPeriod"?)' in str(info.value)


def test_start_hub_reports_a_hub_without_a_data_directory(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port_pair()}"
    hub = start_hub(tmp_path / "absent", listen=address, log=tmp_path / "hub.log")
    assert (hub.host, hub.port) == ("127.0.0.1", int(address.split(":")[1]))
    with pytest.raises(LaunchError, match="exited with code 1 while waiting for the hub"):
        hub.wait_listening(60)
