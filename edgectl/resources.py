"""Resource types as operators write them (``devices``, ``deploy``, ``md``...) and the forms
that name objects: ``TYPE NAME...``, ``TYPE/NAME...``. Pure."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from edgectl.errors import UsageError

EVENT = "Event"
TOKEN = "BootstrapToken"
REGION = "Region"
PLACEMENT = "Placement"

_ALIASES: dict[str, tuple[str, ...]] = {
    "Device": ("devices", "device", "dev"),
    "ModelDeployment": ("deployments", "deployment", "deploy", "modeldeployments", "md"),
    "Model": ("models", "model"),
    "SecurityBaseline": ("baselines", "baseline", "securitybaselines"),
    "DeviceHealthPolicy": ("policies", "policy", "devicehealthpolicies"),
    "Secret": ("secrets", "secret"),
    "PriorityClass": ("priorityclasses", "priorityclass", "pc"),
    "AgentUpgrade": ("agentupgrades", "agentupgrade", "au"),
    "ModelConfig": ("modelconfigs", "modelconfig", "mc"),
    TOKEN: ("tokens", "token", "bootstraptokens"),
    REGION: ("regions", "region"),
    PLACEMENT: ("placements", "placement"),
    EVENT: ("events", "event", "ev"),
}
KINDS: dict[str, str] = {
    alias: kind for kind, aliases in _ALIASES.items() for alias in (kind.lower(), *aliases)
}
PLURALS: dict[str, str] = {kind: aliases[0] for kind, aliases in _ALIASES.items()}
"""The name ``get`` shows for each kind (``devices``...), for help, completion and man pages."""

ALL_KINDS = tuple(_ALIASES)
"""Every kind ``get`` shows, events included."""
APPLIED_KINDS = (
    "ModelDeployment",
    "SecurityBaseline",
    "DeviceHealthPolicy",
    "Secret",
    "PriorityClass",
    "AgentUpgrade",
    "ModelConfig",
)
"""The kinds ``apply`` writes (and ``label``/``annotate`` change)."""


def kind_of(text: str, *, allow: tuple[str, ...] = ()) -> str:
    """The canonical kind of ``text`` (any alias, any case); UsageError when unknown, or when
    ``allow`` is given and the kind is not in it."""
    kind = KINDS.get(text.lower())
    choices = allow or tuple(k for k in _ALIASES if k != EVENT)
    if kind is None or kind not in choices:
        names = ", ".join(PLURALS[k] for k in choices)
        known = [a for a, k in KINDS.items() if k in choices]
        close = difflib.get_close_matches(text.lower(), known, n=1, cutoff=0.75)
        hint = f"; did you mean {PLURALS[KINDS[close[0]]]!r}?" if close else ""
        raise UsageError(f"unknown resource type {text!r}{hint} (one of {names})")
    return kind


@dataclass(frozen=True, slots=True)
class Ref:
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind.lower()}/{self.name}"


def parse_refs(words: list[str], *, allow: tuple[str, ...] = ()) -> tuple[str, list[Ref]]:
    """``TYPE [NAME...]`` or ``TYPE/NAME...``: the kind (``""`` when only ``TYPE/NAME`` forms
    were given, which may mix kinds) and the objects named. UsageError when the forms mix."""
    if not words:
        raise UsageError("a resource type is required (e.g. devices, or TYPE/NAME)")
    if "/" in words[0]:
        refs = []
        for word in words:
            kind_text, slash, name = word.partition("/")
            if not slash or not name or not kind_text:
                raise UsageError(f"{word!r}: give every object as TYPE/NAME, or TYPE NAME...")
            refs.append(Ref(kind_of(kind_text, allow=allow), name))
        return "", refs
    kind = kind_of(words[0], allow=allow)
    for word in words[1:]:
        if "/" in word:
            raise UsageError(f"{word!r}: there is already a resource type ({words[0]!r})")
    return kind, [Ref(kind, name) for name in words[1:]]
