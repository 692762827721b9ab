"""An AgentUpgrade in waves by region through the federation (issue 32, docs/agent-updates.md
"Waves by region"), all real processes: a root ``hub serve`` and two regional hubs (eu, us)
enrolled with it (``hub init --parent``), devices speaking Sync over mTLS to their region and
reporting ``Status.agent`` as edged under its launcher would (tests/e2e/agentdevice.py), the
releases held in each region's store as a push there writes them.

* two waves in order: eu's devices are sent the release, us's only once eu reports the
  upgrade Complete and an operator's ``rollout pause`` (while eu updates) is resumed;
  then the root's upgrade is Complete, and ``edgectl rollout status`` at the root shows the
  waves;
* a failure in wave 2's region (us) stops the waves and the root tells eu, done, to roll back:
  eu's devices, which had committed the version, are sent back to the one they came from;
  the root's status names the region and its failed device with the reason; ``rollout
  history`` shows each revision's outcome and ``rollout undo`` rolls revision 1's version out
  again in waves, as revision 3;
* a failure in wave 1's region (eu) stops the waves before us is sent anything;
* a release pushed at the root only reaches each region by the region's own fetch
  (FetchFederatedAgentRelease, checked there as a push is): the waves complete with no push at
  any region; a release the root holds but that fails the region's checks (metadata signed by
  a model publisher's key) is refused by each region, stored nowhere there, and the root's
  ReleaseMissing says why;
* a version neither the root nor any region holds holds its wave (ReleaseMissing), nothing
  sent;
* bad input refused: percent waves, waves at a regional hub, a root operator's hand on the
  annotations the root sets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from agentdevice import ABI, ARCH, AgentDevice, agent_device
from agentreleasetesting import (
    admin_stub,
    handmade_release,
    metadata_doc,
    minimal_entries,
    push_raw,
    role_targets,
    signed_metadata,
)
from fleet import HubProcess
from harness import wait_for
from test_agent_upgrades import NEW, NEWER, OLD, desired_version, hold_releases

from edgefleet.trust import agentreleases
from edgefleet.trust.agentreleases import Platform

_MAJOR, _MINOR, _PATCH = (int(x) for x in OLD.split(".")[:3])
NEWEST = f"{_MAJOR}.{_MINOR}.{_PATCH + 3}"


def upgrade_yaml(version: str, waves: str = "[{regions: [eu]}, {regions: [us]}]") -> str:
    return (
        "apiVersion: edgefleet.io/v1\nkind: AgentUpgrade\nmetadata: {name: edged-next}\n"
        f'spec:\n  version: "{version}"\n  selector: {{matchLabels: {{site: retail}}}}\n'
        f"  rollout: {{progressDeadlineSeconds: 900, waves: {waves}}}\n"
    )


def apply(hub: HubProcess, tmp_path: Path, text: str) -> Any:
    doc = tmp_path / "upgrade.yaml"
    doc.write_text(text)
    return hub.edgectl("apply", "-f", str(doc), check=False)


def status(hub: HubProcess) -> dict[str, Any]:
    out = hub.edgectl("get", "agentupgrade", "edged-next", "-o", "json", check=False)
    if out.returncode != 0:
        return {}
    return dict(json.loads(out.stdout).get("status", {}))


def explain(hubs: dict[str, HubProcess], devices: dict[str, AgentDevice]) -> str:
    """What a long wait's failure prints: each hub's status of the upgrade (the root's waves,
    each region's own rollout) and what each device is sent and reports."""
    lines = []
    for name, hub in hubs.items():
        try:
            lines.append(f"{name}: {json.dumps(status(hub), sort_keys=True)}")
        except (OSError, ValueError, subprocess.SubprocessError) as exc:  # never hides the wait
            lines.append(f"{name}: status unreadable ({exc!r})")
    for name, d in devices.items():
        sent = d.desired.agent if d.desired is not None and d.desired.HasField("agent") else None
        lines.append(
            f"{name}: desired {sent.version if sent else '-'} (upgrade revision "
            f"{sent.upgrade_revision if sent else '-'}), version {d.version}, committed "
            f"{d.committed}, {d.phase} {d.reason} (revision {d.upgrade_revision}), {d.behaviour}"
        )
    return "\n" + "\n".join(lines)


Federation = tuple[dict[str, HubProcess], dict[str, AgentDevice]]


def until(federation: Federation, cond: Any, within: float, what: str) -> Any:
    """``wait_for`` whose timeout says where every hub and device stands (:func:`explain`)."""
    return wait_for(cond, within, what, detail=lambda: explain(*federation))


def wait_phase(
    federation: Federation, phase: str, within: float, what: str, revision: int | None = None
) -> dict[str, Any]:
    """The root's status once its upgrade is in ``phase`` (at ``revision``, when given)."""
    root = federation[0]["root"]

    def reached() -> dict[str, Any] | None:
        s = status(root)
        if s.get("phase") == phase and (revision is None or s.get("revision") == revision):
            return s
        return None

    found: dict[str, Any] = until(federation, reached, within, what)
    return found


def history_rows(hub: HubProcess) -> dict[str, str]:
    """``rollout history``'s rows by revision number."""
    history = hub.edgectl("rollout", "history", "agentupgrade/edged-next").stdout
    return {line.split()[0]: line for line in history.splitlines()[1:]}


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[tuple[dict[str, HubProcess], dict[str, AgentDevice]]]:
    root = HubProcess(tmp_path / "root", tmp_path / "root.log").init("--region", "root")
    hubs = {"root": root.start()}
    devices: dict[str, AgentDevice] = {}
    try:
        for name in ("eu", "us"):
            token, pin = root.token("--for-region", name)
            hub = HubProcess(tmp_path / name, tmp_path / f"{name}.log")
            hub.init("--region", name, "--parent", root.address, "--token", token,
                     "--parent-ca-hash", pin)  # fmt: skip
            hold_releases(hub, OLD, NEW, NEWER, NEWEST)  # pushed at the region
            hubs[name] = hub.start()
        for region in ("eu", "us"):
            for i in range(2):
                name = f"{region}{i}"
                devices[name] = agent_device(
                    hubs[region], tmp_path, name, {"site": "retail"}, version=OLD
                )
        for d in devices.values():
            d.connect()
        # the root sees both regions' reports before anything is applied
        wait_for(
            lambda: all(
                (json.loads(root.edgectl("get", "region", r, "-o", "json").stdout)["status"]
                 .get("agentReleases")) for r in ("eu", "us")
            ),
            60,
            "both regions report their releases",
        )  # fmt: skip
        yield hubs, devices
    finally:
        for d in devices.values():
            d.disconnect()
        for hub in hubs.values():
            hub.stop()


@pytest.mark.scenario
def test_two_waves_in_order_then_a_failure_in_wave_2_reverts_wave_1(
    federation: Federation, tmp_path: Path
) -> None:
    hubs, devices = federation
    root = hubs["root"]
    eu = [devices["eu0"], devices["eu1"]]
    us = [devices["us0"], devices["us1"]]

    for d in eu:
        d.behaviour = "hold"
    out = apply(root, tmp_path, upgrade_yaml(NEW))
    assert out.returncode == 0, out.stdout + out.stderr
    until(
        federation,
        lambda: desired_version(devices["eu0"]) == NEW,
        60,
        "eu's canary sent the release",
    )
    time.sleep(2)  # eu holds: us is sent nothing meanwhile
    assert [desired_version(d) for d in us] == ["", ""]
    shown = status(root)
    assert shown["phase"] == "Progressing" and shown["wave"] == 1, shown
    assert root.edgectl("get", "agentupgrades").returncode == 0
    # an operator's pause at the root: eu goes on, us is not sent the release until resume
    out = root.edgectl("rollout", "pause", "agentupgrade/edged-next", check=False)
    assert out.returncode == 0 and "paused by an operator at wave 1" in out.stdout, out
    again = root.edgectl("rollout", "pause", "agentupgrade/edged-next", check=False)
    assert again.returncode != 0 and "is Paused: nothing to pause" in again.stderr, again
    for d in eu:
        d.behaviour = "good"
    until(federation, lambda: all(d.committed == NEW for d in eu), 90, "eu commits while paused")
    time.sleep(3)  # several of the root's passes: eu is done, us is still sent nothing
    assert [desired_version(d) for d in us] == ["", ""]
    assert status(root)["phase"] == "Paused"
    out = root.edgectl("rollout", "resume", "agentupgrade/edged-next", check=False)
    assert out.returncode == 0 and "resumed by an operator" in out.stdout, out
    until(
        federation,
        lambda: desired_version(devices["us0"]) == NEW,
        90,
        "wave 2 sends us the release",
    )
    assert all(d.committed == NEW for d in eu)
    done = wait_phase(federation, "Complete", 90, "Complete")
    assert all(d.committed == NEW for d in us), done
    assert done["released"] == ["eu", "us"], done
    text = root.edgectl("rollout", "status", "agentupgrade/edged-next").stdout
    assert "wave 1 of 2 (eu)" in text and "us: Complete, 2/2 done" in text, text
    # get agentupgrades shows the regions' devices summed and where the waves stand, not 0/0
    assert (done["doneDevices"], done["poolDevices"], done["reportingRegions"]) == (4, 4, 2)
    row = root.edgectl("get", "agentupgrades").stdout.splitlines()[1].split()
    assert row[3] == "4/4" and "wave rest" in " ".join(row), row

    # revision 2: eu passes, us's device crashes -> the root stops and eu rolls back
    for d in us:
        d.behaviour = "crash"
    out = apply(root, tmp_path, upgrade_yaml(NEWER))
    assert out.returncode == 0, out.stdout + out.stderr
    until(federation, lambda: all(d.committed == NEWER for d in eu), 90, "eu commits NEWER")
    began = time.monotonic()
    stopped = wait_phase(federation, "RolledBack", 90, "the root stops")
    assert stopped["failedRegion"] == "us" and stopped["reason"] == "RegionFailed", stopped
    assert any("CrashLoop" in why for why in stopped["failedDevices"].values()), stopped
    until(federation, lambda: all(d.committed == NEW for d in eu), 90, "eu sent back to NEW")
    print(f"eu back on {NEW} {time.monotonic() - began:.1f} s after the root stopped")
    assert all(d.committed == NEW for d in us)
    eu_status = status(hubs["eu"])
    assert eu_status["reason"] == "StoppedByRoot", eu_status
    result = root.edgectl("rollout", "status", "agentupgrade/edged-next", check=False)
    assert result.returncode != 0 and "stopped by region us" in result.stdout, result
    rows = history_rows(root)
    assert NEW in rows["1"] and "complete" in rows["1"], rows
    assert NEWER in rows["2"] and "rolledback" in rows["2"], rows

    # undo: revision 1's version again, as revision 3 in waves (us's devices now good)
    for d in us:
        d.behaviour = "good"
    out = root.edgectl("rollout", "undo", "agentupgrade/edged-next", check=False)
    assert out.returncode == 0 and f"rolling back to revision 1 ({NEW})" in out.stdout, out
    again = wait_phase(federation, "Complete", 120, "revision 3 Complete", revision=3)
    assert again["version"] == NEW, again
    assert all(d.committed == NEW for d in [*eu, *us])
    rows = history_rows(root)
    assert "rolled back: RegionFailed" in rows["2"] and "copy of 1" in rows["3"], rows


@pytest.mark.scenario
def test_a_failure_in_wave_1_stops_wave_2(federation: Federation, tmp_path: Path) -> None:
    hubs, devices = federation
    root = hubs["root"]
    devices["eu0"].behaviour = "crash"
    began = time.monotonic()
    out = apply(root, tmp_path, upgrade_yaml(NEW))
    assert out.returncode == 0, out.stdout + out.stderr
    stopped = wait_phase(federation, "RolledBack", 90, "the root stops")
    print(f"stopped {time.monotonic() - began:.1f} s after the apply")
    assert stopped["failedRegion"] == "eu" and "eu0" in stopped["failedDevices"], stopped
    time.sleep(2)
    assert [desired_version(devices[n]) for n in ("us0", "us1")] == ["", ""]
    assert all(d.committed == OLD for d in devices.values())


@pytest.mark.scenario
def test_bad_input_is_refused_and_changes_nothing(federation: Federation, tmp_path: Path) -> None:
    hubs, _ = federation
    root, eu = hubs["root"], hubs["eu"]
    cases = [
        (root, upgrade_yaml(NEW, "[{percent: 10%}]"), "a percent wave is not supported"),
        (root, upgrade_yaml(NEW, "[{regions: [mars]}]"), "'mars' is not an enrolled region"),
        (eu, upgrade_yaml(NEW, "[{regions: [eu]}]"), "this is a regional hub"),
        (
            root,
            upgrade_yaml(NEW).replace(
                "metadata: {name: edged-next}",
                "metadata: {name: edged-next, annotations: "
                '{"federation.edgefleet.io/agent-stop": "x"}}',
            ),
            "is set by a root hub",
        ),
    ]
    for hub, text, words in cases:
        out = apply(hub, tmp_path, text)
        assert out.returncode != 0 and words in out.stderr, (words, out.stderr)
        got = hub.edgectl("get", "agentupgrades", "-o", "json", check=False).stdout
        assert "edged-next" not in got


@pytest.mark.scenario
def test_a_region_without_the_release_holds_its_wave(
    federation: Federation, tmp_path: Path
) -> None:
    hubs, devices = federation
    root = hubs["root"]
    unheld = f"{_MAJOR}.{_MINOR}.{_PATCH + 4}"  # pushed nowhere: the root holds none either
    out = apply(root, tmp_path, upgrade_yaml(unheld))
    assert out.returncode == 0, out.stdout + out.stderr
    held = until(
        federation,
        lambda: (s := status(root)).get("reason") == "ReleaseMissing" and s,
        60,
        "the wave waits",
    )
    assert f"region eu's hub holds no release of edged {unheld}" in held["message"], held
    assert "push the release at the root hub" in held["message"], held
    assert held["phase"] == "Progressing" and held["released"] == [], held
    assert all(desired_version(d) == "" for d in devices.values())
    # the verbs not built for waves are refused, not ignored
    for verb, words in (
        ("undo", "has no revision before 1 to go back to"),
        ("resume", "is Progressing: nothing to resume"),
    ):
        out = root.edgectl("rollout", verb, "agentupgrade/edged-next", check=False)
        assert out.returncode != 0 and words in out.stderr, (verb, out.stderr)


def push_at_root(root: HubProcess, tmp_path: Path, version: str) -> tuple[bytes, Any]:
    """A small well-formed release of ``version`` for the devices' platform, pushed at the root
    only, as ``edgectl agent push`` pushes (metadata and the agent role's targets signed by the
    root's agent publisher key). Its metadata document and the push's response."""
    plat = Platform(ARCH, ABI)
    path = handmade_release(tmp_path / f"edged-{version}.tar.gz", minimal_entries(version, plat))
    doc = metadata_doc(path, version, plat=plat)
    meta = agentreleases.parse_release_metadata(doc)
    key = root.data / "agent-publisher.key"
    with admin_stub(root) as stub:
        response = push_raw(
            stub,
            signed_metadata(doc, key),
            path.read_bytes(),
            role="agent",
            targets=role_targets(root, "agent", meta, key),
        )
    assert response.stored, response
    return orjson.dumps(doc), response


def region_versions(hub: HubProcess) -> set[str]:
    doc = json.loads(hub.edgectl("agent", "list", "-o", "json").stdout)
    return {r["version"] for r in doc["releases"]}


@pytest.mark.scenario
def test_a_release_pushed_at_the_root_only_reaches_the_regions_and_the_waves_complete(
    federation: Federation, tmp_path: Path
) -> None:
    hubs, devices = federation
    root = hubs["root"]
    version = f"{_MAJOR}.{_MINOR}.{_PATCH + 5}"
    _, pushed = push_at_root(root, tmp_path, version)
    assert all(version not in region_versions(hubs[r]) for r in ("eu", "us"))
    began = time.monotonic()
    out = apply(root, tmp_path, upgrade_yaml(version))
    assert out.returncode == 0, out.stdout + out.stderr
    done = wait_phase(federation, "Complete", 120, "Complete")
    print(f"waves complete {time.monotonic() - began:.1f} s after the apply (releases fetched)")
    assert done["released"] == ["eu", "us"], done
    assert all(d.committed == version for d in devices.values())
    for r in ("eu", "us"):
        listed = json.loads(hubs[r].edgectl("agent", "list", "-o", "json").stdout)["releases"]
        (got,) = [x for x in listed if x["version"] == version]
        assert (got["sha256"], got["length"]) == (pushed.sha256, pushed.length), got
        assert got["signers"], got  # the agent publisher's key, as at the root
        events = json.loads(hubs[r].edgectl("get", "events", "-o", "json").stdout)
        items = events["items"] if isinstance(events, dict) else events
        reasons = [e["reason"] for e in items if e.get("object", {}).get("kind") == "AgentRelease"]
        assert "Fetched" in reasons, reasons
        # the bytes the region serves its devices are the root's
        blob = hubs[r].data / "blobs" / "sha256" / pushed.sha256
        assert agentreleases.file_digest(blob) == (pushed.sha256, pushed.length)


@pytest.mark.scenario
def test_a_second_version_pushed_at_the_root_only_reaches_regions_done_with_the_first(
    federation: Federation, tmp_path: Path
) -> None:
    # each region, done with the first version, is sent it (not the second) until its wave:
    # its slice must still name the second, or it never fetches it and the wave waits for it
    # (ReleaseMissing) until its deadline (found by bench/agentwaves.py)
    hubs, devices = federation
    root = hubs["root"]
    first, second = (f"{_MAJOR}.{_MINOR}.{_PATCH + p}" for p in (7, 8))
    for version in (first, second):
        push_at_root(root, tmp_path, version)
    out = apply(root, tmp_path, upgrade_yaml(first))
    assert out.returncode == 0, out.stdout + out.stderr
    wait_phase(federation, "Complete", 120, f"{first} Complete", revision=1)
    assert all(second not in region_versions(hubs[r]) for r in ("eu", "us"))
    out = apply(root, tmp_path, upgrade_yaml(second))
    assert out.returncode == 0, out.stdout + out.stderr
    done = wait_phase(federation, "Complete", 120, f"{second} Complete", revision=2)
    assert done["released"] == ["eu", "us"], done
    assert all(d.committed == second for d in devices.values())
    assert all({first, second} <= region_versions(hubs[r]) for r in ("eu", "us"))


@pytest.mark.scenario
def test_a_release_the_regions_checks_refuse_is_stored_nowhere_and_the_root_says_why(
    federation: Federation, tmp_path: Path
) -> None:
    hubs, devices = federation
    root = hubs["root"]
    version = f"{_MAJOR}.{_MINOR}.{_PATCH + 6}"
    doc, pushed = push_at_root(root, tmp_path, version)
    # the root's record tampered with in its store (the hub stopped): the same bytes, listed
    # by the agent role's targets, but metadata signed by the model publisher's key
    root.stop()
    forged = signed_metadata(orjson.loads(doc), root.data / "publisher.key")
    asyncio.run(_replace_envelope(root, version, forged))
    root.start()
    out = apply(root, tmp_path, upgrade_yaml(version))
    assert out.returncode == 0, out.stdout + out.stderr
    held = until(
        federation,
        lambda: (
            (s := status(root)).get("reason") == "ReleaseMissing"
            and "refused the root's release" in s.get("message", "")
            and s
        ),
        90,
        "the root says the region refused the release",
    )
    assert f"region eu's hub holds no release of edged {version}" in held["message"], held
    assert "SignerNotDelegated" in held["message"], held
    assert held["released"] == [], held
    shown = json.loads(root.edgectl("get", "region", "eu", "-o", "json").stdout)["status"]
    assert "SignerNotDelegated" in shown["agentReleaseRefusals"][version], shown
    for r in ("eu", "us"):
        assert version not in region_versions(hubs[r])
        assert not (hubs[r].data / "blobs" / "sha256" / pushed.sha256).exists()
    assert all(desired_version(d) == "" for d in devices.values())


async def _replace_envelope(hub: HubProcess, version: str, envelope: bytes) -> None:
    from hub.decide.agentreleases import AgentReleaseRecord, agent_release_key
    from hub.state import storekeys
    from hub.state.store import Put, open_hub_store

    store = await open_hub_store(None, data_dir=hub.data)
    try:
        key = agent_release_key(version, ARCH, ABI)
        kv = await store.get(key)
        assert kv is not None
        record = AgentReleaseRecord.from_json(storekeys.loads(kv.value))
        forged = dataclasses.replace(record, envelope=envelope)
        await store.txn([], [Put(key, storekeys.dumps(forged.to_json()))])
    finally:
        await store.close()
