"""Which labels a Secret follows (hub/decide/labeltrust.py), as tables: who set a label, when a
Secret-mounting placement matches on the labels no device chose, and the scheduler's view of
it for ``replicas.total`` deployments. Pure: no hub, no clock. The attack over real gRPC:
``test_hub_secret_labels.py``."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from edgefleet.api import ModelDeployment, parse_manifest
from hub.decide.devices import Device, DevicePhase
from hub.decide.labeltrust import LabelSource, label_source, secrets_withheld, untrusted_match
from hub.decide.placement import REGION_LABEL, SecurityPolicy
from hub.decide.schedule import node_of, schedule


def deployment(name: str = "pos", *, secrets: bool = True, **placement: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "m", "version": "1.0.0"},
        "placement": placement or {"nodeSelector": {"site": "retail"}},
    }
    if secrets:
        spec["secrets"] = [{"name": "till", "mountPath": "/run/secrets/till"}]
    return {"apiVersion": "edgefleet.io/v1", "kind": "ModelDeployment",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def parsed(doc: dict[str, Any]) -> ModelDeployment:
    dep = parse_manifest(doc)
    assert isinstance(dep, ModelDeployment)
    return dep


def device(
    token: dict[str, str] | None = None,
    own: dict[str, str] | None = None,
    reported: dict[str, str] | None = None,
    name: str = "d1",
) -> Device:
    """A device with labels from its token, asked for at enrollment and reported."""
    return Device(
        name,
        labels={**(own or {}), **(token or {})},
        own_labels=frozenset(own or ()),
        reported_labels=reported or {},
        phase=DevicePhase.READY,
    )


@pytest.mark.parametrize(
    ("dev", "key", "expected"),
    [
        (device(token={"site": "a"}), "site", LabelSource.TOKEN),
        (device(own={"site": "a"}), "site", LabelSource.ENROLLMENT),
        (device(reported={"site": "a"}), "site", LabelSource.REPORTED),
        (device(token={"site": "a"}, reported={"site": "b"}), "site", LabelSource.TOKEN),
        (device(reported={"arch": "arm64"}), "site", None),
    ],
)  # fmt: skip
def test_who_set_a_label(dev: Device, key: str, expected: LabelSource | None) -> None:
    assert label_source(dev, key) is expected


HUB = "eu-frankfurt"
GPU = {"accelerator": "nvidia-gpu"}
IN_RETAIL = [{"key": "site", "operator": "In", "values": ["retail"]}]


@pytest.mark.parametrize(
    ("dev", "placement", "secrets", "expected"),
    [
        # the honest path: the token sets what the selector reads
        (device(token={"site": "retail"}), {}, True, None),
        # the attack: a label from the Hello, one asked for at enrollment
        (device(token={"pool": "lab"}, reported={"site": "retail"}), {}, True,
         "site='retail' reported by the device itself"),
        (device(token={"pool": "lab"}, own={"site": "retail"}), {}, True,
         "site='retail' asked for by the device at enrollment"),
        # no Secret mounted: a model follows every label, as before
        (device(token={"pool": "lab"}, reported={"site": "retail"}), {}, False, None),
        # a discovered hardware label is the device's own report
        (device(reported=GPU), {"nodeSelector": GPU}, True,
         "accelerator='nvidia-gpu' reported by the device itself"),
        (device(token=GPU, reported=GPU), {"nodeSelector": GPU}, True, None),
        # matchExpressions, regions and zones read labels too
        (device(reported={"site": "retail"}), {"matchExpressions": IN_RETAIL}, True,
         "site='retail' reported by the device itself"),
        (device(reported={REGION_LABEL: "us-east"}), {"regions": ["us-east"]}, True,
         f"{REGION_LABEL}='us-east' reported by the device itself"),
        (device(), {"regions": [HUB]}, True, None),  # the hub's region is the hub's
        (device(reported={"site": "retail"}), {"nodeSelector": {}}, True, None),  # selects all
    ],
)  # fmt: skip
def test_a_secret_mounting_placement_matches_on_trusted_labels_alone(
    dev: Device, placement: dict[str, Any], secrets: bool, expected: str | None
) -> None:
    dep = parsed(deployment(secrets=secrets, **placement))
    got = untrusted_match(dep, dev, HUB)
    if expected is None:
        assert got is None
    else:
        assert got is not None and expected in got and got.startswith("secret till is not sent")


def test_a_device_record_keeps_which_labels_it_asked_for() -> None:
    dev = device(token={"pool": "lab"}, own={"site": "retail"})
    again = Device.from_json(orjson.loads(orjson.dumps(dev.to_json())))
    assert again.own_labels == {"site"} and again.trusted_labels() == {"pool": "lab"}
    # a record from before: every enrollment label counts as its token's (as it was)
    old = {k: v for k, v in dev.to_json().items() if k != "ownLabels"}
    assert Device.from_json(old).trusted_labels() == {"pool": "lab", "site": "retail"}
    # and one without own labels keeps its JSON as it was
    assert "ownLabels" not in device(token={"pool": "lab"}).to_json()


def test_withheld_names_only_devices_the_placement_matches() -> None:
    devices = [
        device(token={"site": "retail"}, name="honest"),
        device(token={"pool": "lab"}, reported={"site": "retail"}, name="liar"),
        device(token={"site": "depot"}, name="elsewhere"),
        device(token={"site": "depot"}, reported={"site": "retail"}, name="overridden"),
    ]
    withheld = secrets_withheld(parsed(deployment()), devices, HUB)
    assert list(withheld) == ["liar"]
    assert secrets_withheld(parsed(deployment(secrets=False)), devices, HUB) == {}


def test_the_scheduler_places_a_secret_mounting_total_deployment_on_trusted_labels_alone() -> None:
    honest = device(token={"site": "retail"}, name="honest")
    liar = device(token={"pool": "lab"}, reported={"site": "retail"}, name="liar")
    nodes = [node_of(d, SecurityPolicy(), region=HUB) for d in (honest, liar)]
    doc = deployment()
    doc["spec"]["replicas"] = {"total": 2}
    dep = parsed(doc)
    # the liar held a replica (placed before this hub kept label sources): it is taken off
    got = schedule([dep], nodes, {"pos": ("liar",)}, now=0.0)
    assert got.placements["pos"] == ("honest",)
    assert "matching only through labels the device chose" in got.explanations["pos"].message()
    assert [(e.device, e.drain) for e in got.evictions] == [("liar", True)]
    # without a Secret the same deployment goes to both
    plain = deployment(secrets=False)
    plain["spec"]["replicas"] = {"total": 2}
    assert schedule([parsed(plain)], nodes, {}, now=0.0).placements["pos"] == ("honest", "liar")
