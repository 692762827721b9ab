"""``edged status`` as a person reads it: the sandbox column, drift and ingress lines."""

from __future__ import annotations

from edgefleet.devicestatus import render_status

IN_FORCE = {"inForce": True, "mode": "landlock", "filesystem": True, "network": True,
            "scoped": True, "noNewPrivs": True, "seccomp": True, "problems": []}  # fmt: skip


def doc(*sandboxes: dict, compliance: dict | None = None) -> dict:
    replicas = [{"sandbox": s, "restarts": 0, "providers": []} for s in sandboxes]
    return {
        "device": {"compliance": compliance, "ingress": {"problems": ["port 8000 not served"]}},
        "workloads": [{"name": "mlp", "replicas": replicas}],
    }


def test_sandbox_column() -> None:
    assert "landlock(fs,net,scoped)+nnp+seccomp" in render_status(doc(IN_FORCE))
    no_net = {**IN_FORCE, "network": False, "problems": ["Landlock ABI 3 has no TCP rules"]}
    assert "landlock(fs,scoped)+nnp+seccomp!" in render_status(doc(no_net))
    assert render_status(doc(IN_FORCE, {"inForce": True, "mode": "off"})).count("mixed") == 1
    assert render_status(doc({"inForce": False, "mode": "landlock"})).splitlines()[-1].endswith("-")
    # each worker a uid of its own (edged is root)
    own = {**IN_FORCE, "separateUid": True}
    assert "landlock(fs,net,scoped)+nnp+seccomp+uid" in render_status(doc(own))
    assert "off+uid" in render_status(doc({"inForce": True, "mode": "off", "separateUid": True}))


def test_drift_and_ingress_lines() -> None:
    finding = {"kind": "StrayProcess", "message": "process 4242 (sleep) runs in edged's cgroup"}
    text = render_status(
        doc(IN_FORCE, compliance={"compliant": False, "action": "alert", "findings": [finding]})
    )
    assert "drift: NOT compliant (action alert)" in text
    assert "  drift: StrayProcess: process 4242 (sleep) runs in edged's cgroup" in text
    assert "  ingress: port 8000 not served" in text


def test_an_open_watch_not_in_force_is_said_on_the_drift_line() -> None:
    why = "fanotify needs CAP_SYS_ADMIN, which edged does not have"
    off = {"compliant": True, "action": "alert", "findings": [], "opensWatched": False,
           "opensWatch": {"reason": why}}  # fmt: skip
    assert f"drift: compliant (action alert); opens not watched: {why}" in render_status(
        doc(IN_FORCE, compliance=off)
    )
    on = {**off, "opensWatched": True, "opensWatch": {"reason": None}}
    assert "opens not watched" not in render_status(doc(IN_FORCE, compliance=on))
