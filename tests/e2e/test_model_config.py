"""Model configuration end to end (kind: ModelConfig, issue 36): a real ``hub serve``, a real
enrolled ``edged run``, real gRPC with real certificates, a real worker under Landlock.

The publisher's schema refuses a bad override at apply, with its path; the merged config of
the device (defaults, its site's override, its own) reaches the worker's sandbox as a
read-only file its worker reads through ``EDGEFLEET_MODEL_CONFIG`` (the other workload's
worker cannot read it); the device reports the digest and the hub counts it as the desired
config; a change is applied while inference runs, without a failed request and without a
worker restart; and the last config stays through the hub's loss and edged's kill -9."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for

from edged.runtime import landlock
from edged.runtime.worker import TEST_PROBE_ENV
from edgefleet.api.modelconfigs import config_digest
from edgefleet.demo import TINY_MLP, build_mlp

pytestmark = [
    pytest.mark.scenario,
    pytest.mark.skipif(landlock.abi_version() < 1, reason="no Landlock on this kernel"),
]

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "threshold": {"type": "number", "minimum": 0, "maximum": 1},
        "zones": {"type": "object"},
    },
}
DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {name}}}
spec:
  model: {{name: {name}, version: "1.0.0"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  placement:
    nodeSelector: {{site: a}}
    tolerations: [{{key: node.edgefleet.io/untrusted, operator: Exists}}]
"""
CONFIG = """\
apiVersion: edgefleet.io/v1
kind: ModelConfig
metadata: {{name: det}}
spec:
  model: det
  data: {{threshold: 0.5, zones: {{door: [0, 0, 10, 10]}}}}
  files: {{labels.txt: "person\\n"}}
  overrides:
    - selector: {{site: a}}
      data: {{threshold: {site}}}
    - devices: [dev-0]
      data: {{zones: {{till: [1, 1, 2, 2]}}}}
"""


def _apply(hub: HubProcess, tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    out = hub.edgectl("apply", "-f", str(path), check=False)
    return out.stdout + out.stderr


def _expected(threshold: float) -> dict[str, object]:
    return {
        "data": {"threshold": threshold, "zones": {"door": [0, 0, 10, 10], "till": [1, 1, 2, 2]}},
        "files": {"labels.txt": "person\n"},
    }


def test_a_config_reaches_the_sandboxed_worker_reloads_and_is_reported(
    tmp_path: Path, edged_factory: Callable[..., Edged], monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init().start()
    try:
        model = tmp_path / "det" / "det.onnx"
        model.parent.mkdir()
        build_mlp(model, TINY_MLP, seed=1)
        schema = model.parent / "config.schema.json"
        schema.write_text(json.dumps(SCHEMA))
        pushed = hub.edgectl("models", "push", str(model), "--name", "det", "--version", "1.0.0",
                             "--extra", str(schema))  # fmt: skip
        assert "pushed" in pushed.stdout, pushed.stdout + pushed.stderr
        other = tmp_path / "other.onnx"
        build_mlp(other, TINY_MLP, seed=2)
        hub.edgectl("models", "push", str(other), "--name", "other", "--version", "1.0.0")
        data = tmp_path / "dev-0"
        out = enroll(hub, data, "dev-0", {}, token_labels={"site": "a"})
        assert out.returncode == 0, out.stdout + out.stderr
        mine = data / "configs" / "det" / "config.json"
        theirs = data / "configs" / "other" / "config.json"
        probe = [{"config": ""}, {"open": str(theirs)}]
        monkeypatch.setenv(TEST_PROBE_ENV, orjson.dumps(probe).decode())
        config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
        e = edged_factory(None, data=data, config=config).start()

        # 1. the publisher's schema (of the version det runs): a bad override is refused at
        # apply, with its path
        deployments = "---\n".join(DEPLOYMENT.format(name=n) for n in ("det", "other"))
        refused = _apply(hub, tmp_path, "bad", CONFIG.format(site=1.5) + "---\n" + deployments)
        assert "documents[0].spec.overrides[0].data.threshold: must be at most 1" in refused
        assert "nothing applied" in refused
        applied = _apply(hub, tmp_path, "config", CONFIG.format(site=0.6) + "---\n" + deployments)
        assert "modelconfig/det created" in applied, applied
        assert "new revision" in applied  # what a change does, said at apply

        # 2. delivered: the merged config in the worker's sandbox, read-only
        def both_ready() -> bool:
            names = {w["name"]: w for w in e.status()["workloads"]}
            return all(
                n in names and any(r["ready"] for r in names[n]["replicas"])
                for n in ("det", "other")
            )

        wait_for(both_ready, 120, "workloads det and other to be ready")
        assert json.loads(mine.read_text()) == _expected(0.6)
        assert (mine.parent / "files" / "labels.txt").read_text() == "person\n"
        assert oct(mine.resolve().stat().st_mode & 0o777) == "0o444"
        assert oct(mine.resolve().parent.stat().st_mode & 0o777) == "0o555"
        assert not theirs.exists()  # other's model has no config

        # the worker reads it through EDGEFLEET_MODEL_CONFIG; other's worker has none there
        lines = wait_for(lambda: e.probe_results()[:2] if len(e.probe_results()) >= 2 else [],
                         30, "both workers' probe results")  # fmt: skip
        outcomes = sorted(r[0]["outcome"] for r in lines)
        assert outcomes == sorted(
            [json.dumps(_expected(0.6)["data"], sort_keys=True, separators=(",", ":")),
             "FileNotFoundError: errno 2"]
        ), lines  # fmt: skip

        # 3. reported: the hub counts the device as running the desired config
        want = config_digest(_expected(0.6))

        def counted(digest: str) -> dict[str, object] | None:
            doc = orjson.loads(hub.edgectl("get", "deployment", "det", "-o", "json").stdout)
            shown = doc["status"].get("config")
            if shown and shown["runningDesired"] == 1:
                return dict(shown)
            return None

        shown = wait_for(lambda: counted(want), 60, "the hub to count the desired config")
        assert shown == {"modelConfig": "det", "devices": 1, "runningDesired": 1,
                         "notRunningDesired": {}}  # fmt: skip
        described = hub.edgectl("describe", "deployment", "det").stdout
        assert "ModelConfig det: 1 of 1 devices run the desired config" in described

        # 4. a change while inference runs: no failed request, no restart
        (pid,) = e.worker_pids("det")
        answers: dict[int, int] = {}
        stop = threading.Event()

        def traffic() -> None:
            while not stop.is_set():
                status, _ = e.infer("det", [[0.5] * TINY_MLP[0]])
                answers[status] = answers.get(status, 0) + 1
                stop.wait(0.01)

        runner = threading.Thread(target=traffic)
        runner.start()
        try:
            changed = _apply(hub, tmp_path, "config", CONFIG.format(site=0.7))
            assert "modelconfig/det configured" in changed, changed
            wait_for(lambda: json.loads(mine.read_text()) == _expected(0.7), 60,
                     "the new config on the device")  # fmt: skip
            wait_for(lambda: counted(config_digest(_expected(0.7))), 60, "the new digest")
        finally:
            stop.set()
            runner.join()
        assert e.worker_pids("det") == [pid]
        assert set(answers) == {200} and answers[200] > 5, answers

        # 5. the hub goes, edged is killed: the last verified config is still there
        hub.stop()
        e.kill9()
        e.start()
        e.wait_ready(120)
        assert json.loads(mine.read_text()) == _expected(0.7)
        assert not any(p.name.startswith("..v-") and p.resolve() != mine.resolve().parent
                       for p in mine.parent.iterdir())  # fmt: skip
        assert e.terminate() == 0
    finally:
        hub.stop()


STATIC_CONFIG = """\
apiVersion: edgefleet.io/v1
kind: ModelConfig
metadata: {name: mlp}
spec:
  model: mlp
  data: {threshold: 0.5}
  overrides:
    - selector: {site: store-7}
      data: {threshold: 0.8}
"""


def test_static_manifests_carry_a_config_for_a_standalone_device(
    model_dir: Path, edged_factory: Callable[..., Edged], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No hub: the ModelConfig beside the deployment is merged for this device (its
    operator-set labels), written before the worker starts, and read by it."""
    from harness import UNSIGNED_CONFIG, write_manifest

    write_manifest(model_dir)
    (model_dir / "mlp-config.yaml").write_text(STATIC_CONFIG)
    monkeypatch.setenv(TEST_PROBE_ENV, orjson.dumps([{"config": ""}]).decode())
    e = edged_factory(model_dir)
    e.config_text = UNSIGNED_CONFIG.format(absent=model_dir / "no-root") + (
        '\n[device.labels]\nsite = "store-7"\n'
    )
    e.start()
    e.wait_ready(120)
    path = e.data / "configs" / "mlp" / "config.json"
    assert json.loads(path.read_text()) == {"data": {"threshold": 0.8}, "files": {}}
    lines = wait_for(lambda: e.probe_results()[:1], 30, "the worker's probe")
    assert lines[0][0]["outcome"] == '{"threshold":0.8}', lines
    assert not [w for w in e.status().get("problems", []) if "ModelConfig" in str(w)]
    assert e.terminate() == 0
