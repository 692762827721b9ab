"""Version skew between a hub and edged (issue 32, docs/agent-updates.md "Version skew"): pure.

A hub accepts devices whose edged runs its own minor version or one of the previous
:data:`MINOR_VERSIONS_BEHIND` minor versions of the same major version (hub 0.4.x: edged 0.2.x,
0.3.x, 0.4.x), as the Kubernetes API server does its kubelets. An edged newer than its hub is
outside the window: it may send what the hub does not know. The hub refuses a Sync from a
device outside the window (``AgentVersionOutsideWindow``) and an AgentUpgrade whose version
would leave it.

A program run from a source tree that was never installed reports
:data:`edgefleet.versioning.UNKNOWN_VERSION`; it is inside the window only of a hub that
reports the same (both run from one checkout, as in development).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgefleet.trust.versions import version_key
from edgefleet.versioning import UNKNOWN_VERSION

MINOR_VERSIONS_BEHIND = 2


@dataclass(frozen=True, slots=True)
class SkewVerdict:
    allowed: bool
    reason: str = ""  # AgentVersionOutsideWindow, AgentVersionNotComparable
    message: str = ""


def _major_minor(version: str) -> tuple[int, int]:
    numbers = version_key(version)[0]  # ValueError when not comparable
    return numbers[0] if numbers else 0, numbers[1] if len(numbers) > 1 else 0


def window_text(hub_version: str) -> str:
    """The window a hub of ``hub_version`` accepts, for messages: ``0.2.x to 0.4.x``."""
    try:
        major, minor = _major_minor(hub_version)
    except ValueError:
        return hub_version
    return f"{major}.{max(0, minor - MINOR_VERSIONS_BEHIND)}.x to {major}.{minor}.x"


def check_skew(device_version: str, hub_version: str) -> SkewVerdict:
    """Whether a hub of ``hub_version`` accepts an edged of ``device_version``."""
    if UNKNOWN_VERSION in (device_version, hub_version):
        if device_version == hub_version:
            return SkewVerdict(True)
        return SkewVerdict(
            False,
            "AgentVersionNotComparable",
            f"edged {device_version!r} and hub {hub_version!r}: a build with no version is "
            "accepted only by a hub built from the same source tree",
        )
    try:
        device = _major_minor(device_version)
        hub = _major_minor(hub_version)
    except ValueError:
        return SkewVerdict(
            False,
            "AgentVersionNotComparable",
            f"edged version {device_version!r} is not a version the hub can compare",
        )
    if device[0] == hub[0] and hub[1] - MINOR_VERSIONS_BEHIND <= device[1] <= hub[1]:
        return SkewVerdict(True)
    return SkewVerdict(
        False,
        "AgentVersionOutsideWindow",
        f"edged {device_version} is outside what hub {hub_version} accepts "
        f"({window_text(hub_version)})",
    )
