"""A Secret follows only the labels no device chose (hub/decide/labeltrust.py), over real gRPC with
mutual TLS into a real SQLite store: the attack of issue 29 item 8.

Devices enrolled through the real Enroll RPC with a token labelled ``pool=lab`` claim
``site=retail`` (one in its Hello, one at enrollment) and are never sent the ``site=retail``
deployment's Secret, while a device whose token says ``site=retail`` gets it and opens it with
its identity key. The rule as tables: ``test_hub_labeltrust.py``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import orjson
from asynctesting import async_test, eventually
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from hubserving import AdminHub, make_hub_dir

from edged.trust.identity import load_or_create_identity
from edgefleet.sealing import SealedForDevice, open_from_hub
from edgefleet.v1 import admin_pb2, device_pb2, device_pb2_grpc, enrollment_pb2, enrollment_pb2_grpc
from edgefleet.versioning import installed_version
from hub.state import storekeys, tokens

VALUE = "retail-till-key-" + "7" * 16
SECRET = {"apiVersion": "edgefleet.io/v1", "kind": "Secret", "metadata": {"name": "till"},
          "spec": {"stringData": {"token": VALUE}}}  # fmt: skip


def deployment(
    name: str = "pos", *, secrets: bool = True, model: str = "m", **placement: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": model, "version": "1.0.0"},
        "placement": placement or {"nodeSelector": {"site": "retail"}},
    }
    if secrets:
        spec["secrets"] = [{"name": "till", "mountPath": "/run/secrets/till"}]
    return {"apiVersion": "edgefleet.io/v1", "kind": "ModelDeployment",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


class EnrolledDevice:
    """A device enrolled through the real Enroll RPC, then syncing with its own certificate;
    every desired state the hub sends it is kept."""

    def __init__(self, name: str, key: Any, creds: grpc.ChannelCredentials) -> None:
        self.name, self.key, self.creds = name, key, creds
        self.states: list[device_pb2.DesiredState] = []

    def opened(self) -> dict[str, bytes]:
        """Every secret value it was sent, opened with its identity key."""
        out: dict[str, bytes] = {}
        for state in self.states:
            for s in state.secrets:
                sealed = SealedForDevice(
                    s.name, s.version, s.ephemeral_public_key, s.nonce, s.ciphertext
                )
                values = open_from_hub(
                    lambda peer: self.key.exchange(ec.ECDH(), peer),
                    self.key.public_key(),
                    self.name,
                    sealed,
                )
                out.update({f"{s.name}/{k}": v for k, v in values.items()})
        return out

    async def sync(self, port: int, labels: dict[str, str], stop: asyncio.Event) -> None:
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", self.creds) as ch:
            call = device_pb2_grpc.DeviceServiceStub(ch).Sync()
            hello = device_pb2.Hello(
                edged_version=installed_version(), device_name=self.name, labels=labels
            )
            await call.write(device_pb2.DeviceMessage(hello=hello))
            reading = asyncio.ensure_future(self._read(call))
            await stop.wait()
            reading.cancel()
            call.cancel()

    async def _read(self, call: Any) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            if msg.WhichOneof("message") == "desired_state":
                self.states.append(msg.desired_state)
                ack = device_pb2.Ack(generation=msg.desired_state.generation)
                await call.write(device_pb2.DeviceMessage(ack=ack))


async def _enroll(
    hub: AdminHub, tmp_path: Path, name: str, token: str, labels: dict[str, str] | None = None
) -> EnrolledDevice:
    identity = load_or_create_identity(tmp_path / name, tpm="off")
    try:
        csr = identity.build_csr(name)
    finally:
        identity.close()
    ca = hub.paths.ca_certificate.read_bytes()
    async with grpc.aio.secure_channel(
        f"127.0.0.1:{hub.enroll_port}", grpc.ssl_channel_credentials(ca)
    ) as ch:
        resp = await enrollment_pb2_grpc.EnrollmentServiceStub(ch).Enroll(
            enrollment_pb2.EnrollRequest(token=token, csr_pem=csr, name=name, labels=labels),
            timeout=10,
        )
    pem = (tmp_path / name / "identity" / "key.pem").read_bytes()
    creds = grpc.ssl_channel_credentials(ca, pem, bytes(resp.certificate_chain_pem))
    return EnrolledDevice(name, load_pem_private_key(pem, None), creds)


@async_test
async def test_a_device_never_gets_a_secret_through_labels_it_gave_itself(tmp_path: Path) -> None:
    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        now = time.time()
        lab, _ = await tokens.create_token(hub.ctx.store, now=now, ttl=600, labels={"pool": "lab"})
        retail, _ = await tokens.create_token(
            hub.ctx.store, now=now, ttl=600, labels={"site": "retail"}
        )
        # claims site=retail (and pool=retail over its token's pool=lab) in its Hello
        liar = await _enroll(hub, tmp_path, "s1-x", lab)
        # asks for site=retail at enrollment (the token lets devices add labels: the default)
        asker = await _enroll(hub, tmp_path, "s1-y", lab, {"site": "retail"})
        honest = await _enroll(hub, tmp_path, "s1-z", retail)
        for model in ("m", "m2"):  # one model name per device (hub.decide.modelclaim)
            hub.ctx.cache.models[(model, "1.0.0")] = storekeys.ModelRecord(
                model, "1.0.0", "ab" * 32, 1, b"{signed}", 1.0
            )
        stop = asyncio.Event()
        syncing = [
            asyncio.ensure_future(liar.sync(hub.port, {"site": "retail", "pool": "retail"}, stop)),
            asyncio.ensure_future(asker.sync(hub.port, {"site": "retail"}, stop)),
            asyncio.ensure_future(honest.sync(hub.port, {}, stop)),
        ]
        try:
            await eventually(lambda: all(d.states for d in (liar, asker, honest)), within=10)
            selecting_pool = deployment("pool-retail", model="m2", nodeSelector={"pool": "retail"})
            applied = await stub.Apply(
                admin_pb2.ApplyRequest(
                    documents=[orjson.dumps(d) for d in (SECRET, deployment(), selecting_pool)]
                )
            )

            # the honest path: its token says site=retail, it opens the secret
            await eventually(lambda: honest.opened() == {"till/token": VALUE.encode()}, 10)

            async def not_running(name: str) -> dict[str, str]:
                got = await stub.Get(admin_pb2.GetRequest(kind="Device", name=name))
                shown: dict[str, str] = orjson.loads(got.json)["status"]["notRunning"]
                return shown

            # the hub settles on each self-labelled device (left out, or sent the secret)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                settled = [
                    ("pos" in await not_running(d.name) or d.opened()) for d in (liar, asker)
                ]
                if all(settled):
                    break
                await asyncio.sleep(0.05)
            assert liar.opened() == {}, "the device opened a secret through its Hello's labels"
            assert asker.opened() == {}, "the device opened a secret through its enrollment label"
            reason = (await not_running("s1-x"))["pos"]
            assert "only through labels it chose" in reason, reason
            assert "site='retail' reported by the device itself" in reason, reason
            reason = (await not_running("s1-y"))["pos"]
            assert "site='retail' asked for by the device at enrollment" in reason, reason
            # a Hello never changes a label its token set: pool stays lab
            assert hub.ctx.cache.devices["s1-x"].all_labels()["pool"] == "lab"
            assert "does not match" in (await not_running("s1-x"))["pool-retail"]

            got = await stub.Get(admin_pb2.GetRequest(kind="ModelDeployment", name="pos"))
            conditions = {c["type"]: c for c in orjson.loads(got.json)["status"]["conditions"]}
            delivered = conditions["SecretsDelivered"]
            assert delivered["status"] == "False" and delivered["reason"] == "DeviceChosenLabels"
            assert delivered["message"].startswith("not sent to s1-x, s1-y: secret till")
            assert all(not s.secrets for d in (liar, asker) for s in d.states)
            # and the apply said so at once
            warnings = " ".join(w for r in applied.results for w in r.warnings)
            assert "not sent to s1-x, s1-y: secret till" in warnings
        finally:
            stop.set()
            await asyncio.gather(*syncing, return_exceptions=True)
