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
