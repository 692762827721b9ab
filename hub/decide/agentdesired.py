"""What an AgentUpgrade sends a device, pure (issue 32, docs/agent-updates.md "The AgentUpgrade
kind"): whether a selected device can be sent the version (:func:`refusal`,
:func:`up_to_date`, :func:`reports_later`), the release of its platform (:func:`release_for`),
whether a hub accepts an upgrade's version at all (:func:`version_refusal`), and the release
each device is sent from the rollout record (:func:`desired_agent`, :func:`desired_agent_of`:
``DesiredState.agent``). The planner that writes the record: :mod:`hub.decide.agentupgrade`."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from edgefleet.agentskew import check_skew
from edgefleet.trust.versions import version_key
from hub.decide.agentreleases import AgentReleaseRecord, agent_release_key
from hub.decide.agentrevisions import (
    AgentDeviceView,
    AgentUpgradeState,
    DesiredAgentSpec,
    Releases,
)
from hub.decide.devices import AgentReport
from hub.decide.revisions import RolloutPhase

FIRST_SELF_UPDATING = "0.2.0"
"""The first edged release that reports its release (Status.agent) and can update itself."""


def reports_later(d: AgentDeviceView) -> bool:
    """Whether ``d``, connected and without a report yet, runs an edged that sends one (its
    first report has not reached the hub: just connected, or the hub just started): such a
    device is not refused as too old, the rollout waits for it."""
    if d.report is not None or not d.connected or not d.agent_version:
        return False
    try:
        return version_key(d.agent_version) >= version_key(FIRST_SELF_UPDATING)
    except ValueError:
        return False


def platform_of(report: AgentReport | None) -> tuple[str, str]:
    return (report.arch, report.python_abi) if report is not None else ("", "")


def release_for(
    releases: Releases, version: str, report: AgentReport | None
) -> AgentReleaseRecord | None:
    arch, abi = platform_of(report)
    if not arch or not abi:
        return None
    return releases.get(agent_release_key(version, arch, abi))


def refusal(d: AgentDeviceView, version: str, releases: Releases, hub_version: str) -> str:
    """Why ``d`` cannot be sent ``version`` ("" when it can)."""
    if d.claimed_by:
        return f"ClaimedByAnotherUpgrade: AgentUpgrade {d.claimed_by} drives this device"
    a = d.report
    if a is None:
        return "AgentStatusNotReported: its edged does not report its release (too old to update)"
    if not a.launcher:
        return (
            "NoLauncher: edged runs from its package, not under the A/B launcher: it cannot "
            "update itself"
        )
    running = a.version or a.committed_version
    verdict = _skew(running, hub_version)
    if not verdict.allowed:
        return f"{verdict.reason}: {verdict.message}"
    if not a.arch or not a.python_abi:
        return "PlatformNotReported: the device does not say its machine and Python ABI"
    if release_for(releases, version, a) is None:
        return (
            f"NoReleaseForPlatform: no release {version} for {a.arch}/{a.python_abi} "
            "(edgectl agent push)"
        )
    return ""


_skew = functools.lru_cache(maxsize=256)(check_skew)
"""check_skew, once per (device version, hub version): a fleet runs a few versions; bounded."""


def up_to_date(d: AgentDeviceView, version: str) -> bool:
    a = d.report
    return a is not None and a.version == version and a.committed_version == version


def version_refusal(version: str, hub_version: str) -> str | None:
    """Why an AgentUpgrade to ``version`` is refused by a hub of ``hub_version`` (None: it
    is not): a version outside the window the hub accepts would cut the devices off."""
    verdict = check_skew(version, hub_version)
    if verdict.allowed:
        return None
    return (
        f"spec.version: {version} is outside the versions this hub accepts "
        f"({verdict.reason}: {verdict.message}): the upgraded devices could no longer sync; "
        "upgrade the hub first"
    )


def desired_agent(
    state: AgentUpgradeState, device: str, report: AgentReport | None, releases: Releases
) -> DesiredAgentSpec | None:
    """The release ``device`` is sent for this upgrade (None: none; it keeps its committed
    one): the revision's version once sent it (not after it failed), its previous release
    after a rollback when it had committed the rejected one, or when it left the selector
    before committing (``leaving``), or when it failed without ending the attempt (``held``:
    after a rollback, or while the rollout goes on)."""
    revision = state.current
    held = device in state.held  # failed while the rollout goes on (agentupgrade.failed_holds)
    if state.phase is RolloutPhase.ROLLED_BACK or device in state.leaving or held:
        version = state.leaving.get(device) or state.rollback.get(device) or state.held.get(device)
        if version is None:
            return None
        back = release_for(releases, version, report)
        # the release it came from is still on the device: by version when the hub does not
        # hold it (the base install's edged), the device switches and never fetches
        return DesiredAgentSpec(
            version,
            back.envelope if back is not None else b"",
            state.upgrade,
            revision.number,
            revision.deadline_s,
            revision.max_tries,
        )
    sent = state.sent.get(device)
    if sent is None or sent.revision != state.revision or device in state.failed:
        return None
    version = revision.version
    record = release_for(releases, version, report)
    if record is None:
        return None
    return DesiredAgentSpec(
        version,
        record.envelope,
        state.upgrade,
        revision.number,
        revision.deadline_s,
        revision.max_tries,
    )


def desired_agent_of(
    states: Mapping[str, AgentUpgradeState],
    device: str,
    report: AgentReport | None,
    releases: Releases,
) -> DesiredAgentSpec | None:
    """The release ``device`` is sent by the upgrades (the first by name that sends one)."""
    for name in sorted(states):
        spec = desired_agent(states[name], device, report, releases)
        if spec is not None:
            return spec
    return None
