"""Which of a device's labels a Secret may follow: only those no device chose (pure, no I/O).

A device's labels come from three places (:class:`hub.decide.devices.Device`):

* its **bootstrap token** (``hub token create --label``): the operator's;
* what the device **asked for at enrollment** (``edged enroll --label``, where its token lets
  devices add labels, the default): the keys in ``own_labels``;
* what the device **reports** in its Hello and status (``reported_labels``): what it discovered
  (``arch``, ``accelerator``...) and what its own ``edged.toml`` sets.

Placement reads all of them (the token's win on conflict: a device never changes a label its
token set), so a device may put itself under any deployment whose selector it can satisfy by
labelling itself. That is fine for a model, not for a secret: a deployment that mounts a
Secret goes to a device only when its placement (``regions``, ``zones``, ``nodeSelector``,
``matchExpressions``) also matches the device's **trusted** labels alone
(:meth:`hub.decide.devices.Device.trusted_labels`: its token's). A device that matches only through
labels it chose is not sent the deployment at all, since a workload without its secret does
not run, and the reason names the label and where it came from: in the device's ``notRunning``,
in the deployment's ``SecretsDelivered`` condition, in the scheduler's explanation of a
``replicas.total`` deployment (:mod:`hub.decide.schedule`), and as a warning when it is applied.
A hardware label (``accelerator=nvidia-gpu``) is one the device reports, so a Secret-mounting
deployment that selects on it reaches only devices whose token sets it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

from edgefleet.api import ModelDeployment
from hub.decide.devices import Device
from hub.decide.placement import REGION_LABEL, ZONE_LABEL, labels_mismatch

MAX_NAMED_DEVICES = 5
"""The most devices a ``SecretsDelivered`` condition or an apply warning names."""


class LabelSource(enum.Enum):
    """Who set one of a device's labels."""

    TOKEN = "set by its bootstrap token"
    ENROLLMENT = "asked for by the device at enrollment"
    REPORTED = "reported by the device itself"


def label_source(device: Device, key: str) -> LabelSource | None:
    """Who set ``device``'s label ``key`` as placement sees it (``None``: it has none)."""
    if key in device.labels:
        return LabelSource.ENROLLMENT if key in device.own_labels else LabelSource.TOKEN
    if key in device.reported_labels:
        return LabelSource.REPORTED
    return None


def placement_keys(dep: ModelDeployment) -> list[str]:
    """The label keys ``dep``'s placement reads (regions, zones, selectors), sorted."""
    placement = dep.spec.placement
    keys = set(placement.node_selector) | {r.key for r in placement.match_expressions}
    if placement.regions:
        keys.add(REGION_LABEL)
    if placement.zones:
        keys.add(ZONE_LABEL)
    return sorted(keys)


def untrusted_match(
    dep: ModelDeployment,
    device: Device,
    region: str,
    *,
    mounted: Iterable[str] | None = None,
) -> str | None:
    """``None`` unless ``dep`` mounts a Secret (``mounted``: the names a revision mounts;
    default the deployment's own) and its placement fails on ``device``'s trusted labels
    alone; then why. Call it for a device the placement matches with all its labels."""
    names = sorted(set(m.name for m in dep.spec.secrets) if mounted is None else set(mounted))
    if not names:
        return None
    trusted_mismatch = labels_mismatch(dep, device.trusted_labels(), region)
    if trusted_mismatch is None:
        return None
    labels = device.all_labels()
    chosen = [
        f"{key}={labels[key]!r} {source.value}"
        for key in placement_keys(dep)
        if (source := label_source(device, key)) not in (None, LabelSource.TOKEN)
    ]
    why = ", ".join(chosen) or trusted_mismatch
    return (
        f"secret {names[0]} is not sent to a device that matches the placement only through "
        f"labels it chose ({why}); a Secret follows only the labels of the device's bootstrap "
        "token (hub token create --label)"
    )


def secrets_withheld(
    dep: ModelDeployment, devices: Iterable[Device], region: str
) -> dict[str, str]:
    """Per device that ``dep``'s placement matches only through labels it chose: why its
    Secret is not sent there (:func:`untrusted_match`), by device name."""
    if not dep.spec.secrets:
        return {}
    out = {}
    for device in devices:
        if labels_mismatch(dep, device.all_labels(), region) is not None:
            continue
        why = untrusted_match(dep, device, region)
        if why is not None:
            out[device.name] = why
    return dict(sorted(out.items()))


def withheld_message(withheld: Mapping[str, str]) -> str:
    """One line naming the first devices of ``withheld`` and the first reason."""
    names = list(withheld)
    shown = ", ".join(names[:MAX_NAMED_DEVICES])
    more = f" and {len(names) - MAX_NAMED_DEVICES} more" if len(names) > MAX_NAMED_DEVICES else ""
    return f"not sent to {shown}{more}: {withheld[names[0]]}"
