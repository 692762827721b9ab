"""The soak harness's convergence judgement of a device that refuses what the root wants
(``soakreport.refusal``, pure): a refusal of the deployment's signed metadata as a rollback,
by design (docs/trust.md: an operator's downgrade or a re-created deployment meets it without
a publisher's rollback allowance), counts as converged only when the region names that device
and that reason (of the root's version, or of the one the region went back to); a failure,
another refusal or another device is still a problem."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from soakreport import allowances_in_force, refusal

NOW = time.time()

SAID = (
    "1.1.0 Refused: MetadataRollback: soak-b 1.1.0: signed metadata of soak-b 1.1.0: "
    "metadata version 1796651028 is lower than 1796651029, the highest this device accepted"
)

VERSION_GUARD = (
    "1.0.0 Refused: ModelVersionRollback: soak-b 1.0.0 is older than 9.0.0, the highest "
    "version this device accepted, and no signed rollback allowance covers it"
)


@pytest.mark.parametrize(
    ("failing", "device", "held"),
    [
        ({"dev-0": SAID}, "dev-0", True),  # named, by design
        ({"dev-0": SAID.replace("1.1.0", "1.0.0")}, "dev-0", True),  # the version gone back to
        ({"dev-0": SAID}, "dev-1", False),  # another device is not excused by it
        ({"dev-0": VERSION_GUARD}, "dev-0", True),  # the model version guard (run E)
        ({"dev-0": "1.0.0 Refused: RollbackAllowanceExpired: x"}, "dev-0", False),
        ({"dev-0": "1.1.0 Failed: ModelLoadFailed: onnxruntime cannot load"}, "dev-0", False),
        ({"dev-0": "1.1.0 Refused: SignatureInvalid: ..."}, "dev-0", False),
        ({"dev-0": "1.1.0 Refused: SignatureInvalid: MetadataRollback: x"}, "dev-0", False),
        ({}, "dev-0", False),  # the region names nobody
    ],
)  # fmt: skip
def test_a_device_refusing_a_downgrade_converges_to_the_region_naming_it(
    failing: dict[str, str], device: str, held: bool
) -> None:
    assert (refusal(failing, device) is not None) is held


ALLOWED = {("soak-b", "1.0.0"): 2e9}


@pytest.mark.parametrize(
    ("said", "allowed", "held"),
    [
        (VERSION_GUARD, ALLOWED, False),  # the root's targets allow it: the device should take it
        (VERSION_GUARD, {("soak-b", "1.1.0"): 2e9}, True),  # another version's allowance
        (VERSION_GUARD, {("soak-a", "1.0.0"): 2e9}, True),  # another model's
        (VERSION_GUARD, {}, True),
        (SAID, {("soak-b", "1.1.0"): 2e9}, True),  # the metadata guard: a later push signs newer
    ],
)  # fmt: skip
def test_a_model_version_refusal_an_allowance_covers_is_not_by_design(
    said: str, allowed: dict[tuple[str, str], float], held: bool
) -> None:
    assert (refusal({"dev-0": said}, "dev-0", allowed) is not None) is held


def test_the_allowances_in_force_are_read_from_the_roots_delegated_targets(
    tmp_path: Path,
) -> None:
    """What the root's publishers signed (``edgectl models push --allow-rollback`` puts the
    allowance in the model's target, ``tufmeta.artifact_targets``), read back from the files
    the root serves; an expired allowance, a target without one and an unreadable file
    count as none."""
    from tuf.api.metadata import Targets

    from edgefleet.trust import tufmeta
    from edgefleet.trust.documents import ArtifactMetadata, FileInfo

    def meta(name: str, version: str) -> ArtifactMetadata:
        digest = hashlib.sha256(f"{name}{version}".encode()).hexdigest()
        files = {f"{name}-{version}.onnx": FileInfo(digest, 10, "model")}
        return ArtifactMetadata(name, version, None, 1, NOW, NOW + 86400, files)

    targets = Targets(version=3, expires=tufmeta._expiry(NOW + 86400))
    targets.targets.update(
        tufmeta.artifact_targets(meta("soak-b", "1.0.0"), rollback_expires=NOW + 7200)
    )
    targets.targets.update(
        tufmeta.artifact_targets(meta("soak-b", "1.1.0"), rollback_expires=NOW - 1)
    )
    targets.targets.update(tufmeta.artifact_targets(meta("soak-a", "1.0.0")))
    (tmp_path / "delegated").mkdir()
    (tmp_path / "delegated" / "lab.json").write_bytes(tufmeta.sign(targets, []))
    (tmp_path / "delegated" / "torn.json").write_bytes(b'{"payload": "')
    found = allowances_in_force(tmp_path, NOW)
    assert set(found) == {("soak-b", "1.0.0")}
    assert abs(found[("soak-b", "1.0.0")] - (NOW + 7200)) < 1
    assert allowances_in_force(tmp_path, NOW + 7201) == {}
    assert allowances_in_force(tmp_path / "nothing", NOW) == {}
