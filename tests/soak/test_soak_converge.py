"""The soak harness's convergence judgement of a device that refuses what the root wants
(``soakreport.refusal``, pure): a refusal of the deployment's signed metadata as a rollback,
by design (docs/trust.md: an operator's downgrade or a re-created deployment meets it without
a publisher's rollback allowance), counts as converged only when the region names that device
and that reason (of the root's version, or of the one the region went back to); a failure,
another refusal or another device is still a problem."""

from __future__ import annotations

import pytest
from soakreport import refusal

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
