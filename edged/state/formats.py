"""The formats of edged's state files, and the rule that keeps a rollback readable
(docs/agent-updates.md, "State formats").

The rule, for a release N+1 after N:

1. N+1 **reads** every format N writes (its ``reads`` hold N's ``writes``);
2. until N+1 **commits** (edged.agent: connected, state loaded, workloads serving again), it
   writes only formats N reads (``trial_writes``): a trial that fails goes back to N, and N
   reads everything written meanwhile;
3. after its commit it may write its own (``writes``). A new format therefore ships as "read
   in N+1, written after the commit of N+1", or, where a downgrade after the commit must keep
   working, "read in N+1, written in N+2"; a field an older reader ignores needs no new format.

The table below is this release's; tests/state/test_formats.py checks it against the
previous release built from git history (packaging/releases.toml), and that what this
release writes on trial is read by that release's own code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StateFormat:
    reads: frozenset[int]
    writes: int  # once this release is committed
    trial_writes: int  # while it is on trial: a format the release before reads


FORMATS: dict[str, StateFormat] = {
    # the accepted desired state (edged.state.desired)
    "state/desired.json": StateFormat(frozenset({1}), 1, 1),
    # the accepted DeviceSecurityBaselines (edged.state.baselines)
    "state/baselines.json": StateFormat(frozenset({1}), 1, 1),
    # the hub's accepted state (edged.state.hubstate): no format field (0); its readers ignore
    # fields they do not know, so a field added to it needs no new format
    "state/hub.json": StateFormat(frozenset({0}), 0, 0),
}

_on_trial = [os.environ.get("EDGED_TRIAL") == "1"]  # set by edged.launcher for a trial


def on_trial() -> bool:
    """True while this edged is a release on trial that has not committed."""
    return _on_trial[0]


def committed() -> None:
    """This release committed (edged.agent): it writes its own formats from now on."""
    _on_trial[0] = False


def set_on_trial(value: bool) -> None:
    _on_trial[0] = value


def write_format(name: str) -> int:
    """The format to write ``name`` in now (the rule's points 2 and 3)."""
    fmt = FORMATS[name]
    return fmt.trial_writes if on_trial() else fmt.writes


def readable(name: str, version: object) -> bool:
    """Whether this release reads ``name`` in format ``version``."""
    return isinstance(version, int) and version in FORMATS[name].reads
