"""A device that speaks Sync from the test: a real gRPC client with the certificate and key
``edged enroll`` wrote, over mutual TLS to a real hub process; not edged. The test decides
when it connects and when it goes silent (edged reconnects on a jittered backoff), so hub
scenarios that turn on device timing are exact. While connected it sends a Heartbeat every
``interval`` seconds and keeps the last desired state the hub sent it; disconnected, it tries
again every :data:`RETRY` seconds (as soon as the hub listens)."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import orjson
from fleet import HubProcess, enroll

from edgefleet.v1 import device_pb2, device_pb2_grpc
from edgefleet.versioning import installed_version

RETRY = 0.2


def enrolled(hub: HubProcess, tmp_path: Path, name: str, labels: dict[str, str]) -> SyncDevice:
    """A device enrolled with ``edged enroll`` (labels set at enrollment), not connected yet."""
    data = tmp_path / name
    out = enroll(hub, data, name, labels)
    assert out.returncode == 0, out.stdout + out.stderr
    return SyncDevice(data, name, hub.address, labels)


class SyncDevice:
    def __init__(
        self,
        data: Path,
        name: str,
        address: str,
        labels: dict[str, str],
        *,
        interval: float = 0.5,
    ) -> None:
        self.name = name
        self.address = address
        self.labels = labels
        self.interval = interval
        self._creds = grpc.ssl_channel_credentials(
            (data / "hub" / "ca.crt").read_bytes(),
            (data / "identity" / "key.pem").read_bytes(),
            (data / "hub" / "device.crt").read_bytes(),
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._call: grpc.Future | None = None
        self.connected = threading.Event()
        self.desired: device_pb2.DesiredState | None = None  # the last one received

    def connect(self) -> SyncDevice:
        assert self._thread is None, "already connecting"
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"sync-{self.name}", daemon=True)
        self._thread.start()
        return self

    def disconnect(self) -> None:
        """Go silent now (the stream is cancelled; no retry)."""
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        if self._thread is not None:
            self._thread.join(10)
        self._thread = None
        self.connected.clear()

    def _messages(self):  # type: ignore[no-untyped-def]
        hello = device_pb2.Hello(
            edged_version=installed_version(), device_name=self.name, labels=self.labels
        )
        yield device_pb2.DeviceMessage(hello=hello)
        while not self._stop.wait(self.interval):
            yield device_pb2.DeviceMessage(heartbeat=device_pb2.Heartbeat())

    def _run(self) -> None:
        while not self._stop.is_set():
            with grpc.secure_channel(self.address, self._creds) as channel:
                call = device_pb2_grpc.DeviceServiceStub(channel).Sync(self._messages())
                self._call = call
                try:
                    for message in call:
                        self.connected.set()
                        if message.HasField("desired_state"):
                            self.desired = message.desired_state
                except grpc.RpcError:  # the stream ended (hub gone, or cancelled): connect again
                    pass
                finally:
                    self.connected.clear()
                    self._call = None
            self._stop.wait(RETRY)

    def deployments(self) -> set[str]:
        """The deployments of the last desired state received (by metadata.name)."""
        if self.desired is None:
            return set()
        names = set()
        for raw in self.desired.manifests:
            doc = orjson.loads(raw)
            if doc.get("kind") == "ModelDeployment":
                names.add(doc["metadata"]["name"])
        return names
