"""A worker's last termination for people (``describe device``, ``describe deployment``): pure,
from documents as the hub shows them; nothing is printed where nothing ended."""

from __future__ import annotations

from edgectl import printing

LAST = {
    "replica": "hog-r-0",
    "reason": "OOMKilled",
    "message": "worker killed by the kernel's OOM killer",
    "exitCode": 0,
    "signal": 9,
    "finishedAt": 0.0,
}
TEXT = (
    "OOMKilled (signal 9) at 1970-01-01T00:00:00Z, replica hog-r-0: worker killed by the "
    "kernel's OOM killer, 1 restarts"
)


def test_describe_device_prints_a_terminations_field_only_when_one_ended() -> None:
    workloads = {
        "hog": {"modelVersion": "1.0.0", "lastTermination": LAST, "restartCount": 1},
        "det": {"modelVersion": "1.0.0"},
    }
    text = printing.describe_device({"status": {"workloads": workloads}}, [], now=0.0)
    assert f"Terminations:     hog: {TEXT}" in text.splitlines()
    assert "det:" not in text.split("Terminations:")[1].split("\n")[0]
    quiet = {"status": {"workloads": {"det": {"modelVersion": "1.0.0"}}}}
    assert "Terminations:" not in printing.describe_device(quiet, [], now=0.0)


def test_describe_deployment_lists_the_devices_the_hub_shows_and_counts_the_rest() -> None:
    status = {
        "terminations": {
            "cam-1": {"lastTermination": LAST, "restartCount": 1},
            "cam-2": {"lastTermination": {**LAST, "signal": 0, "exitCode": 3, "reason": "Error",
                                          "message": ""}, "restartCount": 4},
        },
        "terminatedDevices": 7,
    }  # fmt: skip
    lines = printing.describe_deployment({"status": status}, [], now=0.0).splitlines()
    at = lines.index(f"Terminations:     cam-1: {TEXT}")
    assert lines[at + 1].strip() == (
        "cam-2: Error (exit code 3) at 1970-01-01T00:00:00Z, replica hog-r-0, 4 restarts"
    )
    assert lines[at + 2].strip() == "and 5 more devices"
    assert "Terminations:" not in printing.describe_deployment({"status": {}}, [], now=0.0)


def test_devices_show_their_agent_version_wide_and_described() -> None:
    """``get devices -o wide`` has an AGENT column, ``describe device`` an Agent field; a
    version the hub refuses is marked, and describe says why."""
    refused = "AgentVersionOutsideWindow: edged 0.9.0 is outside what hub 0.2.0 accepts"
    docs = [
        {"metadata": {"name": "cam-1"}, "status": {"agentVersion": "0.2.0"}},
        {
            "metadata": {"name": "cam-2"},
            "status": {"agentVersion": "0.9.0", "agentRefused": refused},
        },
        {"metadata": {"name": "cam-3"}, "status": {}},  # an older hub: no version shown
    ]
    header = printing.header_of("Device", wide=True)
    assert "AGENT" not in printing.header_of("Device", wide=False)
    column = [
        row[header.index("AGENT")] for row in printing.rows_of("Device", docs, now=0.0, wide=True)
    ]
    assert column == ["0.2.0", "0.9.0(refused)", "<unknown>"]
    lines = printing.describe_device(docs[1], [], now=0.0).splitlines()
    assert f"Agent:            edged 0.9.0, refused: {refused}" in lines
    assert "Agent:            edged 0.2.0" in printing.describe_device(docs[0], [], now=0.0)
