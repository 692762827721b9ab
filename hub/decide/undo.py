"""Whether ``rollout undo`` goes where devices can follow: their anti-rollback floor.

A device refuses signed metadata older than the newest it accepted for that model name
(``MetadataRollback``), and a model version lower than the highest it accepted unless a
signed rollback allowance covers it (``ModelVersionRollback``); what it runs now, or ran
just before, is admitted without those checks (docs/edged.md, "Going back"). The hub
holds the signed metadata of every version it sends and devices report what they hold, so an
undo that devices would refuse is refused here, before anything is written, with the
commands that would permit it; with an allowance (``edgectl rollback push``, or the
publisher's TUF targets) it goes ahead.

:func:`device_refusal` and :func:`undo_refusals` decide (pure, tested as tables);
:func:`refusal_message` says it; :func:`signed_of`, :func:`held_by_device` and
:func:`has_allowance` read what the hub holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from edgefleet.errors import EdgefleetError
from edgefleet.trust import tufmeta
from edgefleet.trust.documents import RollbackAllowance, parse_artifact, parse_rollback
from edgefleet.trust.envelopes import (
    ARTIFACT_TYPE,
    ROLLBACK_TYPE,
    decode_payload,
    parse_envelope_bytes,
)
from edgefleet.trust.versions import compare_versions, version_key
from hub.decide.devices import RevisionPhase
from hub.decide.fleetview import FleetView
from hub.decide.records import ModelRecord
from hub.decide.revisions import RolloutState
from hub.decide.status import revisions_of

MAX_NAMED = 3  # devices a refusal names before "and N more"
# what a device reports of a revision it has admitted (its signed metadata was accepted)
ADMITTED = frozenset(
    {RevisionPhase.LOADING, RevisionPhase.READY, RevisionPhase.DRAINING, RevisionPhase.FAILED}
)


@dataclass(frozen=True, slots=True)
class Signed:
    """A model version as the hub holds it signed: its version and metadata version."""

    version: str
    metadata_version: int


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why one device would refuse the undo: ``reason`` as the device says it, and the
    version it accepted that sets the floor."""

    reason: str  # MetadataRollback | ModelVersionRollback
    floor: Signed


def _comparable(version: str) -> bool:
    try:
        version_key(version)
    except ValueError:
        return False
    return True


def device_refusal(target: Signed, held: Iterable[Signed], *, allowed: bool) -> Refusal | None:
    """How a device holding ``held`` (versions of the model it admitted) would refuse
    ``target``, or None when it would admit it. ``allowed``: a rollback allowance for the
    target exists. A lower bound: the device may have accepted more than it holds now."""
    held = list(held)
    if any(h.version == target.version for h in held):
        return None  # what it runs, or still holds: admitted as it was
    newest = max(held, key=lambda h: h.metadata_version, default=None)
    if newest is not None and target.metadata_version < newest.metadata_version:
        return Refusal("MetadataRollback", newest)
    if allowed or not _comparable(target.version):
        return None
    versions = [h for h in held if _comparable(h.version)]
    highest = max(versions, key=lambda h: version_key(h.version), default=None)
    if highest is not None and compare_versions(target.version, highest.version) < 0:
        return Refusal("ModelVersionRollback", highest)
    return None


def undo_refusals(
    target: Signed,
    held: Mapping[str, Iterable[Signed]],
    *,
    allowed: bool,
    previous: str | None = None,
) -> dict[str, Refusal]:
    """Per device (of ``held``: device -> what it holds), how it would refuse ``target``.
    ``previous``: the version every device ran just before its stable one
    (:attr:`hub.decide.rollout.RolloutState.previous`): going back to it is admitted as it was."""
    if previous is not None and previous == target.version:
        return {}
    out = {}
    for device, versions in sorted(held.items()):
        refusal = device_refusal(target, versions, allowed=allowed)
        if refusal is not None:
            out[device] = refusal
    return out


def refusal_message(
    deployment: str,
    to: int | None,
    model: tuple[str, str],
    sha256: str,
    target: Signed,
    refusals: Mapping[str, Refusal],
    targeted: int,
    *,
    tuf: bool,
    then: str = "run the undo again",
) -> str:
    """Why the undo (``to``: the revision it goes to) or the apply (``to`` None: a new
    revision) is refused and what would permit it (the exact edgectl commands), ending
    ``then``."""
    name, version = model
    named = sorted(refusals)
    devices = ", ".join(named[:MAX_NAMED]) + (
        f" and {len(named) - MAX_NAMED} more" if len(named) > MAX_NAMED else ""
    )
    first = refusals[named[0]]
    what = f"revision {to}" if to is not None else "the new revision"
    head = (
        f"{deployment}: {what} ({name} {version}) would be refused by {len(refusals)} "
        f"of {targeted} device(s) ({devices}): "
    )
    resign = f"edgectl models push MODEL_FILE --name {name} --version {version}"
    in_tuf = f"{resign} --allow-rollback 7d"  # signed anew, its TUF target allowing it
    envelope = (
        f"edgectl rollback allow --name {name} --version {version} --sha256 {sha256} "
        f"--key PUBLISHER_KEY --out {name}-{version}.rollback.json, then edgectl rollback push "
        f"{name}-{version}.rollback.json"
    )
    older = (
        _comparable(version)
        and _comparable(first.floor.version)
        and compare_versions(version, first.floor.version) < 0
    )
    if first.reason == "MetadataRollback":
        why = (
            f"its signed metadata (metadataVersion {target.metadata_version}) is older than "
            f"the metadata they accepted with {name} {first.floor.version} (metadataVersion "
            f"{first.floor.metadata_version}) (MetadataRollback). "
        )
        if tuf and older:
            fix = (
                f"Sign it again with a rollback allowance in the publisher's TUF targets: {in_tuf}"
            )
        elif older:
            fix = f"Sign it again and push it ({resign}); it is older than "
            fix += f"{first.floor.version}, so also allow it: {envelope}"
        else:
            fix = f"Sign it again and push it ({resign})"
    else:
        why = (
            f"{version} is older than {first.floor.version}, which they accepted, and no "
            "rollback allowance covers it (ModelVersionRollback). "
        )
        fix = f"Allow it: {envelope}"
        if tuf:  # a TUF device honours only the allowance in the publisher's targets
            fix = f"Allow it in the publisher's TUF targets: {in_tuf}"
    return head + why + fix + f"; then {then}"


# -- what the hub holds ---------------------------------------------------------------------


def signed_of(record: ModelRecord) -> Signed | None:
    """The version and metadata version of a pushed model (None: unreadable metadata)."""
    try:
        env = parse_envelope_bytes(record.envelope, what="stored metadata")
        meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="metadata"))
    except EdgefleetError:
        return None
    return Signed(record.version, meta.metadata_version)


def held_by_device(
    view: FleetView, deployment: str, model: str, devices: Iterable[str]
) -> dict[str, list[Signed]]:
    """Per targeted device that reports ``deployment``: the versions of ``model`` it reports
    admitted (loading, serving, draining, failed after admission), as the hub holds them
    signed. A device that reports nothing of it is left out (nothing known)."""
    out: dict[str, list[Signed]] = {}
    for name in devices:
        device = view.devices.get(name)
        report = device.workloads.get(deployment) if device is not None else None
        if report is None:
            continue
        held = []
        for rev in revisions_of(report):
            record = view.models.get((model, rev.model_version))
            if rev.phase not in ADMITTED or record is None:
                continue
            if rev.sha256 and rev.sha256 != record.sha256:
                continue  # other bytes under that version: not what the hub holds
            signed = signed_of(record)
            if signed is not None:
                held.append(signed)
        out[name] = held
    return out


def has_allowance(record: ModelRecord, tuf: Any, now: float) -> bool:
    """Whether a rollback allowance for ``record`` exists and has not expired: the one kept
    with the model (``edgectl rollback push``), or one in a publisher's TUF targets on its
    model target (``tuf``: the hub's repository, or None). With TUF only the latter counts:
    a TUF device refuses a separate allowance envelope (``RollbackAllowanceNotInTargets``)."""
    allowances: list[RollbackAllowance] = []
    if record.rollback_allowance and tuf is None:
        try:
            env = parse_envelope_bytes(record.rollback_allowance, what="rollback allowance")
            doc = decode_payload(env, expected_type=ROLLBACK_TYPE, what="rollback allowance")
            allowances.append(parse_rollback(doc, what="rollback allowance"))
        except EdgefleetError:  # unreadable: it allows nothing (a device refuses it too)
            pass
    if tuf is not None:
        grant = _tuf_grant(record, tuf)
        if grant is not None:
            allowances.append(grant)
    return any(
        (a.name, a.version, a.sha256) == (record.name, record.version, record.sha256)
        and now < a.expires
        for a in allowances
    )


def _tuf_grant(record: ModelRecord, tuf: Any) -> RollbackAllowance | None:
    from tuf.api.metadata import Targets

    try:
        env = parse_envelope_bytes(record.envelope, what="stored metadata")
        meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="metadata"))
        fname, _ = meta.model_file()
        path = tufmeta.target_path(record.name, record.version, fname)
        delegations = tuf.targets.delegations
        roles = delegations.roles.values() if delegations and delegations.roles else ()
        for role in roles:
            if not role.is_delegated_path(path):
                continue  # a role's grant counts only for the names delegated to it
            data = tuf.read(tufmeta.role_file(role.name))
            if not data:
                continue
            signed, _ = tufmeta.parse(data, Targets, what=role.name)
            grant = tufmeta.rollback_grant(signed.targets.get(path), what=path)
            if grant is not None:
                return grant
    except EdgefleetError:
        return None
    return None


def undo_refused(
    view: FleetView, tuf: Any, name: str, state: RolloutState, to: int, now: float
) -> str | None:
    """Why ``rollout undo`` of ``name`` to revision ``to`` would be refused by devices (None:
    nothing says so): what the devices placed for it hold, against revision ``to``'s signed
    model."""
    target = view.revisions.get(name, {}).get(to)
    if target is None:
        return None
    return _refused(view, tuf, name, state, target.model, to, now, "run the undo again")


def _refused(
    view: FleetView,
    tuf: Any,
    name: str,
    state: RolloutState,
    target_model: tuple[str, str],
    to: int | None,
    now: float,
    then: str,
) -> str | None:
    revisions = view.revisions.get(name, {})
    record = view.models.get(target_model)
    signed = signed_of(record) if record is not None else None
    if record is None or signed is None:
        return None  # not pushed (or unreadable): the apply's own guard rails say so
    model, version = target_model
    before = revisions.get(state.previous)
    previous = before.model[1] if before is not None and before.model[0] == model else None
    devices = view.placed_on(name)
    refusals = undo_refusals(
        signed,
        held_by_device(view, name, model, devices),
        allowed=has_allowance(record, tuf, now),
        previous=previous,
    )
    if not refusals:
        return None
    return refusal_message(
        name, to, (model, version), record.sha256, signed, refusals, len(devices),
        tuf=tuf is not None, then=then,
    )  # fmt: skip
