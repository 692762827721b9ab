"""The kinds the hub makes and only shows (``Device``, ``Model``, ``BootstrapToken``,
``Region``, ``Event``), and the ``status`` the hub adds to an applied ``SecurityBaseline``:
their fields for ``edgectl explain``. No reader reads these (nobody applies them), so the schema is
written here, once; ``tests/api/test_explaining.py`` checks it against the documents a real
hub shows (every field the hub shows is here, and nothing here is never shown). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgefleet.api.meta import API_VERSION

Node = tuple[str, str, Mapping[str, Any]]
"""(kubectl's type word, description, fields)."""


def _o(description: str, /, **fields: Node) -> Node:
    return ("<Object>", description, fields)


def _list(description: str, /, **fields: Node) -> Node:
    return ("<[]Object>", description, fields)


def _map(description: str, /, **fields: Node) -> Node:
    """A map from names (of workloads, files...) to objects of ``fields``."""
    return ("<map[string]Object>", description, fields)


def _s(description: str) -> Node:
    return ("<string>", description, {})


def _i(description: str) -> Node:
    return ("<integer>", description, {})


def _n(description: str) -> Node:
    return ("<number>", description, {})


def _b(description: str) -> Node:
    return ("<boolean>", description, {})


def _strings(description: str) -> Node:
    return ("<[]string>", description, {})


def _labels(description: str) -> Node:
    return ("<map[string]string>", description, {})


def _any(description: str) -> Node:
    return ("<map[string]value>", description, {})


_TIME = " (RFC 3339, UTC)."
_CONDITION = dict(
    type=_s("The condition's type (Ready, Available, Compliant...)."),
    status=_s("True, False or Unknown."),
    reason=_s("One word (CamelCase) saying why."),
    message=_s("What happened, for people."),
)


def _metadata(name: str, labels: bool) -> Node:
    listed = {"labels": _labels("Labels to select the object by (edgectl get -l).")}
    return _o(
        "The object's name" + (", labels" if labels else "") + " and the hub's bookkeeping.",
        name=_s(name),
        **(listed if labels else {}),
        creationTimestamp=_s("When the hub made it" + _TIME),
        uid=_s("Unique while the object exists; new if it is deleted and made again."),
        resourceVersion=_s("The store revision of its last change."),
    )


def _top(description: str, name: str, *, labels: bool = False, **fields: Node) -> Node:
    return _o(
        description,
        apiVersion=_s(f'The API version of the object: "{API_VERSION}".'),
        kind=_s("The kind of the object."),
        metadata=_metadata(name, labels),
        **fields,
    )


_REVISION = _list(
    "Each revision of the workload on the device (the one wanted, and during a switch, the "
    "one still serving).",
    modelVersion=_s("The model version of this revision."),
    sha256=_s("The artifact's digest."),
    phase=_s("Pending, Downloading, Verifying, Refused, Loading, Ready, Failed or Draining."),
    readyReplicas=_i("Replicas of this revision ready to serve."),
    revision=_s("The revision hash edged computed."),
    reason=_s("Why it is in this phase (a refusal, a failure)."),
    message=_s("The reason, for people."),
    wanted=_b("Whether this is the revision the device is asked to run."),
    metrics=_o(
        "What its workers answered (the canary analysis reads these).",
        requests=_i("Requests answered since it started serving."),
        errors=_i("Of which errors."),
        latencyP95Seconds=_n("p95 latency over the device's recent window, seconds."),
        windowRequests=_i("Requests in that window."),
    ),
    validation=_o(
        "Its accuracy on the validation set the artifact ships (computed when it started).",
        accuracy=_n("The share of validation samples answered right (0 to 1)."),
        samples=_i("Validation samples evaluated."),
        reason=_s("Why no accuracy could be computed, if none was."),
        message=_s("The reason, for people."),
    ),
    download=_o(
        "Its artifact's download, while it comes.",
        bytesDone=_i("Bytes received."),
        bytesTotal=_i("Bytes to receive."),
    ),
)

DEVICE = _top(
    "An enrolled device: made by enrollment, updated from what it reports on its Sync "
    "stream. Read-only, except its labels (edgectl label) and cordon.",
    "The name the device enrolled under.",
    labels=True,
    spec=_o(
        "What the operator set on the device.",
        labels=_labels("Labels set by the operator (edgectl label); they win over reported ones."),
        cordoned=_b("No new deployment is placed on it (edgectl devices cordon)."),
    ),
    status=_o(
        "What the device reports and what the hub concluded.",
        phase=_s("Pending (never connected), Ready (heartbeats arrive) or NotReady."),
        revoked=_b("Its certificate is revoked: it may not connect."),
        health=_o(
            "Its DeviceHealthPolicy verdict, as it reports it.",
            schedulable=_b("Within every bound of its health policy."),
            reasons=_strings("The bounds it is outside of."),
        ),
        attestation=_o(
            "The hub's verdict on its attestation evidence.",
            state=_s("Unknown, Trusted or Untrusted."),
            reasons=_strings("Why it is not Trusted."),
            verifiedAt=_s("When evidence was last verified" + _TIME),
            challengedAt=_s("When it was last asked for evidence" + _TIME),
        ),
        facts=_any("What edged found on the device: CPUs, memory, accelerators, providers..."),
        reportedLabels=_labels("Labels the device reported (within its token's allowance)."),
        lastHeartbeat=_s("The last message on its Sync stream" + _TIME),
        enrolledAt=_s("When it enrolled" + _TIME),
        certificateSerial=_s("The serial of its current client certificate (hex)."),
        agentVersion=_s('The edged version its last Hello stated ("": not connected yet).'),
        agentRefused=_s(
            "Why the hub refuses that version (AgentVersionOutsideWindow: the window it "
            'accepts); "": accepted.'
        ),
        agent=_o(
            "Its last agent report (null before the first): where it stands in an AgentUpgrade.",
            version=_s("The edged version running."),
            committedVersion=_s("The version it goes back to (its committed slot or package)."),
            phase=_s(
                "Idle, Downloading, Verifying, Installing, SmokeTesting, Switching, Trying, "
                "Committed, RolledBack or Failed."
            ),
            desiredVersion=_s('The version the hub sends it ("": none).'),
            reason=_s("Why it rolled back or failed (CrashLoop, CommitDeadlineExceeded...)."),
            message=_s("The reason in words."),
            tries=_i("Starts of the release on trial."),
            slot=_s('The slot it runs from: a, b, or "package" (the base install).'),
            arch=_s("Its architecture (x86_64, aarch64...)."),
            pythonAbi=_s("Its CPython ABI (cp311...)."),
            launcher=_b("It runs under edged-launcher (it can update itself)."),
            upgrade=_s("The AgentUpgrade the report is about."),
            upgradeRevision=_i("That upgrade's revision."),
            changedAt=_n("When its phase last changed (seconds since the epoch)."),
            bytesDone=_i("Bytes of the release downloaded so far."),
            bytesTotal=_i("The release's size in bytes."),
        ),
        generationAcked=_i("The newest desired-state generation it acknowledged."),
        generationDesired=_i("The generation of the desired state the hub holds for it."),
        deployments=_strings("The deployments placed on it."),
        workloads=_map(
            "Its workloads by name, as it reports them.",
            modelVersion=_s("The model version it runs (or is moving to)."),
            revision=_s("The revision hash edged computed for the running spec."),
            desiredReplicas=_i("Replicas it should run."),
            readyReplicas=_i("Replicas ready to serve."),
            phase=_s("Ready, Stopped, Progressing, or the reason of a false condition."),
            conditions=_list("The workload's conditions.", **_CONDITION),
            revisions=_REVISION,
            sizing=_any("Autoscaling, eviction and batching decisions (spec.scaling)."),
            sandboxes=("<[]map[string]value>", "Per replica, the protections in force.", {}),
        ),
        taints=_list(
            "Taints the hub puts on it (cordoned, not ready, untrusted, revoked...).",
            key=_s("The taint's key."),
            value=_s("The taint's value, if any."),
            effect=_s("NoSchedule or NoExecute."),
            reason=_s("Why the device carries it."),
        ),
        compliance=_o(
            "Its drift report against the SecurityBaselines (null: never reported).",
            checked=_b("Whether it has checked once."),
            compliant=_b("No finding, and not quarantined (null until checked)."),
            action=_s(
                "The baselines' drift action in force: alert, restartWorkload or quarantine."
            ),
            findings=_list(
                "What differs from what edged made (the Compliant condition's reasons).",
                kind=_s(
                    "ArtifactAdded, ArtifactChanged, ConfigChanged, StrayProcess, "
                    "ModelFileOpened or ListeningSocket."
                ),
                subject=_s("A path, or a pid."),
                message=_s("What was found, for people."),
            ),
            quarantined=_s("Why the device is quarantined (null: it is not)."),
            processesChecked=_b("Whether edged could check its cgroup's processes."),
            opensWatched=_b(
                "Whether the kernel reports each open of a model file to edged (fanotify; "
                "null: the device did not say)."
            ),
            opensWatchReason=_s("Why opens are not watched (null: they are)."),
        ),
        notRunning=_labels("Why each deployment it does not run is not there."),
    ),
)

MODEL = _top(
    "An artifact pushed with edgectl models push: the model file and its signed metadata, "
    "named NAME-VERSION. Read-only; the hub never re-signs it.",
    "NAME-VERSION of the artifact.",
    spec=_o(
        "The model it is.",
        name=_s("The model's name (--name)."),
        version=_s("The model's version (--version)."),
    ),
    status=_o(
        "What the hub stored.",
        sha256=_s("The model file's digest."),
        length=_i("The model file's size in bytes."),
        pushedAt=_s("When it was pushed" + _TIME),
        signedMetadata=_s("The publisher-signed metadata envelope, base64, exactly as signed."),
        extras=_labels("Extra files (a validation set) by name -> their sha256."),
        rollbackAllowance=_s("A signed rollback allowance for this version, base64."),
    ),
)

TOKEN = _top(
    "A token devices enroll with (edgectl tokens create); its secret is never shown.",
    "The token's id (the part before the dot).",
    spec=_o(
        "What the token allows.",
        description=_s("What it is for."),
        expires=_s("When it stops working" + _TIME),
        singleUse=_b("Whether one enrollment uses it up."),
        deviceLabels=_labels("Labels every device enrolled with it gets."),
        allowOwnLabels=_b("Whether a device may add labels of its own."),
        ownLabelPrefix=_s("The only prefix of the device's own label keys (empty: any)."),
    ),
    status=_o("Its use.", used=_s("When it was used up (null: not yet)" + _TIME)),
)

REGION = _top(
    "A regional hub enrolled at this (root) hub (docs/federation.md): its link and a summary "
    "of its last report. Read-only: made by enrolling the region (hub init --parent), ended "
    "with edgectl regions revoke.",
    "The region's name.",
    status=_o(
        "What this hub knows of the region now.",
        connected=_b(
            "Streaming to this hub, or to another replica that vouched for it within 30 s."
        ),
        replica=_s("The root replica it streams to, or last streamed to (null: never)."),
        streamsHere=_b("Whether it streams to the replica that answered."),
        connectedAt=_s("When that stream opened" + _TIME),
        lastSeenAt=_s("When that replica last heard from it, or vouched for its stream" + _TIME),
        reportedAt=_s("When its last report was received (null: none yet)" + _TIME),
        reportAgeSeconds=_n("The age of that report when shown, seconds."),
        devices=_o(
            "Its devices, as its last report counts them (null: no report yet).",
            total=_i("Devices enrolled at the region."),
            ready=_i("Of which Ready (heartbeats arrive)."),
            byPhase=("<map[string]integer>", "Devices by phase (Pending, Ready, NotReady).", {}),
        ),
        deployments=_i("Deployments its last report has figures for (null: no report yet)."),
        generationApplied=_i("The newest slice generation it acknowledged (null: unknown)."),
        agentUpgrades=_map(
            "The region's AgentUpgrades by name, as its last report says them, bounded "
            "(docs/agent-updates.md).",
            version=_s("The edged version it rolls out."),
            phase=_s("Pending, Progressing, Paused, Complete or RolledBack."),
            revision=_i("Its revision, in the region's numbering."),
            reason=_s("Why it is where it is, one word."),
            message=_s("The same, in words."),
            poolDevices=_i("The region's devices in its rollout."),
            doneDevices=_i("Of which came back healthy on the version."),
            updatingDevices=_i("Of which are being updated."),
            failedCount=_i("Devices that failed it."),
            failedDevices=_labels("Failed devices and their reasons, at most 20."),
            rootRevision=_i("The root's revision of it, when the root sent it in waves."),
        ),
        agentReleases=_strings("The edged release versions the region's hub holds, at most 64."),
        agentReleaseRefusals=_labels(
            "Edged versions whose release from the root the region refused, and why (a check "
            "a push would fail), at most 16."
        ),
        generationSent=_i(
            "The generation of the slice this replica last sent it (null: it does not stream here)."
        ),
        certificate=_o(
            "Its federation certificate.",
            serial=_s("The current certificate's serial (hex)."),
            previousSerial=_s(
                "The certificate its last renewal was asked with, still accepted (null: none)."
            ),
            notAfter=_s(
                "When the current certificate expires (null: enrolled at an older root)" + _TIME
            ),
        ),
    ),
)

EVENT = _o(
    "Something that happened to an object, recorded by the hub (edgectl get events). "
    "Read-only; the newest are kept.",
    type=_s("Normal or Warning."),
    reason=_s("One word (CamelCase) saying what happened."),
    message=_s("What happened, for people."),
    object=_o(
        "The object it happened to.",
        kind=_s("Its kind."),
        name=_s("Its name."),
    ),
    time=_s("When (RFC 3339, UTC, to the millisecond)."),
)

BASELINE_STATUS = _o(
    "Shown by the hub: the fleet's compliance (every baseline applies fleet-wide).",
    devices=_o(
        "Devices by their latest drift report.",
        compliant=_i("Checked, no finding, not quarantined."),
        drifted=_i("With findings, or quarantined."),
        unknown=_i("Not checked yet, or never reported."),
        quarantined=_i("Quarantined (counted in drifted too)."),
    ),
    findingKinds=("<map[string]integer>", "Drifted devices by the kind of their findings.", {}),
)

SHOWN: Mapping[str, Node] = {
    "Device": DEVICE,
    "Model": MODEL,
    "BootstrapToken": TOKEN,
    "Region": REGION,
    "Event": EVENT,
}
"""The kinds only the hub makes, by kind."""

STATUS: Mapping[str, Node] = {"SecurityBaseline": BASELINE_STATUS}
"""``status`` the hub adds to applied kinds that have no status of their own in a reader."""
