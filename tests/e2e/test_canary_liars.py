"""One lying device must not decide a canary (issue 29, item 1), on real processes: a real
``hub serve``, ``edgectl`` against it, and four devices enrolled through the real Enroll RPC
that speak the real Sync stream over mutual TLS with their own certificates. The devices are
simulated (no edged, no workers): each reports, for the revision it was given, counters that
grow every report, the way edged's status does; honest ones at 0% errors on 1.0.0 and 50% on
the bad versions; one lies.

Setup as the issue found it: steps ``[25%, pause, 100%]``, ``maxErrorRateIncrease: 0.05``,
``minRequests: 20``; four devices, so the first step is one canary device (dev-0).

* a stable device (dev-3) reports requests = errors, 2^40 more per report: a sum made the
  stable error rate ~100%, step 1 passed and every device got the bad revision. Now dev-3 is
  left out (named in an ``AnalysisExcluded`` event) and the canary fails at step 1;
* the canary device (dev-0) reports 2^40 more requests and no errors: a sum passed every step
  and the rollout was Complete with every device on the bad revision. Now dev-0 is left
  out, the analysis waits, and ``progressDeadlineSeconds`` rolls it back; never Complete.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import orjson
from fleet import HubProcess

from edged.trust.identity import load_or_create_identity
from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.v1 import device_pb2, device_pb2_grpc, enrollment_pb2, enrollment_pb2_grpc
from edgefleet.versioning import installed_version
from hub.initializing import HubPaths

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: det}}
spec:
  model: {{name: det, version: "{version}"}}
  replicas: {{perDevice: 1}}
  rollout:
    maxSurge: 0
    maxUnavailable: 1
    progressDeadlineSeconds: {deadline}
    canary:
      steps: ["25%", {{pause: {{duration: 1s}}}}, "100%"]
      analysis: {{maxErrorRateIncrease: 0.05, minRequests: 20, window: 3s}}
"""
DEVICES = [f"dev-{i}" for i in range(4)]
BIG = 2**40
REPORT_EVERY = 0.3

# (device, version) -> what it adds to its counters per report: (requests, errors)
Lies = dict[tuple[str, str], tuple[int, int]]


def honest(version: str) -> tuple[int, int]:
    return (10, 0) if version == "1.0.0" else (10, 5)  # the new versions fail half


class Device:
    """A device on the real Sync stream: acks each desired state, and reports every
    :data:`REPORT_EVERY` seconds the revision of ``det`` it was given, serving, with its
    counters since it started serving it."""

    def __init__(self, name: str, creds: grpc.ChannelCredentials, address: str) -> None:
        self.name = name
        self.channel = grpc.aio.secure_channel(address, creds)
        self.version = ""
        self.generation = 0
        self.counters: dict[str, tuple[int, int]] = {}

    async def run(self, lies: Lies, stop: asyncio.Event) -> None:
        call = device_pb2_grpc.DeviceServiceStub(self.channel).Sync()
        await call.write(
            device_pb2.DeviceMessage(
                hello=device_pb2.Hello(
                    edged_version=installed_version(), device_name=self.name, labels={"site": "a"}
                )
            )
        )
        reader = asyncio.create_task(self._read(call))
        try:
            while not stop.is_set():
                await call.write(device_pb2.DeviceMessage(status=self._status(lies)))
                await call.write(device_pb2.DeviceMessage(heartbeat=device_pb2.Heartbeat()))
                try:
                    await asyncio.wait_for(stop.wait(), REPORT_EVERY)
                except TimeoutError:  # not stopped: report again
                    pass
        finally:
            reader.cancel()
            call.cancel()
            await self.channel.close()

    async def _read(self, call: Any) -> None:
        async for msg in call:
            if msg.WhichOneof("message") != "desired_state":
                continue
            state = msg.desired_state
            for raw in state.manifests:
                doc = orjson.loads(raw)
                if doc.get("kind") == "ModelDeployment" and doc["metadata"]["name"] == "det":
                    self.version = doc["spec"]["model"]["version"]
            self.generation = state.generation
            await call.write(
                device_pb2.DeviceMessage(ack=device_pb2.Ack(generation=state.generation))
            )

    def _status(self, lies: Lies) -> device_pb2.Status:
        workloads = []
        version = self.version
        if version:
            add = lies.get((self.name, version), honest(version))
            requests, errors = self.counters.get(version, (0, 0))
            requests, errors = requests + add[0], errors + add[1]
            self.counters[version] = (requests, errors)
            revision = device_pb2.RevisionStatus(
                model_version=version,
                phase="Ready",
                ready_replicas=1,
                wanted=True,
                metrics=device_pb2.RevisionMetrics(requests=requests, errors=errors),
            )
            workloads.append(
                device_pb2.WorkloadStatus(
                    name="det",
                    model_version=version,
                    ready_replicas=1,
                    desired_replicas=1,
                    revisions=[revision],
                )
            )
        return device_pb2.Status(
            workloads=workloads, observed_generation=self.generation, labels={"site": "a"}
        )


def enroll(hub: HubProcess, tmp_path: Path, name: str) -> grpc.ChannelCredentials:
    """Enrolled through the real Enroll RPC with a token from ``hub token create``."""
    token, _ = hub.token()
    identity = load_or_create_identity(tmp_path / name, tpm="off")
    try:
        csr = identity.build_csr(name)
    finally:
        identity.close()
    ca = HubPaths.of(hub.data).ca_certificate.read_bytes()
    with grpc.secure_channel(f"127.0.0.1:{hub.port + 1}", grpc.ssl_channel_credentials(ca)) as ch:
        resp = enrollment_pb2_grpc.EnrollmentServiceStub(ch).Enroll(  # type: ignore[no-untyped-call]
            enrollment_pb2.EnrollRequest(token=token, csr_pem=csr, name=name), timeout=30
        )
    key = (tmp_path / name / "identity" / "key.pem").read_bytes()
    return grpc.ssl_channel_credentials(ca, key, bytes(resp.certificate_chain_pem))


def apply(hub: HubProcess, tmp_path: Path, version: str, deadline: int = 60) -> None:
    """``deadline``: progressDeadlineSeconds, long enough for the analysis to decide on a
    loaded machine; short where the test waits for it (the analysis never decides)."""
    doc = tmp_path / f"det-{version}.yaml"
    doc.write_text(DEPLOYMENT.format(version=version, deadline=deadline))
    hub.edgectl("apply", "-f", str(doc))


def rollout(hub: HubProcess) -> dict[str, Any]:
    got = json.loads(hub.edgectl("get", "deployments", "det", "-o", "json").stdout)
    return dict(got.get("status", {}).get("rollout") or {})


def events(hub: HubProcess) -> list[dict[str, Any]]:
    out = hub.edgectl("get", "events", "--for", "ModelDeployment/det", "-o", "json").stdout
    return list(json.loads(out)["items"])


async def until(
    check: Callable[[], Awaitable[dict[str, Any] | None]], within: float, what: str
) -> list[dict[str, Any]]:
    """Every rollout status seen until ``check`` returns one it accepts (that one last)."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = await check()
        if got is not None:
            seen.append(got)
            if got.get("done"):
                return seen
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what} within {within} s; last seen: {seen[-1:]}")


def test_one_lying_device_decides_no_canary(hub: HubProcess, tmp_path: Path) -> None:
    for seed, version in enumerate(("1.0.0", "2.0.0", "3.0.0"), 1):
        model = build_mlp(tmp_path / f"det-{version}.onnx", TINY_MLP, seed=seed)
        out = hub.edgectl("models", "push", str(model), "--name", "det", "--version", version)
        assert "pushed" in out.stdout, out.stdout + out.stderr
    creds = {name: enroll(hub, tmp_path, name) for name in DEVICES}
    lies: Lies = {}
    asyncio.run(scenario(hub, tmp_path, creds, lies))


async def scenario(
    hub: HubProcess, tmp_path: Path, creds: dict[str, grpc.ChannelCredentials], lies: Lies
) -> None:
    stop = asyncio.Event()
    devices = [Device(name, creds[name], hub.address) for name in DEVICES]
    tasks = [asyncio.create_task(d.run(lies, stop)) for d in devices]

    async def status(done: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        got = await asyncio.to_thread(rollout, hub)
        return {**got, "done": done(got)}

    try:
        await asyncio.to_thread(apply, hub, tmp_path, "1.0.0")  # everywhere at once
        await until(
            lambda: status(lambda r: r.get("phase") == "Complete"), 120, "1.0.0 on every device"
        )
        assert {d.version for d in devices} == {"1.0.0"}

        # 1. a stable device reports requests = errors, 2^40 more each time
        lies[("dev-3", "1.0.0")] = (BIG, BIG)
        await asyncio.to_thread(apply, hub, tmp_path, "2.0.0")
        seen = await until(
            lambda: status(lambda r: r.get("phase") in ("RolledBack", "Complete")),
            120,
            "the rollout of 2.0.0 to end",
        )
        final = seen[-1]
        assert max(r.get("updatedDevices", 0) for r in seen) <= 1, seen  # only the canary
        assert (final["phase"], final.get("reason")) == ("RolledBack", "AnalysisFailed"), final
        assert "step 1 of 3 (25%)" in final["message"], final
        assert "above maxErrorRateIncrease 5.00%" in final["message"], final
        got = await asyncio.to_thread(events, hub)
        excluded = [e["message"] for e in got if e["reason"] == "AnalysisExcluded"]
        assert any(m.startswith("device dev-3 is left out") for m in excluded), excluded
        assert not [e for e in got if e["reason"] == "CanaryStepPassed"], got

        # 2. the canary device reports 2^40 more requests and no errors
        lies[("dev-0", "3.0.0")] = (BIG, 0)
        await asyncio.to_thread(apply, hub, tmp_path, "3.0.0", 20)
        seen = await until(
            lambda: status(
                lambda r: (
                    "3.0.0" in r.get("message", "") and r.get("phase") in ("RolledBack", "Complete")
                )
            ),
            120,
            "the rollout of 3.0.0 to end",
        )
        final = seen[-1]
        assert final["phase"] == "RolledBack", final  # never Complete
        assert max(r.get("updatedDevices", 0) for r in seen if "3.0.0" in r.get("message", "")) <= 1
        got = await asyncio.to_thread(events, hub)
        excluded = [e["message"] for e in got if e["reason"] == "AnalysisExcluded"]
        assert any(m.startswith("device dev-0 is left out") for m in excluded), excluded
        assert not [e for e in got if e["reason"] == "CanaryStepPassed"], got
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
