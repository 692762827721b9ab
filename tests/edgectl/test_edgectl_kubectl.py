"""edgectl in kubectl's forms, as tables, against a real hub (tests/edgectl/conftest.py): files
and directories, TYPE/NAME, output formats, set-based selectors, tokens, label and annotate,
diff, contexts, global flags anywhere, and the error (exit 2) for every flag that does not
apply to what was asked."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import orjson
import pytest
from edgectltesting import EDGECTL, MANIFESTS, edgectl
from hubserving import ThreadedHub

from edgefleet.versioning import version_text
from hub.decide.devices import Device, DevicePhase, RevisionPhase, RevisionReport, WorkloadReport

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {name}, labels: {{team: {team}}}}}
spec:
  model: {{name: {name}, version: "1.0.0"}}
  runtime: {{maxQueueDelay: 2ms}}
  replicas: {{perDevice: 1}}
"""


def _deployment(name: str, team: str = "vision") -> str:
    return DEPLOYMENT.format(name=name, team=team)


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EDGECTL, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


def test_apply_a_directory_and_recursively(config: Path, tmp_path: Path) -> None:
    top = tmp_path / "manifests"
    (top / "nested").mkdir(parents=True)
    (top / "a.yaml").write_text(_deployment("dir-a"))
    (top / "notes.txt").write_text("not a manifest")
    (top / "nested" / "b.yml").write_text(_deployment("dir-b"))

    flat = edgectl(config, "apply", "-f", str(top))
    assert (flat.returncode, flat.stdout) == (0, "modeldeployment/dir-a created\n"), flat.stderr
    deep = edgectl(config, "apply", "-R", "-f", str(top))
    assert deep.stdout.splitlines() == [
        "modeldeployment/dir-a unchanged",
        "modeldeployment/dir-b created",
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    none = edgectl(config, "apply", "-f", str(empty))
    assert none.returncode == 1
    assert (
        none.stderr == f"error: {empty}: no *.yaml, *.yml or *.json files (-R for subdirectories)\n"
    )

    deleted = edgectl(config, "delete", "-R", "-f", str(top))
    assert deleted.stdout.splitlines() == [
        "modeldeployment/dir-a deleted",
        "modeldeployment/dir-b deleted",
    ]
    again = edgectl(config, "delete", "-f", str(top / "a.yaml"))
    assert again.returncode == 1
    assert again.stderr == 'error: NOT_FOUND: ModelDeployment "dir-a" not found\n'


def test_get_by_type_slash_name_and_output_formats(config: Path) -> None:
    assert edgectl(config, "apply", "-f", "-", stdin=MANIFESTS).returncode == 0
    cases: list[tuple[list[str], str]] = [
        (["get", "device/cam-1", "-o", "name"], "device/cam-1\n"),
        (["get", "devices", "cam-2", "cam-1", "-o", "name"], "device/cam-2\ndevice/cam-1\n"),
        (["get", "devices", "-o", "name", "--sort-by", ".metadata.name"],
         "device/cam-1\ndevice/cam-2\n"),
        (["get", "devices", "-o", "jsonpath={.items[*].metadata.name}"], "cam-1 cam-2\n"),
        (["get", "dev/cam-1", "-o", "jsonpath={.metadata.labels.site}"], "retail\n"),
        (["get", "devices", "-o",
          'jsonpath={range .items[*]}{.metadata.name}={.status.phase}{"\\n"}{end}'],
         "cam-1=Ready\ncam-2=Pending\n\n"),
        (["get", "device/cam-1", "deploy/fraud", "-o", "name"],
         "device/cam-1\nmodeldeployment/fraud\n"),
        (["get", "devices", "-l", "site in (retail,lab)", "-o", "name"], "device/cam-1\n"),
        (["get", "devices", "-l", "site notin (retail)", "-o", "name"], "device/cam-2\n"),
        (["get", "devices", "-l", "!accelerator", "-o", "name"], "device/cam-2\n"),
        (["get", "policies", "--no-headers"], "needs-gpu   <none>\n"),
        (["get", "baselines", "--show-labels", "--no-headers"],
         "fleet   0   0   2   alert   false   <none>\n"),  # 2 devices, not checked yet
    ]  # fmt: skip
    for args, expected in cases:
        result = edgectl(config, *args)
        shown = re.sub(r"   \d+[smhd](?=   |$)", "", result.stdout, flags=re.M)  # AGE
        assert (result.returncode, shown) == (0, expected), (args, result.stderr)

    labels = edgectl(config, "get", "deployments", "--show-labels").stdout.splitlines()
    assert labels[0].split()[-1] == "LABELS" and labels[1].split()[-1] == "team=risk"
    mixed = edgectl(config, "get", "device/cam-1", "deployment/fraud").stdout
    assert mixed.count("NAME") == 2  # one table per kind
    by_heartbeat = edgectl(
        config, "get", "devices", "--sort-by", "{.status.lastHeartbeat}", "-o", "name"
    )
    assert by_heartbeat.stdout == "device/cam-2\ndevice/cam-1\n"  # never (cam-2) first


def test_objects_have_kubernetes_metadata_and_rfc3339_times(config: Path) -> None:
    edgectl(config, "apply", "-f", "-", stdin=_deployment("meta"))
    doc = orjson.loads(edgectl(config, "get", "deployment/meta", "-o", "json").stdout)
    metadata = doc["metadata"]
    assert re.fullmatch(r"[0-9a-f-]{36}", metadata["uid"])
    assert re.fullmatch(r"\d+", metadata["resourceVersion"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", metadata["creationTimestamp"])
    assert doc["spec"]["runtime"]["maxQueueDelay"] == "2ms"  # durations as written
    # what get prints applies again, unchanged (the hub's metadata is ignored when read)
    shown = edgectl(config, "get", "deployment/meta", "-o", "yaml").stdout
    again = edgectl(config, "apply", "-f", "-", stdin=shown)
    assert (again.returncode, again.stdout) == (0, "modeldeployment/meta unchanged\n"), again
    assert edgectl(config, "diff", "-f", "-", stdin=shown).returncode == 0

    events = orjson.loads(edgectl(config, "get", "events", "-o", "json").stdout)["items"]
    assert events and all(
        re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e["time"]) for e in events
    )
    device = orjson.loads(edgectl(config, "get", "device/cam-1", "-o", "json").stdout)
    assert device["status"]["lastHeartbeat"].endswith("Z")
    assert device["metadata"]["creationTimestamp"].endswith("Z")
    assert device["status"]["facts"]["cpuCount"] == 2  # not 2.0
    assert device["status"]["workloads"]["fraud"]["phase"] == "Ready"


def test_describe_is_for_people(config: Path) -> None:
    out = edgectl(config, "describe", "device/cam-1").stdout
    assert "{" not in out and "'" not in out, out  # no Python reprs
    for text in (
        "cpuCount: 2",
        "executionProviders:",
        "  available: CPUExecutionProvider",
        "Created:",
        "UID:",
    ):
        assert text in out, out
    assert re.search(r"Last heartbeat:\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(\d+[smhd] ago\)", out)
    workloads = out.split("Workloads:")[1].splitlines()
    assert workloads[2].split() == ["fraud", "2.4.1", "1/1", "Ready"]
    token = edgectl(config, "tokens", "create", "--description", "for describe").stdout.strip()
    described = edgectl(config, "describe", f"token/{token.split('.')[0]}").stdout
    assert (
        "description: for describe" in described and "Kind:             BootstrapToken" in described
    )


def test_tokens_are_listed_and_deleted(config: Path) -> None:
    created = edgectl(
        config, "tokens", "create", "--ttl", "2h", "--description", "line 7", "--label", "site=a"
    )
    token_id = created.stdout.strip().split(".")[0]
    listed = edgectl(config, "get", "tokens").stdout.splitlines()
    assert listed[0].split() == [
        "NAME", "EXPIRES-IN", "USAGE", "DESCRIPTION", "DEVICE-LABELS", "AGE"
    ]  # fmt: skip
    row = next(line for line in listed if line.startswith(token_id))
    assert row.split()[1:-1] == ["1h", "reusable", "line", "7", "site=a"]
    assert re.fullmatch(r"\d+s", row.split()[-1])
    doc = orjson.loads(edgectl(config, "get", f"token/{token_id}", "-o", "json").stdout)
    assert "secret" not in orjson.dumps(doc).decode().lower()
    assert doc["spec"]["expires"].endswith("Z")
    deleted = edgectl(config, "delete", "token", token_id)
    assert (deleted.returncode, deleted.stdout) == (0, f"bootstraptoken/{token_id} deleted\n")
    gone = edgectl(config, "get", "token", token_id)
    assert gone.returncode == 1
    assert gone.stderr == f'error: NOT_FOUND: BootstrapToken "{token_id}" not found\n'


def test_tokens_carry_the_rules_for_a_devices_own_labels(config: Path) -> None:
    """``tokens create --no-device-labels | --device-label-prefix``: what the hub enforces at
    enrollment, shown back in the token's spec; the two together are a usage error."""
    for flags, allowed, prefix in (
        (["--no-device-labels"], False, ""),
        (["--device-label-prefix", "device.acme.io/"], True, "device.acme.io/"),
        ([], True, ""),
    ):
        created = edgectl(config, "tokens", "create", "--label", "site=factory", *flags)
        assert created.returncode == 0, created.stderr
        token_id = created.stdout.strip().split(".")[0]
        spec = orjson.loads(edgectl(config, "get", f"token/{token_id}", "-o", "json").stdout)[
            "spec"
        ]
        assert (spec["deviceLabels"], spec["allowOwnLabels"], spec["ownLabelPrefix"]) == (
            {"site": "factory"}, allowed, prefix,
        )  # fmt: skip
    both = edgectl(config, "tokens", "create", "--no-device-labels", "--device-label-prefix", "x/")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    bad = edgectl(config, "tokens", "create", "--device-label-prefix=-x-")
    assert bad.returncode == 1
    assert bad.stderr.startswith("error: INVALID_ARGUMENT: device_label_prefix: must be a label")


def test_label_and_annotate(config: Path) -> None:
    edgectl(config, "apply", "-f", "-", stdin=_deployment("labelled"))
    steps: list[tuple[list[str], int, str]] = [
        (["label", "deployment", "labelled", "tier=gold"], 0, "modeldeployment/labelled labeled\n"),
        (["label", "deployment/labelled", "team=other"], 1, ""),
        (["label", "deployment/labelled", "team=other", "--overwrite"], 0,
         "modeldeployment/labelled labeled\n"),
        (["label", "md/labelled", "tier-"], 0, "modeldeployment/labelled labeled\n"),
        (["annotate", "md/labelled", "owner=Jane Doe <jane@example.com>"], 0,
         "modeldeployment/labelled annotated\n"),
        (["label", "md/labelled", "bad key=x"], 2, ""),
        (["label", "md/labelled"], 2, ""),
        (["label", "device/cam-1", "x=y"], 2, ""),
    ]  # fmt: skip
    for args, code, out in steps:
        result = edgectl(config, *args)
        assert (result.returncode, result.stdout) == (code, out), (args, result.stderr)
    metadata = orjson.loads(edgectl(config, "get", "md/labelled", "-o", "json").stdout)["metadata"]
    assert metadata["labels"] == {"team": "other"}
    assert metadata["annotations"] == {"owner": "Jane Doe <jane@example.com>"}
    clash = edgectl(config, "label", "deployment/labelled", "team=third")
    assert clash.stderr == (
        "error: ALREADY_EXISTS: modeldeployment/labelled: team already set "
        "(--overwrite to change)\n"
    )


def test_diff_shows_what_apply_would_change(config: Path, tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(_deployment("diffed"))
    new = edgectl(config, "diff", "-f", str(path))
    assert new.returncode == 1
    assert "+++ file/modeldeployment/diffed" in new.stdout and "+  name: diffed" in new.stdout
    edgectl(config, "apply", "-f", str(path))
    same = edgectl(config, "diff", "-f", str(path))
    assert (same.returncode, same.stdout) == (0, "")
    path.write_text(_deployment("diffed").replace("2ms", "5ms"))
    changed = edgectl(config, "diff", "-f", str(path))
    assert changed.returncode == 1
    assert "-    maxQueueDelay: 2ms\n+    maxQueueDelay: 5ms\n" in changed.stdout


def test_global_flags_anywhere_and_contexts(config: Path, tmp_path: Path) -> None:
    for args in (
        ["--config", str(config), "get", "devices", "-o", "name"],
        ["get", "--config", str(config), "devices", "-o", "name"],
        ["get", "devices", "-o", "name", "--config", str(config)],
    ):
        result = _run(*args)
        assert (result.returncode, result.stdout) == (0, "device/cam-1\ndevice/cam-2\n"), args

    hubs = tmp_path / "hubs.toml"
    steps: list[tuple[list[str], str]] = [
        (["config", "set-context", "eu", "--from", str(config)], f'context "eu" set in {hubs}\n'),
        (["config", "set-context", "us", "--from", str(config)], f'context "us" set in {hubs}\n'),
        (["config", "current-context"], "eu\n"),
        (["config", "use-context", "us"], 'switched to context "us"\n'),
        (["config", "current-context"], "us\n"),
        (["get", "devices", "cam-1", "-o", "name", "--context", "eu"], "device/cam-1\n"),
    ]
    for args, out in steps:
        result = _run(*args, env={"EDGECTL_CONFIG": str(hubs)})
        assert (result.returncode, result.stdout) == (0, out), (args, result.stderr)
    assert hubs.stat().st_mode & 0o777 == 0o600
    contexts = _run("config", "get-contexts", "--config", str(hubs)).stdout.splitlines()
    hub = config.read_text().split('"')[1]
    assert [line.split() for line in contexts] == [
        ["CURRENT", "NAME", "HUB"],
        ["eu", hub],
        ["*", "us", hub],
    ]
    unknown = _run("get", "devices", "--context", "mars", "--config", str(hubs))
    assert unknown.returncode == 2
    assert unknown.stderr == f"error: {hubs}: context: no context 'mars' (contexts: eu, us)\n"
    version = _run("--version")
    assert version.stdout.strip() == version_text("edgectl")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["get", "events", "-w", "--sort-by", ".time"],
         "error: get: --sort-by does not apply with --watch"),
        (["get", "events", "-l", "app=demo"], "error: get: -l/--selector does not apply to events"),
        (["get", "events", "-o", "wide"], "error: get: -o wide does not apply to events"),
        (["get", "devices", "--for", "device/x"],
         "error: unknown resource type 'device' (one of deployments)"),
        (["get", "deployments", "--for", "deployment/x"],
         "error: get: --for applies to events, devices and placements (get events --for "
         "TYPE/NAME, get devices|placements --for deployment/NAME)"),
        (["get", "devices", "cam-1", "-l", "a=b"],
         "error: get: -l/--selector does not apply with names (give names or a selector)"),
        (["get", "tokens", "-w"], "error: get: -w/--watch does not apply to tokens"),
        (["get", "devices", "-w", "--sort-by", ".metadata.name"],
         "error: get: --sort-by does not apply with --watch"),
        (["get", "devices", "-o", "json", "--no-headers"],
         "error: get: --no-headers applies only to tables, not -o json"),
        (["get", "device/a", "-w"],
         "error: get: -w/--watch needs one resource type (TYPE [NAME...], not TYPE/NAME)"),
        (["get", "pods"], "error: unknown resource type 'pods' (one of devices, deployments, "
         "models, baselines, policies, secrets, priorityclasses, agentupgrades, modelconfigs, "
         "tokens, "
         "regions, placements, events)"),
        (["get", "device/a", "b"], "error: 'b': give every object as TYPE/NAME, or TYPE NAME..."),
        (["get", "devices", "-o", "xml"], "error: edgectl get: argument -o/--output: unknown "
         "output format 'xml' (one of wide, name, json, yaml, jsonpath=TEMPLATE) "
         "(see 'edgectl get --help')"),
        (["get", "devices", "-o", "jsonpath={range .items[*]}"], "error: edgectl get: argument "
         "-o/--output: jsonpath '{range .items[*]}': {range} without {end}"),
        (["apply", "-f"], "error: edgectl apply: argument -f/--filename: expected one argument"),
        (["delete", "-R", "deployment", "x"], "error: delete: -R applies only with -f DIR"),
        (["delete", "deployment"], "error: delete: which deployment? give TYPE NAME... or "
         "TYPE/NAME"),
        (["describe", "device"], "error: describe: give TYPE NAME or TYPE/NAME"),
        (["config", "current-context", "--context", "x"],
         "error: config: --context does not apply (name the context as an argument)"),
        (["logs", "pods/x"], "error: unknown resource type 'pods' (one of devices, deployments)"),
        (["logs", "cam-1"], "error: logs: give device/NAME [WORKLOAD], deployment/NAME or -l"),
    ],
)  # fmt: skip
def test_a_flag_that_does_not_apply_is_a_usage_error(
    config: Path, args: list[str], message: str
) -> None:
    result = edgectl(config, *args)
    assert result.returncode == 2, result
    assert result.stderr.startswith(message), result.stderr
    assert result.stdout == ""


def test_logs_of_a_device_that_is_not_connected_say_where_to_look(config: Path) -> None:
    """logs asks the device through the hub (tests/hub/test_hub_syncing.py has the relay);
    the seeded devices have no stream, so the hub says so; usage errors need no hub."""
    result = edgectl(config, "logs", "device/cam-1", "fraud", "--tail", "5")
    assert result.returncode == 1
    assert result.stderr.startswith(
        "error: FAILED_PRECONDITION: device cam-1 is not connected: its log lines are on the "
        "device (journalctl -u edged there)"
    ), result.stderr
    for args, message in (
        (["logs", "device/cam-1", "a", "b"], "error: logs: one workload at most"),
        (["logs", "device/cam-1", "--tail", "0"], "error: edgectl logs: argument --tail: must be"),
    ):
        usage = edgectl(config, *args)
        assert usage.returncode == 2 and usage.stderr.startswith(message), usage.stderr


def test_explain_describes_fields_from_the_validation(config: Path) -> None:
    page = _run("explain", "deployment.spec.runtime.maxBatchSize")
    assert page.returncode == 0, page.stderr
    assert page.stdout == (
        "KIND:     ModelDeployment\n"
        "VERSION:  edgefleet.io/v1\n"
        "\n"
        "FIELD:    maxBatchSize <integer>\n"
        "\n"
        "DESCRIPTION:\n"
        "     Rows per batch the worker may merge requests into.\n"
        "     Must be an integer.\n"
        "     Must be from 1 to 1024.\n"
        "     Default: 1.\n"
    )
    fields = _run("explain", "md.spec").stdout
    assert "   model\t<Object> -required-\n" in fields
    assert "   replicas\t<Object>\n" in fields
    tree = _run("explain", "baselines", "--recursive").stdout.splitlines()
    assert "      requireTpm\t<boolean>" in tree
    assert "         compliant\t<integer>" in tree  # the fleet's compliance the hub shows
    # the kinds the hub makes: their pages come from edgefleet/api/shown.py
    device = _run("explain", "device.status.compliance.findings.kind").stdout
    assert device.startswith("KIND:     Device\nVERSION:  edgefleet.io/v1\n\nFIELD:    kind")
    assert "StrayProcess, ModelFileOpened or\n     ListeningSocket." in device
    for word, kind in (
        ("models", "Model"),
        ("tokens", "BootstrapToken"),
        ("regions", "Region"),
        ("events", "Event"),
    ):
        page = _run("explain", word)
        assert page.returncode == 0 and page.stdout.startswith(f"KIND:     {kind}\n"), page
    for args, code, message in (
        (["explain", "md.spec.nope"], 1, 'error: field "nope" does not exist in '
         "ModelDeployment.spec (fields: model, runtime,"),
        (["explain", "events.object.nope"], 1, 'error: field "nope" does not exist in '
         "Event.object (fields: kind, name)"),
        (["explain", "nodes"], 2, "error: unknown resource type 'nodes' (one of "
         "deployments, policies, baselines, secrets, priorityclasses, agentupgrades, "
         "modelconfigs, devices, models, tokens, regions, events)"),
        (["explain", "md", "--config", str(config)], 2, "error: explain: --config does not "
         "apply"),
    ):  # fmt: skip
        result = _run(*args)
        assert (result.returncode, result.stdout) == (code, ""), result
        assert result.stderr.startswith(message), result.stderr


def test_exit_codes(config: Path, tmp_path: Path) -> None:
    unreachable = tmp_path / "admin.toml"
    text = config.read_text()
    unreachable.write_text(text.replace(text.split('"')[1], "127.0.0.1:1"))
    env = {"GRPC_VERBOSITY": "NONE"}
    cases: list[tuple[Path, list[str], int]] = [
        (config, ["get", "devices"], 0),
        (config, ["get", "device", "nope"], 1),
        (config, ["apply", "-f", str(tmp_path / "missing.yaml")], 1),
        (tmp_path / "absent.toml", ["get", "devices"], 2),
        (config, ["get", "devices", "--bogus"], 2),
        (unreachable, ["get", "devices"], 3),
        (unreachable, ["delete", "deployment", "x"], 3),
    ]
    for cfg, args, code in cases:
        result = edgectl(cfg, *args, env=env)
        assert result.returncode == code, (args, result.stderr)
        assert code == 0 or result.stderr.startswith("error: "), result.stderr


def test_bash_completion_is_generated_from_the_parser(tmp_path: Path) -> None:
    script = tmp_path / "edgectl.bash"
    script.write_text(_run("completion", "bash").stdout)

    def complete(line: str) -> list[str]:
        words = line.split(" ")
        program = (
            f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
            f"COMP_CWORD={len(words) - 1}; _edgectl; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        )
        result = subprocess.run(
            ["bash", "-c", program], check=True, capture_output=True, text=True, timeout=30
        )
        return result.stdout.split()

    assert {"apply", "get", "describe", "config", "completion"} <= set(complete("edgectl "))
    assert complete("edgectl ge") == ["get"]
    assert "devices" in complete("edgectl get ")
    assert complete("edgectl --config x.toml get dep") == ["deployments"]
    assert {"--output", "--selector", "--watch", "--sort-by"} <= set(complete("edgectl get -"))
    assert complete("edgectl get devices -o js") == ["json", "jsonpath="]
    assert complete("edgectl config use") == ["use-context"]
    zsh = _run("completion", "zsh").stdout
    assert zsh.startswith("#compdef edgectl\n") and "bashcompinit" in zsh


def test_a_download_in_progress_is_shown(config: Path, hub: ThreadedHub) -> None:
    """A device's report of a revision Downloading (bytes on the device, of the signed length)
    is in describe and get -o wide. Last in this file: it adds a device and deletes it."""

    async def downloading() -> None:
        assert hub.hub is not None
        revision = RevisionReport(
            "2.5.0", "ab" * 32, RevisionPhase.DOWNLOADING, wanted=True,
            bytes_done=47_185_920, bytes_total=104_857_600,
        )  # fmt: skip
        hub.hub.ctx.writer.update(
            Device(
                name="cam-9",
                phase=DevicePhase.READY,
                workloads={"fraud": WorkloadReport("2.5.0", revisions=(revision,))},
            )
        )
        await hub.hub.ctx.writer.flush()

    hub.run(downloading())
    try:
        page = edgectl(config, "describe", "device/cam-9").stdout
        downloads = page.split("Downloads:")[1].splitlines()
        assert downloads[2].split() == [
            "fraud", "2.5.0", "45%", "45.0", "MiB", "of", "100.0", "MiB",
        ]  # fmt: skip
        wide = edgectl(config, "get", "device", "cam-9", "-o", "wide").stdout.splitlines()
        assert wide[0].split()[-1] == "DOWNLOADS" and wide[1].split()[-1] == "fraud:45%"
        doc = orjson.loads(edgectl(config, "get", "device", "cam-9", "-o", "json").stdout)
        assert doc["status"]["workloads"]["fraud"]["revisions"][0]["download"] == {
            "bytesDone": 47_185_920, "bytesTotal": 104_857_600,
        }  # fmt: skip
    finally:
        edgectl(config, "delete", "device", "cam-9")
