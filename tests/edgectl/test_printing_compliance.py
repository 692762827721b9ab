"""A device's compliance for people (``describe device``) and the fleet's per baseline
(``get baselines``): pure, from documents as the hub shows them."""

from __future__ import annotations

from edgectl import printing

FINDINGS = [
    {"kind": "ModelFileOpened", "subject": "412", "message": "process 412 (cat) has model "
     "file 0123456789ab open; only edged's workers may"},
    {"kind": "ListeningSocket", "subject": "77", "message": "process 77 (nc) listens on "
     "127.0.0.1:9999; the baselines' tcpPorts allow 8080"},
]  # fmt: skip


def test_describe_device_shows_each_finding_with_its_remediation() -> None:
    report = {
        "checked": True,
        "compliant": False,
        "action": "restartWorkload",
        "findings": FINDINGS,
        "quarantined": None,
        "processesChecked": True,
    }
    lines = printing.compliance_lines(report)
    assert lines[0].split() == ["Compliance:", "Drifted", "(drift", "action", "restartWorkload)"]
    assert lines[1] == "Findings:"
    assert lines[2].split()[:4] == ["KIND", "SUBJECT", "REMEDIATION", "MESSAGE"]
    assert "ModelFileOpened" in lines[3] and "process killed" in lines[3]
    assert "ListeningSocket" in lines[4] and "(a worker: restarted)" in lines[4]
    alert = printing.compliance_lines({**report, "action": "alert", "processesChecked": False})
    assert any("reported only (alert)" in line for line in alert)
    assert any("not checked (edged has no cgroup of its own)" in line for line in alert)
    quarantine = printing.compliance_lines({**report, "action": "quarantine", "quarantined": "x"})
    assert any(line.split()[:2] == ["Quarantined:", "x"] for line in quarantine)
    assert printing.compliance_lines(None)[0].split()[1:] == ["Unknown", "(not", "checked", "yet)"]
    ok = printing.compliance_lines({**report, "compliant": True, "findings": []})
    assert ok == ["Compliance:       Compliant (drift action restartWorkload)"]
    unwatched = printing.compliance_lines(
        {**report, "opensWatched": False, "opensWatchReason": "fanotify needs CAP_SYS_ADMIN"}
    )
    assert any(
        line.split(None, 1) == ["Opens:", "not watched (fanotify needs CAP_SYS_ADMIN); found "
                                "only at each check"]
        for line in unwatched
    )  # fmt: skip
    older = printing.compliance_lines({**report, "opensWatched": None})  # did not say
    assert not any("Opens" in line for line in older)


def test_get_baselines_counts_the_fleet() -> None:
    doc = {
        "metadata": {"name": "fleet"},
        "spec": {"drift": {"action": "quarantine"}, "requireAttestation": True},
        "status": {
            "devices": {"compliant": 7, "drifted": 2, "unknown": 1, "quarantined": 1},
            "findingKinds": {"StrayProcess": 1, "ModelFileOpened": 2},
        },
    }
    heads, wide_heads, row = printing.COLUMNS["SecurityBaseline"]
    assert row(doc, 0.0, False) == ["fleet", "7", "2", "1", "quarantine", "true"]
    assert list(heads) == ["NAME", "COMPLIANT", "DRIFTED", "UNKNOWN", "DRIFT-ACTION",
                           "REQUIRE-ATTESTATION"]  # fmt: skip
    wide = row(doc, 0.0, True)
    assert wide[6:8] == ["1", "ModelFileOpened=2,StrayProcess=1"]
    assert len(wide) == len(heads) + len(wide_heads)
