"""``edgectl get agentupgrades`` and the dashboard's Agent upgrades page for an upgrade rolled
out in waves at a root hub: the regions' devices summed (not 0/0) and which wave stands where;
pure, from documents as the root shows them."""

from __future__ import annotations

from typing import Any

from edgectl import printing
from hub.api.dashboard import rolloutpages

IN_WAVES: dict[str, Any] = {
    "metadata": {"name": "edged-next"},
    "spec": {"version": "0.3.0"},
    "status": {
        "phase": "Progressing",
        "wave": 2,
        "waveCount": 2,
        "waves": [
            {"wave": 1, "text": "eu", "regions": {"eu": {"sent": True, "phase": "Complete"}}},
            {"wave": 2, "text": "us, ap", "regions": {"ap": {"sent": False}, "us": {"sent": True}}},
        ],
        "poolDevices": 6,
        "doneDevices": 4,
        "updatingDevices": 1,
        "failedCount": 1,
        "failedDevices": {},
    },
}


def test_get_agentupgrades_shows_the_regions_summed_and_the_wave() -> None:
    [row] = printing.rows_of("AgentUpgrade", [IN_WAVES], now=0.0, wide=False)
    assert row == [
        "edged-next", "0.3.0", "Progressing", "4/6", "1", "1", "wave 2/2 (us)", "<unknown>"
    ]  # fmt: skip
    rest = {**IN_WAVES, "status": {**IN_WAVES["status"], "wave": 3, "waves": []}}
    [row] = printing.rows_of("AgentUpgrade", [rest], now=0.0, wide=False)
    assert row[-2] == "wave rest"
    # one hub's upgrade: as before
    plain = {"metadata": {"name": "u"}, "spec": {"version": "0.3.0"},
             "status": {"phase": "Complete", "poolDevices": 3, "doneDevices": 3, "stepCount": 2,
                        "pastLastStep": True, "failedDevices": {"d": "x"}}}  # fmt: skip
    [row] = printing.rows_of("AgentUpgrade", [plain], now=0.0, wide=False)
    assert row == ["u", "0.3.0", "Complete", "3/3", "0", "1", "all", "<unknown>"]


def test_the_dashboard_shows_the_regions_summed_and_the_wave() -> None:
    html = rolloutpages.agent_upgrades_body(
        [{"name": "edged-next", "version": "0.3.0", "status": IN_WAVES["status"]}]
    )
    assert "<td class=num>4/6</td>" in html
    assert "<td class=num>1</td><td class=num>1</td>" in html  # updating, failed
    assert "<td>wave 2 of 2: us</td>" in html
