"""Drift decisions as tables (pure: observations in, findings and remediation out)."""

from __future__ import annotations

from edged.compliance.checking import (
    DriftAction,
    Finding,
    FindingKind,
    Listener,
    Remediation,
    StoreEntry,
    check_config,
    check_listeners,
    check_openers,
    check_processes,
    check_store,
    hash_findings,
    hold_reason,
    plan_remediation,
)

A = "a" * 64
B = "b" * 64


def entry(name: str, *, regular: bool = True, mode: int = 0o100444, size: int = 10) -> StoreEntry:
    return StoreEntry(name, regular, mode, size, 1, 7)


def test_store_findings_and_what_to_hash() -> None:
    trusted = {A: (10, 1, 7)}
    findings, to_hash = check_store(
        [entry(A), entry(B), entry("evil.onnx"), entry("d" * 64, regular=False),
         entry(A.replace("a", "c"), mode=0o100644)],
        trusted,
    )  # fmt: skip
    assert [(f.kind, f.subject) for f in findings] == [
        (FindingKind.ARTIFACT_ADDED, "evil.onnx"),
        (FindingKind.ARTIFACT_ADDED, "d" * 64),
        (FindingKind.ARTIFACT_CHANGED, "c" * 64),
    ]
    assert to_hash == [B, "c" * 64]  # A is trusted with this fingerprint
    _, again = check_store([entry(A, size=11)], trusted)
    assert again == [A]  # its fingerprint changed: hash it again


def test_hash_findings() -> None:
    got = hash_findings({A: A, B: "f" * 64, "c" * 64: None})
    assert [f.subject for f in got] == [B, "c" * 64]
    assert "found nothing readable" in got[1].message


def test_config_findings() -> None:
    assert check_config("/etc/edged/edged.toml", "x", "x") == []
    assert check_config("/c", "x", "y")[0].kind is FindingKind.CONFIG_CHANGED
    assert "removed" in check_config("/c", "x", None)[0].message


def test_processes_not_descended_from_edged_are_strays() -> None:
    parent = {100: 1, 200: 100, 201: 200, 300: 1, 301: 300, 400: 399}
    names = {300: "sleep", 301: "sh", 400: "x"}
    got = check_processes([100, 200, 201, 300, 301, 400, 999], parent, 100, names)
    assert [f.subject for f in got] == ["300", "301", "400"]  # 999 vanished: not a finding
    assert "process 300 (sleep)" in got[0].message


def test_remediation_per_action() -> None:
    findings = [
        Finding(FindingKind.ARTIFACT_ADDED, "evil", ""),
        Finding(FindingKind.ARTIFACT_CHANGED, A, ""),
        Finding(FindingKind.STRAY_PROCESS, "300", ""),
        Finding(FindingKind.CONFIG_CHANGED, "/c", ""),
    ]
    assert plan_remediation(findings, DriftAction.ALERT) == Remediation()
    assert plan_remediation(findings, DriftAction.RESTART_WORKLOAD) == Remediation(
        remove_files=("evil",), requarantine_blobs=(A,), kill_pids=(300,)
    )
    assert plan_remediation(findings, DriftAction.QUARANTINE) == Remediation(quarantine=True)
    assert plan_remediation([], DriftAction.QUARANTINE) == Remediation()


def test_model_files_open_in_processes_edged_did_not_start() -> None:
    parent = {200: 100, 201: 200, 300: 1, 301: 300}  # edged is 100: 200 and 201 are its own
    found = check_openers(
        {100: [A], 200: [A], 201: [B], 300: [A, B, A], 301: ["evil.onnx"]},
        parent,
        100,
        {300: "cat"},
    )
    assert [(f.kind, f.subject) for f in found] == [(FindingKind.MODEL_FILE_OPENED, "300")]
    assert f"process 300 (cat) has model file {A[:12]}, {B[:12]} open" in found[0].message


def test_listeners_the_ingress_policy_does_not_allow() -> None:
    listeners = [
        Listener(10, "tcp", "127.0.0.1", 8080),  # allowed port
        Listener(11, "tcp", "127.0.0.1", 9999),  # loopback, another port
        Listener(12, "tcp", "0.0.0.0", 8080),  # not loopback
        Listener(13, "tcp6", "::1", 8080),
        Listener(14, "tcp6", "::", 8080),
        Listener(15, "unix", "/run/edged/infer.sock"),
        Listener(16, "unix", "/tmp/other.sock"),
        Listener(17, "unix", "@abstract"),
    ]
    found = check_listeners(
        listeners, tcp_ports=(8080,), unix_paths=("/run/edged/infer.sock",), names={11: "nc"}
    )
    assert [f.subject for f in found] == ["11", "12", "14", "16", "17"]
    assert all(f.kind is FindingKind.LISTENING_SOCKET for f in found)
    assert "process 11 (nc) listens on 127.0.0.1:9999; the baselines' tcpPorts allow 8080" in (
        found[0].message
    )
    assert "[::]:8080, not loopback" in found[2].message
    # no tcpPorts in any baseline: any loopback port, still never another address
    anyport = check_listeners(listeners[:3], tcp_ports=None, unix_paths=(), names={})
    assert [f.subject for f in anyport] == ["12"]


def test_openers_and_listeners_are_killed_under_restart_workload() -> None:
    findings = [
        Finding(FindingKind.MODEL_FILE_OPENED, "300", ""),
        Finding(FindingKind.LISTENING_SOCKET, "301", "tcp"),
        Finding(FindingKind.LISTENING_SOCKET, "301", "unix"),
        Finding(FindingKind.STRAY_PROCESS, "301", ""),
    ]
    assert plan_remediation(findings, DriftAction.RESTART_WORKLOAD) == Remediation(
        kill_pids=(300, 301)
    )
    assert plan_remediation(findings, DriftAction.ALERT) == Remediation()


def test_why_no_replica_may_start() -> None:
    no_watch = "edged lacks CAP_SYS_ADMIN"
    q = "quarantined after drift: ArtifactAdded (clear: remove q.json)"
    cases = [
        # (quarantined, open watch not in force because, required, expected)
        (None, None, False, None),
        (None, no_watch, False, None),  # not required: the periodic check is enough
        (None, None, True, None),  # required and in force
        (q, None, False, q),
        (q, no_watch, True, q),  # the quarantine says it first
        (
            None,
            no_watch,
            True,
            "the SecurityBaseline strict, plant requires the open watch "
            f"(drift.requireOpenWatch) and it is not in force: {no_watch}",
        ),
    ]
    for quarantined, why, required, expected in cases:
        got = hold_reason(
            quarantined=quarantined,
            open_watch_reason=why,
            require_open_watch=required,
            baselines=("strict", "plant"),
        )
        assert got == expected, (quarantined, why, required)
