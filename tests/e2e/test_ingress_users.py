"""infer.sock by user under a real ``edged run``: a baseline's ``network.ingress.users`` and
``groups`` are checked per connection with SO_PEERCRED, with real uids (the test runs as root
and each client drops to another uid and groups with setpriv): a listed user and a member of
a listed group are served, another uid gets a 403 with the reason, its refusals logged once
a minute however many they are."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Edged, wait_for, write_manifest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)

ALLOWED_UID, OTHER_UID, MEMBER_UID, GROUP = 40101, 40102, 40103, 40104
BASELINE = f"""\
apiVersion: edgefleet.io/v1
kind: SecurityBaseline
metadata: {{name: fleet}}
spec:
  network:
    ingress: {{users: [root, {ALLOWED_UID}], groups: [{GROUP}]}}
"""
CLIENT = """\
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"GET /v2/health/ready HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
out = b""
while chunk := s.recv(65536):
    out += chunk
print(out.decode())
"""


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory other uids can reach (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="ef-ingress-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_user(sock: str, uid: int, groups: str = "") -> str:
    ids = [f"--reuid={uid}", f"--regid={uid}"]
    ids += [f"--groups={groups}"] if groups else ["--clear-groups"]
    done = subprocess.run(
        ["setpriv", *ids, "/usr/bin/python3", "-c", CLIENT, sock],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_only_the_users_and_groups_a_baseline_names_are_served(
    model_dir: Path, edged_factory, open_dir: Path
) -> None:
    write_manifest(model_dir)
    (model_dir / "baseline.yaml").write_text(BASELINE)
    e: Edged = edged_factory(model_dir, data=open_dir / "data")
    e.start()
    e.wait_ready()
    wait_for(lambda: e.status()["device"]["ingress"]["peersChecked"], 30, "the peer check")
    os.chmod(e.data, 0o755)  # the data directory is edged's (0700): let the clients reach it
    ingress = e.status()["device"]["ingress"]
    assert ingress["users"] == [str(ALLOWED_UID), "root"]
    assert ingress["socketMode"] == "0666"  # the kernel lets all connect; edged checks who
    assert e.infer("mlp", [[0.5] * 64])[0] == 200  # root, and edged's own user
    assert as_user(e.infer_sock, ALLOWED_UID).startswith("HTTP/1.1 200")
    assert as_user(e.infer_sock, MEMBER_UID, groups=str(GROUP)).startswith("HTTP/1.1 200")
    for _ in range(3):
        answer = as_user(e.infer_sock, OTHER_UID)
        assert answer.startswith("HTTP/1.1 403"), answer
        assert f"uid {OTHER_UID} may not use the inference API" in answer
    logged = [line for line in e.logs().splitlines() if "inference connection refused" in line]
    assert len(logged) == 1 and f'"uid":{OTHER_UID}' in logged[0]  # bounded: once a minute
    metrics = e.request("GET", "/metrics", sock=e.status_sock)[1].decode()
    assert 'edged_http_forbidden_connections{socket="inference"} 3' in metrics
    assert e.terminate() == 0
