"""The A/B launcher as a process over fake slots: a commit, a crash loop and a missed deadline
roll back by themselves, an unreadable state falls back to the package, sd_notify is proxied
and stored descriptors reach the next edged."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launchertesting import (
    ROOT,
    install_fake,
    install_slot,
    launcher,
    runs,
    set_behaviour,
    state,
    try_request,
    wait_runs,
    write_request,
)
from polltesting import wait_for
from systemdtesting import open_notify_socket

from edged.launcher import cleanup as launcher_cleanup
from edged.launcher import main as launcher_main
from edged.launcher import state as launcher_state


@pytest.fixture
def package(tmp_path: Path) -> Path:
    return install_fake(tmp_path / "package", "0.1.0", "serve")


def test_a_device_that_never_updated_runs_the_package(tmp_path: Path, package: Path) -> None:
    data = tmp_path / "d"
    with launcher(data, package) as lp:
        first = wait_runs(data, 1)[0]
        assert first["slot"] == "package" and first["trial"] == "0"
        assert lp.stop() == 0
    assert not (data / "agent" / "launcher.json").exists()  # nothing happened to write


def test_a_trial_that_commits_is_the_committed_slot(tmp_path: Path, package: Path) -> None:
    data = tmp_path / "d"
    install_slot(data, "b", "0.2.0", "commit")
    set_behaviour(package, "request")
    (data / "next-request.json").write_text(json.dumps(try_request("b", "0.2.0", upgrade="u")))
    with launcher(data, package) as lp:
        wait_for(lambda: state(data)["committed"] == "b", 20, "the commit")
        s = state(data)
        assert s["committedVersion"] == "0.2.0" and s["trying"] is None
        assert s["last"]["outcome"] == "Committed" and s["last"]["tries"] == 1
        assert s["last"]["upgrade"] == "u"
        assert [(r["slot"], r["trial"]) for r in runs(data)] == [("package", "0"), ("b", "1")]
        assert not (data / "agent" / "request.json").exists()
        assert lp.stop() == 0
    with launcher(data, package) as lp:  # the next boot runs the committed slot
        assert wait_runs(data, 3)[2]["slot"] == "b"
        assert wait_runs(data, 3)[2]["trial"] == "0"
        lp.stop()


def test_a_release_that_crashes_at_start_rolls_back_after_max_tries(
    tmp_path: Path, package: Path
) -> None:
    data = tmp_path / "d"
    install_slot(data, "a", "0.2.0", "crash")
    write_request(data, try_request("a", "0.2.0", maxTries=3))
    with launcher(data, package) as lp:
        wait_for(lambda: len(runs(data)) >= 4 and runs(data)[3]["slot"] == "package", 20, "back")
        s = state(data)
        assert s["committed"] == "package" and s["trying"] is None
        assert s["last"]["outcome"] == "RolledBack"
        assert s["last"]["reason"] == "CrashLoop" and s["last"]["tries"] == 3
        assert [r["slot"] for r in runs(data)] == ["a", "a", "a", "package"]
        assert lp.stop() == 0


def test_without_pidfd_a_crash_loop_still_rolls_back(tmp_path: Path, package: Path) -> None:
    data = tmp_path / "d"
    install_slot(data, "a", "0.2.0", "crash")
    write_request(data, try_request("a", "0.2.0", maxTries=2))
    with launcher(data, package, no_pidfd=True) as lp:
        wait_for(lambda: len(runs(data)) >= 3, 20, "back to the package", detail=lp.output)
        assert [r["slot"] for r in runs(data)] == ["a", "a", "package"]
        assert state(data)["last"]["reason"] == "CrashLoop"
        assert lp.stop() == 0


def test_a_release_that_never_commits_rolls_back_at_the_deadline(
    tmp_path: Path, package: Path
) -> None:
    data = tmp_path / "d"
    install_slot(data, "b", "0.2.0", "serve")
    write_request(data, try_request("b", "0.2.0", commitDeadlineSeconds=1.5))
    with launcher(data, package) as lp:
        wait_for(lambda: len(runs(data)) >= 2, 20, "the rollback")
        s = state(data)
        assert s["last"]["reason"] == "CommitDeadlineExceeded"
        assert s["committed"] == "package" and s["trying"] is None
        assert [r["slot"] for r in runs(data)] == ["b", "package"]
        lp.stop()


def test_edged_can_abort_its_own_trial(tmp_path: Path, package: Path) -> None:
    data = tmp_path / "d"
    slot = install_slot(data, "b", "0.2.0", "request")
    (data / "next-request.json").write_text(
        json.dumps({"action": "abort", "id": "x", "reason": "RolledBackByHub"})
    )
    write_request(data, try_request("b", "0.2.0"))
    with launcher(data, package) as lp:
        wait_for(lambda: len(runs(data)) >= 2, 20, "the package again")
        assert state(data)["last"]["reason"] == "RolledBackByHub"
        assert [r["slot"] for r in runs(data)] == ["b", "package"]
        set_behaviour(slot, "serve")
        lp.stop()


@pytest.mark.parametrize(
    ("request_doc", "why"),
    [
        (try_request("a", "0.2.0"), "does not hold a complete release"),  # not installed
        (try_request("c", "0.2.0"), "is not one of"),
        (try_request("package", "0.1.0"), "is the committed one"),
        (try_request("b", "0.2.0", maxTries=0), "maxTries"),
        ({"action": "format"}, "unknown action"),
    ],
)
def test_an_invalid_request_is_refused_and_changes_nothing(
    tmp_path: Path, package: Path, request_doc: dict[str, object], why: str
) -> None:
    data = tmp_path / "d"
    install_slot(data, "b", "0.2.0", "commit")
    install_slot(data, "a", "0.2.0", "commit", complete=False)  # half installed: never tried
    write_request(data, request_doc)
    with launcher(data, package) as lp:
        assert wait_runs(data, 1)[0]["slot"] == "package"
        s = state(data)
        assert s["committed"] == "package" and s["trying"] is None
        assert s["last"]["reason"] == "InvalidRequest" and why in s["last"]["message"]
        assert not (data / "agent" / "request.json").exists()
        lp.stop()


@pytest.mark.parametrize("content", [b"", b'{"format": 1, "committed": "b"', b"\x00" * 300, b"[]"])
def test_an_unreadable_state_falls_back_to_the_package(
    tmp_path: Path, package: Path, content: bytes
) -> None:
    data = tmp_path / "d"
    install_slot(data, "b", "0.2.0", "crash")
    (data / "agent").mkdir(parents=True, exist_ok=True)
    (data / "agent" / "launcher.json").write_bytes(content)
    with launcher(data, package) as lp:
        assert wait_runs(data, 1)[0]["slot"] == "package"
        assert "running the package" in lp.output()
        lp.stop()


def test_a_committed_slot_that_lost_its_release_falls_back_to_the_package(
    tmp_path: Path, package: Path
) -> None:
    data = tmp_path / "d"
    slot = install_slot(data, "a", "0.2.0", "serve")
    (data / "agent" / "launcher.json").write_text(
        json.dumps({**launcher_state.empty_state(), "committed": "a", "committedVersion": "0.2.0"})
    )
    (slot / "installed.json").unlink()
    with launcher(data, package) as lp:
        assert wait_runs(data, 1)[0]["slot"] == "package"
        lp.stop()


def test_sd_notify_is_proxied_and_the_launcher_pings_the_watchdog(
    tmp_path: Path, package: Path
) -> None:
    data = tmp_path / "d"
    with (
        open_notify_socket() as ns,
        launcher(
            data, package, env={"NOTIFY_SOCKET": ns.env_value, "WATCHDOG_USEC": "2000000"}
        ) as lp,
    ):
        ns.wait_for("READY=1", 20)
        assert any("STATUS=fake edged serving" in text for _, text in ns.received())
        ns.wait_for("WATCHDOG=1", 20)
        assert runs(data)[0]["watchdog"] == "2000000"
        lp.stop()


def test_a_stuck_edged_is_killed_by_the_launchers_watchdog(tmp_path: Path, package: Path) -> None:
    data = tmp_path / "d"
    set_behaviour(package, "silent")
    with launcher(data, package, env={"WATCHDOG_USEC": "1000000"}) as lp:
        wait_runs(data, 1)
        assert lp.proc.wait(20) == 128 + 6  # SIGABRT: systemd restarts the launcher
        assert "sent no WATCHDOG=1" in lp.output()


def test_stored_descriptors_reach_the_next_edged(tmp_path: Path, package: Path) -> None:
    data = tmp_path / "d"
    set_behaviour(package, "store-fd")
    install_slot(data, "b", "0.2.0", "serve")
    with launcher(data, package) as lp:
        wait_runs(data, 1)
        time.sleep(0.5)  # the fake stores its pipe before READY, and READY at once
        write_request(data, try_request("b", "0.2.0"))  # as edged does before it exits
        os.kill(runs(data)[0]["pid"], signal.SIGTERM)
        second = wait_runs(data, 2)[1]
        assert second["slot"] == "b"
        assert second["fdnames"] == "inference"
        assert second["fdcontent"] == ["kept across edged"]
        lp.stop()


def test_datagrams_from_another_process_are_ignored(tmp_path: Path, package: Path) -> None:
    """NotifyAccess=main: a worker (or anyone) cannot commit a trial for edged."""
    data = tmp_path / "d"
    install_slot(data, "b", "0.2.0", "serve")
    write_request(data, try_request("b", "0.2.0", commitDeadlineSeconds=3))
    with launcher(data, package) as lp:
        wait_runs(data, 1)
        name = wait_for(
            lambda: [
                line.split("@", 1)[1]
                for line in open("/proc/net/unix").read().splitlines()  # noqa: SIM115
                if "@edged-launcher/" + str(lp.proc.pid) + "/" in line
            ],
            10,
            "the launcher's socket",
        )[0]
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"EDGED_COMMIT=1", "\0" + name)
        wait_for(lambda: len(runs(data)) >= 2, 20, "the rollback")
        assert state(data)["last"]["reason"] == "CommitDeadlineExceeded"
        lp.stop()


def test_data_dir_comes_from_the_flag_then_the_state_directory() -> None:
    assert launcher_state.data_dir_of(["run", "--data-dir", "/x"], {}) == Path("/x")
    assert launcher_state.data_dir_of(["run", "--data-dir=/y"], {}) == Path("/y")
    assert launcher_state.data_dir_of(["run"], {"STATE_DIRECTORY": "/s:/t"}) == Path("/s")
    assert launcher_state.data_dir_of(["run"], {}) == Path("/var/lib/edged")


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert launcher_main([]) == 2
    assert launcher_main(["--launcher-bogus=1", "run"]) == 2
    assert "unknown" in capsys.readouterr().err


def test_stored_descriptors_go_on_to_systemds_store(tmp_path: Path, package: Path) -> None:
    data = tmp_path / "d"
    set_behaviour(package, "store-fd")
    with open_notify_socket() as ns, launcher(data, package, env={"NOTIFY_SOCKET": ns.env_value}):
        ns.wait_for("FDSTORE=1", 20)
        assert any("FDNAME=inference" in text for _, text in ns.received())


def test_descriptors_systemd_gave_the_launcher_reach_edged(tmp_path: Path, package: Path) -> None:
    """After a restart of the unit, systemd hands its store to the launcher (LISTEN_FDS with
    the launcher's pid): the launcher hands it on to edged."""
    data = tmp_path / "d"
    data.mkdir()
    r, w = os.pipe()
    os.write(w, b"from systemd's store")
    os.close(w)
    wrapper = (
        "import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ['LISTEN_PID'] = str(os.getpid());"
        " os.environ['LISTEN_FDS'] = '1'; os.environ['LISTEN_FDNAMES'] = 'inference';"
        " os.execv(sys.executable, [sys.executable, '-m', 'edged.launcher', *sys.argv[2:]])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", wrapper, str(r), f"--launcher-package-path={package / 'lib'}",
         "run", "--data-dir", str(data)],
        pass_fds=(r,), env=env, start_new_session=True,
    )  # fmt: skip
    os.close(r)
    try:
        first = wait_runs(data, 1)[0]
        assert first["fdnames"] == "inference" and first["fdcontent"] == ["from systemd's store"]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_package_can_be_tried_again_after_a_commit(tmp_path: Path, package: Path) -> None:
    """A rollback by the hub after a commit: the package is tried, commits, and is committed."""
    data = tmp_path / "d"
    install_slot(data, "b", "0.2.0", "serve")
    (data / "agent" / "launcher.json").write_text(
        json.dumps({**launcher_state.empty_state(), "committed": "b", "committedVersion": "0.2.0"})
    )
    set_behaviour(package, "commit")
    write_request(data, try_request("package", "0.1.0"))
    with launcher(data, package) as lp:
        wait_for(lambda: state(data)["committed"] == "package", 20, "the package committed")
        assert runs(data)[0]["slot"] == "package" and runs(data)[0]["trial"] == "1"
        lp.stop()


def test_a_state_that_cannot_be_written_never_runs_an_uncounted_try(
    tmp_path: Path, package: Path
) -> None:
    data = tmp_path / "d"
    install_slot(data, "b", "0.2.0", "commit")
    (data / "agent" / "launcher.json").mkdir()  # every write of the state fails
    write_request(data, try_request("b", "0.2.0"))
    with launcher(data, package) as lp:
        assert wait_runs(data, 1)[0]["slot"] == "package"
        assert "cannot write" in lp.output() and "committed slot runs instead" in lp.output()
        assert (data / "agent" / "request.json").exists()  # taken again at the next start
        lp.stop()


def test_a_fault_of_the_launcher_still_runs_the_packages_edged(
    tmp_path: Path, package: Path
) -> None:
    data = tmp_path / "d"
    data.mkdir()
    (data / "agent").write_text("not a directory")  # the launcher cannot keep its state
    with launcher(data, package) as lp:
        first = wait_runs(data, 1)[0]
        assert first["slot"] is None  # edged itself, exec'd in the launcher's place
        assert "running the package's edged without it" in lp.output()


def test_a_new_trial_ends_the_one_before_with_why(tmp_path: Path, package: Path) -> None:
    data = tmp_path / "d"
    install_slot(data, "a", "0.2.1", "commit")
    slot_b = install_slot(data, "b", "0.2.2", "request")
    (data / "next-request.json").write_text(json.dumps(try_request("a", "0.2.1")))
    write_request(data, try_request("b", "0.2.2"))
    with launcher(data, package) as lp:
        wait_for(lambda: state(data)["committed"] == "a", 20, "a committed", detail=lp.output)
        assert "RolledBack b (0.2.2): Superseded" in lp.output()
        set_behaviour(slot_b, "serve")
        lp.stop()


def _cgroup(path: Path, procs: list[int], enabled: str = "") -> Path:
    """A directory standing for a cgroup (the tests' cgroupfs: each write replaces the file)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.procs").write_text("".join(f"{p}\n" for p in procs))
    (path / "cgroup.subtree_control").write_text(enabled)
    return path


def _sleeper(*marker: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *marker])


def _record(data_dir: Path, *workers: subprocess.Popen[bytes]) -> frozenset[tuple[int, int]]:
    """Each worker's record as edged writes it (the fields the cleanup reads), read back."""
    (data_dir / "state" / "workers").mkdir(parents=True, exist_ok=True)
    for w in workers:
        stat = Path(f"/proc/{w.pid}/stat").read_text().rpartition(")")[2].split()
        doc = {"format": 1, "replica_id": f"mlp-{w.pid}", "pid": w.pid, "start_time": int(stat[19])}
        (data_dir / "state" / "workers" / f"mlp-{w.pid}.json").write_text(json.dumps(doc))
    return launcher_cleanup.recorded_workers(data_dir)


def _rmdir_fake(path: Path) -> None:
    """os.rmdir as cgroupfs does it: the interface files go with the directory."""
    for f in path.iterdir():
        if f.is_file():
            f.unlink()
    os.rmdir(path)


def _gone(p: subprocess.Popen[bytes]) -> bool:
    return p.poll() is not None


def test_cleanup_ends_an_orphaned_edged_and_releases_the_kept_workers(tmp_path: Path) -> None:
    """edged.service's ExecStopPost= after a launcher died (kill -9): the edged it left in
    <unit>/supervisor is killed, the kept worker runs on and the controllers are disabled
    below the unit, deepest first (systemd 252 starts the next launcher in <unit> itself:
    219/CGROUP otherwise); <unit>/.control (the cleanup's own) is never touched."""
    edged, worker, control = _sleeper(), _sleeper(launcher_cleanup.WORKER_MODULE), _sleeper()
    try:
        unit = _cgroup(tmp_path / "edged.service", [], "cpu memory")
        _cgroup(unit / "supervisor", [edged.pid])
        work = _cgroup(unit / "workloads", [], "cpu memory")
        _cgroup(work / "mlp-abc-0", [worker.pid])
        own = _cgroup(unit / ".control", [control.pid])
        records = _record(tmp_path / "data", worker)
        said = launcher_cleanup.cleanup_cgroup(unit, own, records=records, rmdir=_rmdir_fake)
        assert f"1 process(es) ended ([{edged.pid}])" in said, said
        assert "1 kept worker(s) left" in said and "controllers disabled" in said, said
        assert edged.wait(5) == -signal.SIGKILL
        assert not _gone(worker) and not _gone(control)
        assert (work / "mlp-abc-0").is_dir()
        assert (work / "cgroup.subtree_control").read_text() == "-cpu -memory"
        assert (unit / "cgroup.subtree_control").read_text() == "-cpu -memory"
        # with DelegateSubgroup= (systemd 254) the controllers stay: the next launcher
        # starts in a leaf of its own
        (unit / "cgroup.subtree_control").write_text("cpu memory")
        said = launcher_cleanup.cleanup_cgroup(
            unit, own, records=records, release=False, rmdir=_rmdir_fake
        )
        assert said == "0 process(es) ended; 1 kept worker(s) left for the next edged", said
        assert (unit / "cgroup.subtree_control").read_text() == "cpu memory"
    finally:
        for p in (edged, worker, control):
            p.kill()
            p.wait()


def test_cleanup_ends_the_workers_where_it_cannot_release_them(tmp_path: Path) -> None:
    """A controller that cannot be disabled (here: the file is a directory) would leave the
    unit unable to start: the kept workers are killed too and the leaves removed."""
    worker = _sleeper(launcher_cleanup.WORKER_MODULE)
    try:
        unit = _cgroup(tmp_path / "edged.service", [], "cpu memory")
        work = _cgroup(unit / "workloads", [], "")
        (work / "cgroup.subtree_control").unlink()
        (work / "cgroup.subtree_control").mkdir()
        _cgroup(work / "mlp-abc-0", [worker.pid])
        records = _record(tmp_path / "data", worker)
        said = launcher_cleanup.cleanup_cgroup(unit, None, records=records, rmdir=shutil.rmtree)
        assert said.startswith(f"cannot disable the controllers of {work}"), said
        assert f"1 process(es) ended ([{worker.pid}])" in said and "ready" in said, said
        assert worker.wait(5) == -signal.SIGKILL
        assert not (unit / "workloads").exists()
        assert (unit / "cgroup.subtree_control").read_text() == "-cpu -memory"
    finally:
        worker.kill()
        worker.wait()


def test_cleanup_empties_the_unit_cgroup_for_the_next_start(tmp_path: Path) -> None:
    """With no kept worker (keepOnExit not in force) every process below the unit but the
    cleanup's own is killed, the leaves are removed deepest first and the unit's controllers
    disabled: systemd may start the next launcher in <unit> itself."""
    edged, child = _sleeper(), _sleeper()
    try:
        unit = _cgroup(tmp_path / "edged.service", [], "cpu memory")
        _cgroup(unit / "supervisor", [edged.pid])
        work = _cgroup(unit / "workloads", [], "cpu memory")
        _cgroup(work / "mlp-abc-0", [child.pid])
        own = _cgroup(unit / ".control", [])
        said = launcher_cleanup.cleanup_cgroup(unit, own, rmdir=_rmdir_fake)
        assert "2 process(es) ended" in said and "3 cgroup(s) removed" in said, said
        assert _gone(edged) or edged.wait(5) is not None
        assert child.wait(5) == -signal.SIGKILL
        assert sorted(p.name for p in unit.iterdir() if p.is_dir()) == [".control"]
        assert (unit / "cgroup.subtree_control").read_text() == "-cpu -memory"
        # again: nothing left to do, and nothing to do where there is no cgroup
        again = launcher_cleanup.cleanup_cgroup(unit, own)
        assert again == f"0 process(es) ended; 0 cgroup(s) removed; {unit} is ready", again
        assert "not a cgroup" in launcher_cleanup.cleanup_cgroup(tmp_path / "nowhere")
    finally:
        for p in (edged, child):
            p.kill()
            p.wait()


def test_cleanup_keeps_only_workers_an_edged_recorded(tmp_path: Path) -> None:
    """A process that calls itself a worker (its argv) without a record, or whose pid is
    recorded with another start time (a pid reused), can never be adopted: it is killed.
    A record too large, of another format or not JSON names no worker."""
    real, claims, reused = (_sleeper(launcher_cleanup.WORKER_MODULE) for _ in range(3))
    try:
        data = tmp_path / "data"
        _record(data, real, reused)
        doc = json.loads((data / "state" / "workers" / f"mlp-{reused.pid}.json").read_text())
        doc["start_time"] += 1
        (data / "state" / "workers" / f"mlp-{reused.pid}.json").write_text(json.dumps(doc))
        workers = data / "state" / "workers"
        (workers / "big.json").write_text(
            json.dumps({"format": 1, "pid": claims.pid, "x": "." * (1 << 20)})
        )
        (workers / "old.json").write_text(
            json.dumps({"format": 0, "pid": claims.pid, "start_time": 1})
        )
        (workers / "bad.json").write_text("{")
        records = launcher_cleanup.recorded_workers(data)
        assert len(records) == 2
        unit = _cgroup(tmp_path / "edged.service", [], "cpu memory")
        work = _cgroup(unit / "workloads", [], "cpu memory")
        _cgroup(work / "a", [real.pid])
        _cgroup(work / "b", [claims.pid])
        _cgroup(work / "c", [reused.pid])
        said = launcher_cleanup.cleanup_cgroup(unit, None, records=records, rmdir=_rmdir_fake)
        assert "2 process(es) ended" in said and "1 kept worker(s) left" in said, said
        assert claims.wait(5) == -signal.SIGKILL and reused.wait(5) == -signal.SIGKILL
        assert not _gone(real)
    finally:
        for p in (real, claims, reused):
            p.kill()
            p.wait()


MOUNTINFO = "30 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_cleanup_finds_its_unit_only_as_its_control_process() -> None:
    found = launcher_cleanup.own_unit_cgroup("0::/system.slice/edged.service/.control\n", MOUNTINFO)
    unit = Path("/sys/fs/cgroup/system.slice/edged.service")
    assert found == (unit, unit / ".control")
    # by hand from a shell, or as the main process: it names no unit and kills nothing
    for cg in ("0::/user.slice/user-1000.slice/session-3.scope", "0::/system.slice/edged.service"):
        said = launcher_cleanup.own_unit_cgroup(cg + "\n", MOUNTINFO)
        assert isinstance(said, str) and "ExecStopPost=" in said
    assert (
        launcher_cleanup.own_unit_cgroup("1:name=systemd:/x\n", "")
        == "no cgroup v2 (nothing to do)"
    )


def test_cleanup_leaves_workers_on_rlimits(tmp_path: Path) -> None:
    """Workers in the unit's cgroup itself (no controller enabled there: rlimits) block no
    start: they are left as they are."""
    worker, edged = _sleeper(launcher_cleanup.WORKER_MODULE), _sleeper()
    try:
        unit = _cgroup(tmp_path / "edged.service", [worker.pid, edged.pid], "")
        own = _cgroup(unit / ".control", [])
        records = _record(tmp_path / "data", worker)
        said = launcher_cleanup.cleanup_cgroup(unit, own, records=records, rmdir=_rmdir_fake)
        assert f"1 process(es) ended ([{edged.pid}])" in said and "1 kept worker" in said, said
        assert edged.wait(5) == -signal.SIGKILL and not _gone(worker)
    finally:
        for p in (worker, edged):
            p.kill()
            p.wait()


def test_cleanup_command_line(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "edged.launcher", "cleanup"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bad = subprocess.run([*run, "relative"], check=False, capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "usage" in bad.stderr
    ok = subprocess.run([*run, str(tmp_path)], check=False, capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and "not a cgroup" in ok.stderr, ok.stderr
    # the records read from --data-dir: the recorded worker is left, the other one killed
    worker, other = _sleeper(launcher_cleanup.WORKER_MODULE), _sleeper()
    try:
        _record(tmp_path / "data", worker)
        unit = _cgroup(tmp_path / "edged.service", [worker.pid, other.pid], "")
        args = ["--data-dir", str(tmp_path / "data"), str(unit)]
        done = subprocess.run([*run, *args], check=False, capture_output=True, text=True, env=env)
        assert done.returncode == 0 and "1 kept worker(s) left" in done.stderr, done.stderr
        assert other.wait(5) == -signal.SIGKILL and not _gone(worker)
    finally:
        for p in (worker, other):
            p.kill()
            p.wait()
    mine = subprocess.run(run, check=False, capture_output=True, text=True, env=env)
    assert mine.returncode == 0 and "cleanup:" in mine.stderr, mine.stderr
