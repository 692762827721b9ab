"""The clock-jump shim (soakclock, clockshim.c) on real child processes: it moves the wall clock
that Python, OpenSSL and a process's children read, and nothing else — the monotonic clock,
sleeps and timed waits run on as after a real step of the system clock."""

from __future__ import annotations

import datetime as dt
import json
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import soakclock
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

HOUR = 3600.0

READ_CLOCKS = r"""
import datetime, json, os, subprocess, sys, threading, time
began = time.monotonic()
threading.Event().wait(0.2)   # a timed wait (a semaphore or a condition variable underneath)
time.sleep(0.1)               # clock_nanosleep on the monotonic clock
waited = time.monotonic() - began
child = subprocess.run([sys.executable, "-c", "import time; print(time.time())"],
                       capture_output=True, text=True, check=True)
print(json.dumps({
    "time": time.time(), "time_ns": time.time_ns() / 1e9,
    "datetime": datetime.datetime.now(datetime.timezone.utc).timestamp(),
    "realtime": time.clock_gettime(time.CLOCK_REALTIME),
    "monotonic": time.monotonic(), "boottime": time.clock_gettime(time.CLOCK_BOOTTIME),
    "waited": waited, "child": float(child.stdout), "date": int(subprocess.run(
        ["date", "+%s"], capture_output=True, text=True, check=True).stdout),
}))
"""


@pytest.fixture
def clock(tmp_path: Path) -> soakclock.DeviceClock:
    made = soakclock.make(tmp_path, "dev-0")
    assert not isinstance(made, str), made
    return made


def read_clocks(clock: soakclock.DeviceClock) -> tuple[dict[str, float], float, float, float]:
    """The child's readings, and this process's wall, monotonic and boot clocks after it."""
    out = subprocess.run(
        [sys.executable, "-c", READ_CLOCKS],
        capture_output=True, text=True, env=clock.env(), timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return (
        json.loads(out.stdout),
        time.time(),
        time.monotonic(),
        time.clock_gettime(time.CLOCK_BOOTTIME),
    )


@pytest.mark.parametrize("offset", [0.0, 1800.0, -1800.0, 5 * HOUR, -61.5])
def test_the_shim_moves_the_wall_clock_and_not_the_monotonic_one(
    clock: soakclock.DeviceClock, offset: float
) -> None:
    clock.jump(offset)
    before_wall, before_mono = time.time(), time.monotonic()
    child, wall, mono, boot = read_clocks(clock)
    for name in ("time", "time_ns", "datetime", "realtime", "child", "date"):
        # within the seconds the child ran: its wall clock reads the true time plus the offset
        assert before_wall + offset - 1 <= child[name] <= wall + offset + 1, (name, child)
    assert before_mono <= child["monotonic"] <= mono  # the same clock as this process's
    assert child["boottime"] <= boot
    # its sleeps and timed waits ran their length, not the offset's
    assert 0.3 <= child["waited"] < 30, child


def test_a_jump_reaches_a_running_process_at_once_and_is_corrected(
    clock: soakclock.DeviceClock,
) -> None:
    """The offset is re-read on every clock read: a running process sees the step and the
    correction, and its monotonic clock never moves backwards across either."""
    script = (
        "import sys, time\n"
        "for line in sys.stdin:\n"
        "    print(time.time(), time.monotonic(), flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=clock.env(),
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    readings = []
    try:
        for offset in (0.0, -1200.0, 0.0, 7200.0, 0.0):
            clock.jump(offset)
            before = time.time()
            proc.stdin.write("\n")
            proc.stdin.flush()
            wall, mono = map(float, proc.stdout.readline().split())
            assert before + offset - 1 <= wall <= time.time() + offset + 1, (offset, wall)
            readings.append(mono)
    finally:
        proc.stdin.close()
        proc.wait(30)
    assert readings == sorted(readings)


def _certificate(tmp_path: Path, not_before: float, not_after: float) -> tuple[Path, Path]:
    """A self-signed certificate for localhost valid only from ``not_before`` to
    ``not_after`` (POSIX times), and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(dt.datetime.fromtimestamp(not_before, dt.UTC))
        .not_valid_after(dt.datetime.fromtimestamp(not_after, dt.UTC))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "future.crt", tmp_path / "future.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


HANDSHAKE = r"""
import socket, ssl, sys, threading
cert, key = sys.argv[1], sys.argv[2]
server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
server.load_cert_chain(cert, key)
client = ssl.create_default_context(cafile=cert)
listener = socket.create_server(("127.0.0.1", 0))
def serve():
    conn, _ = listener.accept()
    try:
        with server.wrap_socket(conn, server_side=True) as s:
            s.recv(1)
    except (OSError, ssl.SSLError):
        pass
threading.Thread(target=serve, daemon=True).start()
try:
    with socket.create_connection(listener.getsockname()) as raw:
        with client.wrap_socket(raw, server_hostname="localhost") as s:
            s.send(b"x")
    print("verified")
except ssl.SSLCertVerificationError as exc:
    print("refused:", exc.verify_message)
"""


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        (0.0, "refused: certificate is not yet valid"),
        (2.5 * HOUR, "verified"),
        (4 * HOUR, "refused: certificate has expired"),
    ],
)
def test_openssl_checks_certificates_against_the_jumped_clock(
    clock: soakclock.DeviceClock, tmp_path: Path, offset: float, expected: str
) -> None:
    """OpenSSL's validity check reads time(): a device whose clock is ahead accepts a
    certificate that is not valid yet and refuses one that still is, as a real one would."""
    now = time.time()
    cert, key = _certificate(tmp_path, now + 2 * HOUR, now + 3 * HOUR)
    clock.jump(offset)
    out = subprocess.run(
        [sys.executable, "-c", HANDSHAKE, str(cert), str(key)],
        capture_output=True, text=True, env=clock.env(), timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected
    assert ssl.OPENSSL_VERSION  # the library the child verified with


def test_an_offset_file_that_cannot_be_read_refuses_to_start(
    clock: soakclock.DeviceClock, tmp_path: Path
) -> None:
    env = clock.env()
    env[soakclock.OFFSET_ENV] = str(tmp_path / "absent.clock")
    out = subprocess.run(
        [sys.executable, "-c", "print('started')"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 127
    assert "absent.clock cannot be mapped" in out.stderr
    assert "started" not in out.stdout


def test_clock_jumps_come_from_their_own_streams_of_the_seed() -> None:
    """Adding the devices' clocks leaves a seed's other faults as they were; each jump is a
    step forward or back by 1 to 30 minutes, or forward by 2 to 6 hours, held for a while and
    over by the end, one at a time per device."""
    from soakplan import JUMP, make_plan

    targets = {"root": "hub", "etcd-0": "etcd", "dev-0": "edged", "dev-0-worker": "worker",
               "eu-root-link": "link", "dev-1-net": "net", "dev-0-disk": "disk"}  # fmt: skip
    clocks = {**targets, "dev-0-clock": "clock", "dev-1-clock": "clock"}
    jumps = []
    for seed in range(40):
        plain, jumped = make_plan(seed, 600, targets), make_plan(seed, 600, clocks)
        assert [f for f in jumped.faults if f.kind != "clock"] == plain.faults
        mine = [f for f in jumped.faults if f.kind == "clock"]
        assert mine == [f for f in make_plan(seed, 600, clocks).faults if f.kind == "clock"]
        for f in mine:
            assert f.action == JUMP and f.target in ("dev-0-clock", "dev-1-clock")
            assert 60 <= abs(f.offset) <= 1800 or 2 * HOUR <= f.offset <= 6 * HOUR, f
            assert f.duration >= 1.0 and f.at + f.duration <= 600
            same = [g for g in mine if g.target == f.target and g is not f]
            assert all(g.at >= f.at + f.duration or g.at + g.duration <= f.at for g in same)
        jumps += mine
    assert {f.offset > 0 for f in jumps} == {True, False}
    assert any(f.offset > 2 * HOUR for f in jumps)  # past the TUF timestamp's hour
