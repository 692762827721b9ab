"""Publishers per deployment end to end (issue 18, item 3): a real hub with a TUF repository
(``hub init --tuf``) and an enrolled edged over mTLS gRPC.

A SecurityBaseline allows the fleet's one publisher key only for deployments named
``vision-*``. Both models are signed by that key, which the trust root and the TUF
delegation trust: the deployment ``vision-front`` runs its model, the deployment ``speech``
is refused on the device with ``PublisherNotAllowed`` (its model is never fetched, so never
loaded). A baseline naming a key the hub does not know is refused at apply with the field path.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.trust.envelopes import key_id
from edgefleet.trust.signing import load_public_key_raw

pytestmark = pytest.mark.scenario

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {name}}}
spec:
  model: {{name: {model}, version: "1.0.0"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  probes:
    readiness: {{periodSeconds: 1, timeoutSeconds: 1}}
"""

BASELINE = """\
apiVersion: edgefleet.io/v1
kind: SecurityBaseline
metadata: {{name: publishers}}
spec:
  publishers:
  - keys: ["{key}"]
    deployments: ["vision-*"]
"""


@pytest.fixture
def hub_init_args() -> tuple[str, ...]:
    return ("--tuf",)


def ready(e: Edged, name: str) -> bool:
    try:
        w = e.workload(name)
    except (KeyError, StopIteration):
        return False
    return w.get("readyReplicas") == 1


def problems(e: Edged) -> dict[str, tuple[str, str]]:
    hub = e.status().get("hub") or {}
    return {p["workload"]: (p["reason"], p["message"]) for p in hub.get("problems", [])}


def test_a_trusted_publisher_not_allowed_for_a_deployment_is_refused(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    publisher = key_id(load_public_key_raw(hub.data / "publisher.pub"))
    data = tmp_path / "dev"
    out = enroll(hub, data, "dev", {})
    assert out.returncode == 0, out.stdout + out.stderr

    # a key the hub does not know: refused at apply, naming the field; nothing stored
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(BASELINE.format(key="ab" * 32))
    refused = hub.edgectl("apply", "-f", str(unknown), check=False)
    assert refused.returncode != 0
    assert "spec.publishers[0].keys[0]" in refused.stderr + refused.stdout
    assert "not a publisher key" in refused.stderr + refused.stdout
    listed = hub.edgectl("get", "baselines", "-o", "json", check=False)
    assert "publishers" not in listed.stdout, listed.stdout

    shas = {}
    for model, seed in (("det", 1), ("asr", 2)):
        path = tmp_path / f"{model}.onnx"
        build_mlp(path, TINY_MLP, seed=seed)
        pushed = hub.edgectl("models", "push", str(path), "--name", model, "--version", "1.0.0")
        assert "pushed" in pushed.stdout, pushed.stdout + pushed.stderr
        import hashlib

        shas[model] = hashlib.sha256(path.read_bytes()).hexdigest()
    baseline = tmp_path / "baseline.yaml"
    baseline.write_text(BASELINE.format(key=publisher))
    hub.edgectl("apply", "-f", str(baseline))
    docs = tmp_path / "deployments.yaml"
    docs.write_text(
        DEPLOYMENT.format(name="vision-front", model="det")
        + "---\n"
        + DEPLOYMENT.format(name="speech", model="asr")
    )
    hub.edgectl("apply", "-f", str(docs))

    e = edged_factory(None, data=data, config=SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "x"))
    e.start()
    try:
        wait_for(lambda: ready(e, "vision-front"), 90, "the device to serve vision-front")
        wait_for(lambda: "speech" in problems(e), 60, "the device to refuse speech's artifact")
        reason, message = problems(e)["speech"]
        assert reason == "PublisherNotAllowed", message
        assert "SecurityBaseline publishers" in message and "speech" in message
        assert e.status()["hub"]["tufRequired"] is True  # the TUF role was checked too
        store = data / "artifacts" / "sha256"
        assert (store / shas["det"]).exists()
        assert not (store / shas["asr"]).exists()  # refused before any byte was fetched
        assert not (data / "downloads" / f"{shas['asr']}.part").exists()
        assert not ready(e, "speech")

        # the baseline widened to the deployment: the same artifact is admitted and runs
        baseline.write_text(
            BASELINE.format(key=publisher)
            + '  - keys: ["'
            + publisher
            + '"]\n    deployments: [speech]\n'
        )
        hub.edgectl("apply", "-f", str(baseline))
        wait_for(lambda: ready(e, "speech"), 90, "the device to serve speech once allowed")
    finally:
        e.terminate()
