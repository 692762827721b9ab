"""kubectl's everyday verbs against a real hub (tests/edgectl/conftest.py): ``get all``, the
AGE column, ``get events -w``, ``logs deployment/NAME`` and ``-l``, did-you-mean for a mistyped
command, and a reader that goes away (``edgectl get ... | head``). What a connected device
answers to ``logs`` is in tests/e2e/test_hub_fleet.py (real edged)."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path

import orjson
from edgectltesting import EDGECTL, MANIFESTS, edgectl

from edgectl.logshowing import human_line


def test_get_all_lists_devices_deployments_and_agentupgrades(config: Path) -> None:
    assert edgectl(config, "apply", "-f", "-", stdin=MANIFESTS).returncode == 0
    done = edgectl(config, "get", "all")
    assert done.returncode == 0, done.stderr
    tables = done.stdout.strip().split("\n\n")
    assert tables[0].splitlines()[0].split()[0] == "NAME"
    assert [line.split()[0] for line in tables[0].splitlines()[1:]] == [
        "device/cam-1",
        "device/cam-2",
    ]
    assert any(line.startswith("modeldeployment/fraud ") for line in tables[1].splitlines())
    names = edgectl(config, "get", "all", "-o", "name").stdout.splitlines()
    assert "device/cam-1" in names and "modeldeployment/fraud" in names
    listed = orjson.loads(edgectl(config, "get", "all", "-o", "json").stdout)
    assert listed["kind"] == "List" and {i["kind"] for i in listed["items"]} >= {
        "Device",
        "ModelDeployment",
    }
    selected = edgectl(config, "get", "all", "-l", "site=depot", "-o", "name").stdout
    assert selected == "device/cam-2\n"
    assert edgectl(config, "get", "all", "-l", "site=nowhere").stdout == "No resources found.\n"
    for args, why in (
        (["get", "all", "-w"], "-w/--watch does not apply to all"),
        (["get", "all", "fraud"], "cannot follow all"),
    ):
        done = edgectl(config, *args)
        assert done.returncode == 2 and why in done.stderr, done.stderr


def test_tables_have_an_age_column(config: Path) -> None:
    assert edgectl(config, "apply", "-f", "-", stdin=MANIFESTS).returncode == 0
    lines = edgectl(config, "get", "deployments").stdout.splitlines()
    header = lines[0].split()
    assert header[-1] == "AGE"
    assert re.fullmatch(r"\d+[smhd]", lines[1].split()[-1]), lines
    wide = edgectl(config, "get", "deployments", "-o", "wide").stdout.splitlines()[0].split()
    assert wide.index("AGE") == header.index("AGE")  # before the wide columns, as kubectl's
    assert "AGE" not in edgectl(config, "get", "models").stdout.splitlines()[0].split()


def test_get_events_watch_prints_each_new_event(config: Path) -> None:
    watcher = subprocess.Popen(
        [EDGECTL, "--config", str(config), "get", "events", "-w", "--for", "deployment/watched"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    reader = threading.Thread(
        target=lambda: seen.extend(iter(watcher.stdout.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    try:
        time.sleep(1.0)  # the watch is open
        manifest = MANIFESTS.split("---")[0].replace("fraud", "watched")
        assert edgectl(config, "apply", "-f", "-", stdin=manifest).returncode == 0
        deadline = time.monotonic() + 20
        while not any("modeldeployment/watched" in line for line in seen):
            assert time.monotonic() < deadline, (seen, watcher.poll())
            time.sleep(0.1)
        assert seen[0].split()[:3] == ["AGE", "TYPE", "REASON"]
        assert not any("modeldeployment/fraud" in line for line in seen)  # --for
    finally:
        watcher.terminate()
        watcher.wait(10)
    json_watch = edgectl(config, "get", "events", "-w", "-o", "json", "--sort-by", ".time")
    assert (
        json_watch.returncode == 2 and "--sort-by does not apply with --watch" in json_watch.stderr
    )


def test_logs_of_a_deployment_or_a_selector_ask_each_of_its_devices(config: Path) -> None:
    assert edgectl(config, "apply", "-f", "-", stdin=MANIFESTS).returncode == 0
    done = edgectl(config, "logs", "deployment/fraud", "--since", "10m")
    assert done.returncode == 1  # cam-1 holds it and is not connected: said, then none answered
    assert done.stderr.startswith("device/cam-1: device cam-1 is not connected"), done.stderr
    done = edgectl(config, "logs", "-l", "site=depot", "fraud")
    assert done.returncode == 1 and done.stderr.startswith("device/cam-2: "), done.stderr
    for args, code, why in (
        (["logs", "deployment/nope"], 1, 'ModelDeployment "nope" not found'),
        (["logs", "-l", "site=nowhere"], 1, "no device matches (-l site=nowhere)"),
        (
            ["logs", "-l", "site", "--max-log-requests", "1"],
            2,
            "2 devices would be asked, at most 1",
        ),
        (["logs", "deployment/fraud", "x"], 2, "deployment/fraud is the workload"),
        (["logs", "device/cam-1", "-l", "a=b"], 2, "-l/--selector does not apply with device/"),
        (["logs", "device/cam-1", "--since", "soon"], 2, "--since"),
    ):
        done = edgectl(config, *args)
        assert done.returncode == code and why in done.stderr, (args, done.stderr)


def test_a_log_record_reads_as_a_line_for_a_person() -> None:
    record = orjson.dumps(
        {"ts": "2026-12-06T23:00:00.123Z", "level": "info", "logger": "edged", "event":
         "replica ready", "replica": "det-ab12-0", "workload": "det", "note": "two words"}
    ).decode()  # fmt: skip
    assert human_line(record, "dev-a") == (
        "2026-12-06T23:00:00.123Z info    [dev-a] replica ready replica=det-ab12-0 workload=det "
        'note="two words"'
    )
    worker = orjson.dumps(
        {"ts": "2026-12-06T23:00:01.000Z", "level": "warning", "logger": "worker", "event":
         "worker output", "replica": "det-ab12-0", "workload": "det", "stream": "stderr",
         "line": "loaded"}
    ).decode()  # fmt: skip
    assert human_line(worker) == "2026-12-06T23:00:01.000Z warning det-ab12-0: loaded"
    assert human_line("not json", "d") == "[d] not json"


def test_a_mistyped_command_says_what_it_may_have_been(config: Path) -> None:
    for args, message in (
        (["gte", "devices"], "error: edgectl: unknown command 'gte'; did you mean 'get'?"),
        (["rollout", "promot", "x"], "unknown command 'promot'; did you mean 'promote'?"),
        (["get", "deploymnts"], "unknown resource type 'deploymnts'; did you mean 'deployments'?"),
    ):
        done = edgectl(config, *args)
        assert done.returncode == 2 and done.stderr.startswith("error: "), done.stderr
        assert message in done.stderr, done.stderr


def test_a_reader_that_goes_away_ends_edgectl_quietly(config: Path) -> None:
    """``edgectl get ... | head``: no 'error: [Errno 32] Broken pipe', no traceback; the exit
    status a shell shows for a program its reader left (SIGPIPE), as kubectl's."""
    assert edgectl(config, "apply", "-f", "-", stdin=MANIFESTS).returncode == 0  # events exist
    for args in (["get", "devices"], ["get", "events", "-w"]):
        process = subprocess.Popen(
            [EDGECTL, "--config", str(config), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdout is not None
        process.stdout.close()  # the reader is gone before edgectl writes
        _, err = process.communicate(timeout=30)
        assert (process.returncode, err) == (141, b""), args
