"""``rollout undo`` against the devices' anti-rollback floor, as tables (issue 29, item 6):
what devices hold, the target's signed metadata and version, an allowance."""

from __future__ import annotations

import pytest

from hub.decide.undo import Refusal, Signed, device_refusal, refusal_message, undo_refusals

V100, V110, V120 = Signed("1.0.0", 100), Signed("1.1.0", 110), Signed("1.2.0", 120)
V100_RESIGNED = Signed("1.0.0", 130)  # the same bytes, signed again after 1.2.0


@pytest.mark.parametrize(
    ("target", "held", "allowed", "expected"),
    [
        (V100, [V120], False, Refusal("MetadataRollback", V120)),
        (V100, [V120], True, Refusal("MetadataRollback", V120)),  # no allowance lifts this
        (V100_RESIGNED, [V120], False, Refusal("ModelVersionRollback", V120)),
        (V100_RESIGNED, [V120], True, None),  # allowed
        (V120, [V110], False, None),  # newer: nothing to allow
        (V110, [V110, V120], False, None),  # what it holds (draining): admitted as it was
        (V100, [], False, None),  # nothing known of the device
        (Signed("1.0.0", 200), [V120, Signed("1.1.5", 150)], False,
         Refusal("ModelVersionRollback", V120)),  # the highest version sets the floor
    ],
)  # fmt: skip
def test_what_one_device_would_refuse(
    target: Signed, held: list[Signed], allowed: bool, expected: Refusal | None
) -> None:
    assert device_refusal(target, held, allowed=allowed) == expected


def test_going_back_to_what_devices_ran_just_before_is_never_refused() -> None:
    held = {"dev-0": [V120], "dev-1": [V120]}
    assert undo_refusals(V110, held, allowed=False, previous="1.1.0") == {}
    refused = undo_refusals(V100, held, allowed=False, previous="1.1.0")
    assert set(refused) == {"dev-0", "dev-1"}


def test_the_refusal_names_the_command_that_permits_it() -> None:
    refused = {"dev-0": Refusal("ModelVersionRollback", V120)}
    msg = refusal_message("det", 1, ("det", "1.0.0"), "ab" * 32, V100_RESIGNED, refused, 2,
                          tuf=False)  # fmt: skip
    assert "revision 1 (det 1.0.0) would be refused by 1 of 2 device(s) (dev-0)" in msg
    assert "ModelVersionRollback" in msg
    assert f"edgectl rollback allow --name det --version 1.0.0 --sha256 {'ab' * 32}" in msg
    assert "edgectl rollback push det-1.0.0.rollback.json" in msg

    refused = {"dev-0": Refusal("MetadataRollback", V120)}
    msg = refusal_message("det", 1, ("det", "1.0.0"), "ab" * 32, V100, refused, 2, tuf=False)
    assert "metadataVersion 100" in msg and "metadataVersion 120" in msg
    assert "edgectl models push MODEL_FILE --name det --version 1.0.0" in msg
    assert "edgectl rollback allow --name det --version 1.0.0" in msg  # older too

    msg = refusal_message("det", 1, ("det", "1.0.0"), "ab" * 32, V100, refused, 2, tuf=True)
    assert "edgectl models push MODEL_FILE --name det --version 1.0.0 --allow-rollback 7d" in msg
    assert "rollback push" not in msg  # a TUF device refuses a separate allowance envelope
    version_floor = {"dev-0": Refusal("ModelVersionRollback", V120)}
    msg = refusal_message("det", 1, ("det", "1.0.0"), "ab" * 32, V100, version_floor, 2, tuf=True)
    assert "--allow-rollback 7d" in msg and "rollback push" not in msg

    newer = {"dev-0": Refusal("MetadataRollback", Signed("0.9.0", 120))}
    msg = refusal_message("det", 1, ("det", "1.0.0"), "ab" * 32, V100, newer, 1, tuf=False)
    assert "rollback allow" not in msg  # not an older version: signing it again is enough
