"""``edgectl scale``, ``patch`` and ``edit`` against a real hub (tests/edgectl/conftest.py): the
object read, changed and applied with its resourceVersion checked, so a concurrent change is
refused and never overwritten; ``edit`` runs a real editor program ($EDITOR)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import grpc
import orjson
from edgectltesting import EDGECTL, edgectl
from hubserving import ThreadedHub

from edgefleet.v1 import admin_pb2


def deployment(name: str, replicas: str, more: str = "") -> str:
    return (
        textwrap.dedent(f"""\
        apiVersion: edgefleet.io/v1
        kind: ModelDeployment
        metadata: {{name: {name}, labels: {{team: vision}}}}
        spec:
          model: {{name: {name}, version: "1.0.0"}}
          replicas: {replicas}
        """)
        + more
    )


def get(config: Path, ref: str) -> dict[str, Any]:
    done = edgectl(config, "get", ref, "-o", "json")
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = orjson.loads(done.stdout)
    return doc


def apply(config: Path, text: str) -> None:
    done = edgectl(config, "apply", "-f", "-", stdin=text)
    assert done.returncode == 0, done.stderr


def test_scale_sets_replicas_total_and_refuses_what_it_cannot_mean(config: Path) -> None:
    apply(config, deployment("fleet-total", "{total: 2}"))
    done = edgectl(config, "scale", "deployment/fleet-total", "--replicas", "3")
    assert (done.returncode, done.stdout) == (
        0,
        "modeldeployment/fleet-total scaled (replicas.total 2 to 3)\n",
    ), done.stderr
    assert get(config, "md/fleet-total")["spec"]["replicas"] == {"total": 3}
    done = edgectl(config, "scale", "deployment", "fleet-total", "--replicas", "3")
    assert done.stdout == "modeldeployment/fleet-total scaled (no change)\n"
    done = edgectl(config, "scale", "md/fleet-total", "--replicas", "1", "--current-replicas", "5")
    assert done.returncode == 1
    assert "replicas.total is 3, not 5 (--current-replicas): not scaled" in done.stderr
    assert get(config, "md/fleet-total")["spec"]["replicas"] == {"total": 3}

    apply(config, deployment("per-device", "{perDevice: 1}"))
    done = edgectl(config, "scale", "deployment/per-device", "--replicas", "4")
    assert done.returncode == 1
    assert "runs replicas.perDevice (1 on every matching device)" in done.stderr
    assert """--type merge -p '{"spec":{"replicas":{"perDevice":4}}}'""" in done.stderr
    apply(
        config,
        deployment("autoscaled", "{total: 2}", "  scaling: {minReplicas: 1, maxReplicas: 5}\n"),
    )
    done = edgectl(config, "scale", "deployment/autoscaled", "--replicas", "4")
    assert done.returncode == 1 and "is autoscaled (spec.scaling: minReplicas 1" in done.stderr
    for args, why in (
        (["scale", "device/cam-1", "--replicas", "1"], "cannot be scaled"),
        (["scale", "md/fleet-total", "--replicas", "-1"], "must be a whole number"),
        (["scale", "md/fleet-total"], "--replicas"),
    ):
        done = edgectl(config, *args)
        assert done.returncode == 2 and why in done.stderr, (args, done.stderr)


def test_patch_merge_json_and_strategic(config: Path, tmp_path: Path) -> None:
    apply(config, deployment("patched", "{perDevice: 1}"))
    done = edgectl(
        config, "patch", "md/patched", "--type", "merge",
        "-p", '{"metadata": {"labels": {"team": null, "tier": "gold"}}}',
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "modeldeployment/patched patched\n"), done.stderr
    assert get(config, "md/patched")["metadata"]["labels"] == {"tier": "gold"}
    ops = tmp_path / "ops.yaml"
    ops.write_text(
        "- {op: test, path: /spec/replicas/perDevice, value: 1}\n"
        "- {op: replace, path: /spec/replicas/perDevice, value: 2}\n"
    )
    done = edgectl(
        config, "patch", "deployment", "patched", "--type", "json", "--patch-file", str(ops)
    )
    assert done.returncode == 0, done.stderr
    assert get(config, "md/patched")["spec"]["replicas"] == {"perDevice": 2}
    # the test of the same patch now fails: nothing changes
    done = edgectl(config, "patch", "md/patched", "--type", "json", "--patch-file", str(ops))
    assert done.returncode == 1 and "[0]: test failed" in done.stderr
    # strategic (the default): maps merge; an unknown directive is refused, not ignored
    done = edgectl(config, "patch", "md/patched", "-p", "{metadata: {annotations: {a: b}}}")
    assert done.returncode == 0, done.stderr
    assert get(config, "md/patched")["metadata"]["annotations"] == {"a": "b"}
    done = edgectl(config, "patch", "md/patched", "-p", '{"spec": {"$retainKeys": ["model"]}}')
    assert done.returncode == 1 and "spec.$retainKeys: not supported yet" in done.stderr
    # the same again: no change, nothing written
    before = get(config, "md/patched")["metadata"]["resourceVersion"]
    done = edgectl(config, "patch", "md/patched", "-p", "{metadata: {annotations: {a: b}}}")
    assert done.stdout == "modeldeployment/patched patched (no change)\n"
    assert get(config, "md/patched")["metadata"]["resourceVersion"] == before
    # what the hub would refuse is refused by field; the name and kind never change
    for patch, why in (
        ('{"spec": {"replicas": {"perDevice": "many"}}}', "spec.replicas.perDevice"),
        ('{"metadata": {"name": "other"}}', "metadata.name cannot change"),
        ('{"kind": "Secret"}', "kind cannot change"),
    ):
        done = edgectl(config, "patch", "md/patched", "--type", "merge", "-p", patch)
        assert done.returncode == 1 and why in done.stderr, (patch, done.stderr)
    assert get(config, "md/patched")["metadata"]["resourceVersion"] == before
    for args, why in (
        (["patch", "md/patched"], "give the patch with -p PATCH or --patch-file FILE"),
        (["patch", "md/patched", "-p", "{}", "--type", "xml"], "invalid choice"),
        (["patch", "secret/s", "-p", "{}"], "a Secret's values are never shown"),
        (["patch", "device/cam-1", "-p", "{}"], "not applied by operators"),
    ):
        done = edgectl(config, *args)
        assert done.returncode == 2 and why in done.stderr, (args, done.stderr)


def editor(tmp_path: Path, body: str) -> dict[str, str]:
    script = tmp_path / "editor.py"
    script.write_text("import os, subprocess, sys\npath = sys.argv[1]\n" + textwrap.dedent(body))
    return {"EDITOR": f"{sys.executable} {script}", "KUBE_EDITOR": ""}


def test_edit_applies_the_edited_yaml_and_refuses_a_concurrent_change(
    config: Path, tmp_path: Path
) -> None:
    apply(config, deployment("edited", "{perDevice: 1}"))
    env = editor(
        tmp_path,
        """
        text = open(path).read()
        assert "resourceVersion" in text and "status" not in text, text
        open(path, "w").write(text.replace("perDevice: 1", "perDevice: 3"))
        """,
    )
    done = edgectl(config, "edit", "deployment/edited", env=env)
    assert (done.returncode, done.stdout) == (0, "modeldeployment/edited edited\n"), done.stderr
    assert get(config, "md/edited")["spec"]["replicas"] == {"perDevice": 3}

    # saved unchanged: nothing applied
    before = get(config, "md/edited")["metadata"]["resourceVersion"]
    done = edgectl(config, "edit", "md", "edited", env=editor(tmp_path, "pass\n"))
    assert (done.returncode, done.stdout) == (0, "Edit cancelled, no changes made.\n")
    assert get(config, "md/edited")["metadata"]["resourceVersion"] == before

    # someone else changes it while the editor is open: refused, the edit kept in its file
    env = editor(
        tmp_path,
        f"""
        subprocess.run([{EDGECTL!r}, "--config", {str(config)!r}, "label", "md/edited",
                        "tier=gold"], check=True, capture_output=True)
        text = open(path).read()
        open(path, "w").write(text.replace("perDevice: 3", "perDevice: 5"))
        """,
    )
    done = edgectl(config, "edit", "md/edited", env=env)
    assert done.returncode == 1
    assert f"changed since resourceVersion {before}" in done.stderr, done.stderr
    kept = Path(done.stderr.rsplit("your changes are in ", 1)[1].strip())
    assert "perDevice: 5" in kept.read_text()
    kept.unlink()
    after = get(config, "md/edited")
    assert after["spec"]["replicas"] == {"perDevice": 3}  # not overwritten
    assert after["metadata"]["labels"]["tier"] == "gold"  # the other change stays

    # an editor that fails, or an edit the hub would refuse: nothing applied
    done = edgectl(config, "edit", "md/edited", env=editor(tmp_path, "sys.exit(3)\n"))
    assert done.returncode == 1 and "the editor exited with 3" in done.stderr
    env = editor(
        tmp_path,
        """
        text = open(path).read()
        open(path, "w").write(text.replace("perDevice: 3", "perDevice: lots"))
        """,
    )
    done = edgectl(config, "edit", "md/edited", env=env)
    assert done.returncode == 1 and "spec.replicas.perDevice" in done.stderr
    Path(done.stderr.rsplit("your changes are in ", 1)[1].strip()).unlink()
    assert os.environ.get("EDITOR") != env["EDITOR"]


def test_the_hub_checks_the_resource_version_an_apply_carries(hub: ThreadedHub) -> None:
    config = hub.paths.admin_config
    apply(config, deployment("versioned", "{perDevice: 1}"))
    doc = get(config, "md/versioned")
    version = doc["metadata"]["resourceVersion"]
    doc.pop("status")

    async def call(doc: dict[str, Any]) -> str:
        assert hub.hub is not None
        request = admin_pb2.ApplyRequest(documents=[orjson.dumps(doc)], check_resource_version=True)
        async with hub.hub.channel() as channel:
            try:
                await hub.hub.stub(channel).Apply(request)
            except grpc.aio.AioRpcError as exc:
                return f"{exc.code().name}: {exc.details()}"
        return "applied"

    stale = {**doc, "metadata": {**doc["metadata"], "resourceVersion": str(int(version) - 1)}}
    stale["spec"] = {**doc["spec"], "replicas": {"perDevice": 2}}
    got = hub.run(call(stale))
    assert got.startswith('ABORTED: ModelDeployment "versioned" changed since resourceVersion')
    missing = {**stale, "metadata": {"name": "versioned"}}
    got = hub.run(call(missing))
    assert got.startswith("INVALID_ARGUMENT: documents[0].metadata.resourceVersion: required")
    fresh = {**stale, "metadata": doc["metadata"]}
    assert hub.run(call(fresh)) == "applied"
    assert get(config, "md/versioned")["spec"]["replicas"] == {"perDevice": 2}
