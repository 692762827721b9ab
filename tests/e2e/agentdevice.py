"""A simulated device that updates its edged as the hub asks (issue 32): a :class:`SyncDevice`
(real gRPC, real mTLS, a real hub process) that reports ``Status.agent`` as edged under the
A/B launcher would, and acts on ``DesiredState.agent`` the way a device's launcher does,
without installing anything:

* ``good``: a desired release other than the committed one is tried (``Trying``, the new
  version), then the device reconnects with a Hello of the new version and reports it
  ``Committed`` for the upgrade and revision it was sent;
* ``crash``: the trial fails and the launcher goes back by itself: ``RolledBack`` with the
  reason ``CrashLoop``, still running the committed release;
* ``silent``: the device goes quiet once it is sent a release (it never comes back);
* ``hold``: the device does not act on the release yet (a slow download).

The desired state's absence of ``agent`` leaves the device on its committed release.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

from fleet import HubProcess, enroll
from syncdevice import SyncDevice

from edgefleet.v1 import device_pb2

ARCH, ABI = "x86_64", "cp311"


class AgentDevice(SyncDevice):
    def __init__(
        self, data: Path, name: str, address: str, labels: dict[str, str], *, version: str
    ) -> None:
        super().__init__(data, name, address, labels, interval=0.2)
        self.version = version
        self.committed = version
        self.behaviour = "good"
        self.phase = "Idle"
        self.reason = ""
        self.message = ""
        self.upgrade = ""
        self.upgrade_revision = 0
        self.tried: set[tuple[str, int, str]] = set()  # (upgrade, revision, version) acted on
        self.lock = threading.Lock()
        self.reconnect = threading.Event()
        self.reported = threading.Event()  # its first Status (with its agent report) is sent

    def claim(self, **fields: object) -> None:
        """Report these fields whatever happened (a lying device)."""
        with self.lock:
            for name, value in fields.items():
                assert hasattr(self, name), name
                setattr(self, name, value)

    def agent_status(self) -> device_pb2.AgentStatus:
        with self.lock:
            return device_pb2.AgentStatus(
                version=self.version,
                committed_version=self.committed,
                phase=self.phase,
                reason=self.reason,
                message=self.message,
                slot="a",
                arch=ARCH,
                python_abi=ABI,
                launcher=True,
                upgrade=self.upgrade,
                upgrade_revision=self.upgrade_revision,
                desired_version=self.desired_agent_version(),
            )

    def desired_agent_version(self) -> str:
        """What the hub asks for now, as edged reports it (desiredVersion)."""
        d = self.desired
        return d.agent.version if d is not None and d.HasField("agent") else ""

    def _act(self) -> None:
        """What the launcher does with the desired release (one transition per call)."""
        desired = self.desired
        agent = desired.agent if desired is not None and desired.HasField("agent") else None
        if agent is None:
            return
        key = (agent.upgrade, agent.upgrade_revision, agent.version)
        with self.lock:
            if self.behaviour == "hold" or key in self.tried or agent.version == self.committed:
                return
            self.tried.add(key)
            self.upgrade, self.upgrade_revision = agent.upgrade, agent.upgrade_revision
            if self.behaviour == "silent":
                self._stop.set()  # never heard from again
                return
            if self.behaviour == "crash":
                self.phase, self.reason = "RolledBack", "CrashLoop"
                self.message = f"edged {agent.version} exited {agent.max_tries} times"
                return
            self.version = self.committed = agent.version
            self.phase, self.reason, self.message = "Committed", "", ""
        self.reconnect.set()  # the new edged connects with its own Hello

    def _messages(self) -> Iterator[device_pb2.DeviceMessage]:
        hello = device_pb2.Hello(edged_version=self.version, device_name=self.name,
                                 labels=self.labels)  # fmt: skip
        yield device_pb2.DeviceMessage(hello=hello)
        last = None
        while not self._stop.wait(self.interval):
            if self.reconnect.is_set():
                self.reconnect.clear()
                call = self._call
                if call is not None:
                    call.cancel()
                return
            self._act()
            status = self.agent_status()
            if status != last:
                last = status
                generation = self.desired.generation if self.desired is not None else 0
                yield device_pb2.DeviceMessage(
                    status=device_pb2.Status(observed_generation=generation, agent=status)
                )
                self.reported.set()
            else:
                yield device_pb2.DeviceMessage(heartbeat=device_pb2.Heartbeat())


def agent_device(
    hub: HubProcess, tmp_path: Path, name: str, labels: dict[str, str], *, version: str
) -> AgentDevice:
    """A device enrolled with ``edged enroll``, running edged ``version``, not connected yet."""
    data = tmp_path / name
    out = enroll(hub, data, name, labels)
    assert out.returncode == 0, out.stdout + out.stderr
    return AgentDevice(data, name, hub.address, labels, version=version)
