"""Power cuts on the lab's device (after test_device and test_limits): a new version of ``det``
is applied at the hub and QEMU is killed (SIGKILL: no shutdown, the guest's page cache lost)
at a random moment while the device applies it: the artifact download, the version switch.
Each time the device boots, serves either version with the answers of that version's model
(its state intact, or cleanly the previous one), and converges to the new version.

Rounds: ``EDGEFLEET_VMLAB_POWER_CUTS`` (default 3, what CI runs). The moments come from a
seeded random generator whose seed is printed (``EDGEFLEET_VMLAB_SEED`` replays a run).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from lab import LabHub, Vm, deploy, enrolled, infer_request, push, wait_for

from edgefleet.demo import TINY_MLP, build_mlp

pytestmark = [pytest.mark.vmlab, pytest.mark.timeout(3600)]

ROUNDS = int(os.environ.get("EDGEFLEET_VMLAB_POWER_CUTS", "3"))
TIMEOUT = 420
CUT_WINDOW_S = (0.5, 14.0)  # after the apply: the download, verification and switch (TCG)
X = np.random.default_rng(5).standard_normal((1, 64)).astype(np.float32)


def serving(vm: Vm) -> tuple[str, np.ndarray] | None:
    """(version, answer) of det, or None while it does not answer."""
    try:
        code, doc = vm.infer("det", infer_request(X), timeout=20)
    except OSError:
        return None
    if code != 200:
        return None
    out: dict[str, Any] = doc["outputs"][0]
    return str(doc.get("model_version", "")), np.asarray(out["data"], np.float32).reshape(
        out["shape"]
    )


def answer_of(model: Path) -> np.ndarray:
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    out: np.ndarray = sess.run(None, {"input": X})[0]
    return out


def test_power_cuts_during_an_update_leave_a_device_that_boots_serves_and_converges(
    seeded: tuple[Vm, str], hub: LabHub, tmp_path: Path
) -> None:
    vm, _ = seeded
    seed = int(os.environ.get("EDGEFLEET_VMLAB_SEED", str(time.time_ns() % 1_000_000)))
    rng = random.Random(seed)
    print(f"power cuts: {ROUNDS} rounds, EDGEFLEET_VMLAB_SEED={seed}")
    wait_for(lambda: enrolled(hub), TIMEOUT, "the device at the hub", period=3)
    models: dict[str, Path] = {}
    current = wait_for(lambda: serving(vm), TIMEOUT, "det to answer", period=1)[0]
    for i in range(ROUNDS):
        version = f"2.0.{i}"
        models[version] = tmp_path / f"det-{version}.onnx"
        build_mlp(models[version], TINY_MLP, seed=100 + i)
        push(hub, models[version], "det", version)
        deploy(hub, tmp_path, "det", version)
        delay = rng.uniform(*CUT_WINDOW_S)
        time.sleep(delay)  # the random moment of the cut is the point, not a wait for state
        vm.kill()
        vm.start()
        vm.wait_agent(TIMEOUT)
        got = wait_for(lambda: serving(vm), TIMEOUT, f"det to answer after cut {i}", period=1)
        print(f"cut {i}: {delay:.1f}s after applying {version}; after the boot: {got[0]}")
        assert got[0] in (current, version), f"serves {got[0]}, neither {current} nor {version}"
        if got[0] in models:
            np.testing.assert_allclose(got[1], answer_of(models[got[0]]), rtol=1e-5, atol=1e-5)
        # the answer checked is the one that showed the version: a second request could come
        # while the worker restarts (a TCG guest on a loaded host misses liveness probes)
        now = wait_for(
            lambda v=version: (s := serving(vm)) is not None and s[0] == v and s,
            TIMEOUT,
            f"det {version} to serve after cut {i}",
            period=1,
        )
        np.testing.assert_allclose(now[1], answer_of(models[version]), rtol=1e-5, atol=1e-5)
        current = version
    # the hub sees the device on the last version (its status survived the cuts too)
    name = enrolled(hub)[0]["metadata"]["name"]
    wait_for(
        lambda: f'"{current}"' in hub.edgectl("get", "devices", name, "-o", "json").stdout,
        TIMEOUT,
        f"the hub to see det {current} on the device",
        period=3,
    )
