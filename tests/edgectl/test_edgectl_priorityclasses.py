"""``edgectl get priorityclasses`` against a real hub (tests/edgectl/conftest.py): the built-in
classes the README names are listed beside the applied ones, and described by name."""

from __future__ import annotations

from pathlib import Path

from edgectltesting import edgectl

SAFETY = """\
apiVersion: edgefleet.io/v1
kind: PriorityClass
metadata: {name: safety}
spec: {value: 50000, description: collision avoidance}
"""


def test_get_priorityclasses_shows_the_built_in_ones(config: Path) -> None:
    assert edgectl(config, "apply", "-f", "-", stdin=SAFETY).returncode == 0
    out = edgectl(config, "get", "priorityclasses")
    assert out.returncode == 0, out.stderr
    rows = [line.split()[:3] for line in out.stdout.splitlines()]
    assert rows == [
        ["NAME", "VALUE", "PREEMPTION-POLICY"],
        ["critical", "1000000", "PreemptLowerPriority"],
        ["default", "0", "PreemptLowerPriority"],
        ["high", "1000", "PreemptLowerPriority"],
        ["low", "-1000", "PreemptLowerPriority"],
        ["safety", "50000", "PreemptLowerPriority"],
        ["system-critical", "1000000000", "PreemptLowerPriority"],
    ]
    own = edgectl(config, "get", "pc", "-l", "!edgefleet.io/built-in", "-o", "name")
    assert own.stdout == "priorityclass/safety\n", own.stderr
    got = edgectl(config, "get", "priorityclass/high", "-o", "jsonpath={.spec.value}")
    assert got.stdout == "1000\n", got.stderr
    gone = edgectl(config, "delete", "priorityclass", "low")
    assert gone.returncode != 0 and "built in" in gone.stderr, gone.stdout + gone.stderr
