"""An enrolled, idle edged's control process imports only what that configuration needs
(issue 34, docs/edged.md "Footprint"): never onnxruntime or numpy (the workers do), nor what
only some other moment needs (YAML, the certificate parser, python-tuf's urllib3 fetcher,
http.client, importlib.metadata, tarfile). Keeps the gain measured by bench/footprint.py from
rotting: an import added at the top of a module the control process loads fails here.

What the process imported is read honestly and cheaply: a ``sitecustomize`` put first on the
edged process's PYTHONPATH writes ``sorted(sys.modules)`` to ``<pid>.json`` at exit (edged
exits normally on SIGTERM), so the list is the whole life of the process, not a sample.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for

NEVER = (
    "onnxruntime",  # the workers import it, never the control process
    "numpy",
    "onnx",
    "yaml",  # the hub sends manifests as JSON (edgefleet.api.yamlloading)
    "urllib3",  # python-tuf's default fetcher: edged fetches over the hub link
    "requests",
    "cryptography.x509",  # the certificate's dates are read with the standard library
    "http.client",  # edgefleet.devicestatus: `edged status` only
    "email",
    "importlib.metadata",  # a source tree's version comes from pyproject.toml
    "tarfile",  # installing an agent release only
    "aiohttp",
)
"""Modules (and their submodules) an idle enrolled control process never imports. (grpc itself
imports the package ``grpc_tools`` when installed, as a shim; a device has no grpcio-tools.)"""

NEEDED = ("grpc", "tuf.ngclient", "edged.hublink.linking")
"""What it must import: proof that the process went through the enrolled path, TUF included."""

HOOK = """\
import atexit, json, os, sys

def _dump():
    path = os.path.join({out!r}, f"{{os.getpid()}}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(sorted(sys.modules), f)
    os.replace(path + ".tmp", path)

atexit.register(_dump)
"""


def imported(modules: list[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


def test_idle_enrolled_control_process_imports_only_what_it_needs(
    tmp_path: Path, edged_factory
) -> None:
    hook = tmp_path / "hook"
    out = tmp_path / "modules"
    hook.mkdir()
    out.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK.format(out=str(out)))
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init().start()
    try:
        data = tmp_path / "dev"
        enrolled = enroll(hub, data, "lean-1", {"site": "lab"})
        assert enrolled.returncode == 0, enrolled.stdout + enrolled.stderr
        e: Edged = edged_factory(
            None, data=data, config=SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
        )
        path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p)
        e.env = {**os.environ, "PYTHONPATH": path}
        e.start()

        def settled() -> bool:  # connected, the desired state accepted, TUF followed
            link = e.status().get("hub") or {}
            return bool(link.get("connected") and link.get("generation") and link["tufRequired"])

        wait_for(settled, 60, "the device to take its first desired state")
        pid = e.launched.pid if e.launched is not None else 0
        assert e.terminate() == 0
    finally:
        hub.stop()
    modules = json.loads((out / f"{pid}.json").read_text())
    missing = [m for m in NEEDED if not imported(modules, m)]
    assert not missing, f"the enrolled path was not taken: {missing} never imported"
    heavy = [name for name in NEVER if imported(modules, name)]
    assert not heavy, f"an idle enrolled edged imported {heavy} (docs/edged.md, 'Footprint')"
