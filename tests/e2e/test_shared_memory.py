"""The system shared-memory extension, spoken by ``tritonclient`` itself (its HTTP client and
its ``tritonclient.utils.shared_memory`` regions) to a real edged over loopback TCP, and the
attacks it must stand: bounds, negative sizes, symbolic links, another uid's file, too many
regions, another client's names, a region truncated after it was registered."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from harness import UNSIGNED_CONFIG, Edged, write_manifest
from metricstesting import series_value

tritonhttp = pytest.importorskip("tritonclient.http")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from test_serving import direct  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

IN_BYTES = 4 * 64 * 4  # 4 rows of the tiny MLP's 64 inputs
OUT_BYTES = 4 * 10 * 4


def series(e: Edged, name: str) -> float:
    status, body, _ = e.request("GET", "/metrics", sock=e.status_sock)
    assert status == 200
    return series_value(body.decode(), name)


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def served(model_dir: Path, tmp_path: Path, edged_factory) -> Iterator[tuple[Edged, int]]:
    port = _port()
    write_manifest(model_dir)
    config = UNSIGNED_CONFIG.format(absent=tmp_path / "no-trust-root.json") + (
        f'[inference]\nlistenTcp = "127.0.0.1:{port}"\nsharedMemoryRegions = 4\n'
        'sharedMemoryBytes = "64Ki"\n'
    )
    e: Edged = edged_factory(model_dir, config=config).start()
    e.wait_ready()
    yield e, port
    assert e.terminate() == 0


@pytest.fixture
def regions() -> Iterator[list[object]]:
    made: list[object] = []
    yield made
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def _region(made: list[object], name: str, size: int) -> object:
    handle = shm.create_shared_memory_region(name, f"/edgedtest-{os.getpid()}-{name}", size)
    made.append(handle)
    return handle


def _key(name: str) -> str:
    return f"/edgedtest-{os.getpid()}-{name}"


def _infer(client, in_region: str, out_region: str, **kw: int):  # type: ignore[no-untyped-def]
    inp = tritonhttp.InferInput("input", [4, 64], "FP32")
    inp.set_shared_memory(in_region, kw.get("in_size", IN_BYTES), offset=kw.get("in_offset", 0))
    out = tritonhttp.InferRequestedOutput("logits", binary_data=True)
    out.set_shared_memory(out_region, kw.get("out_size", OUT_BYTES), offset=kw.get("out_off", 0))
    return client.infer("mlp", [inp], outputs=[out])


def test_tritonclient_round_trip(served, regions, model_dir: Path) -> None:
    e, port = served
    client = tritonhttp.InferenceServerClient(f"127.0.0.1:{port}")
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]
    x = np.random.default_rng(7).standard_normal((4, 64)).astype(np.float32)
    h_in = _region(regions, "in", IN_BYTES)
    h_out = _region(regions, "out", OUT_BYTES + 16)
    shm.set_shared_memory_region(h_in, [x])
    client.register_system_shared_memory("in", _key("in"), IN_BYTES)
    client.register_system_shared_memory("out", _key("out"), OUT_BYTES + 16)
    status = client.get_system_shared_memory_status()
    assert sorted(r["name"] for r in status) == ["in", "out"]
    assert series(e, "edged_shared_memory_regions") == 2
    assert series(e, "edged_shared_memory_bytes") == IN_BYTES + OUT_BYTES + 16
    assert client.get_system_shared_memory_status("in") == [
        {"name": "in", "key": _key("in"), "offset": 0, "byte_size": IN_BYTES}
    ]

    result = _infer(client, "in", "out", out_off=16)
    meta = result.get_output("logits")
    assert meta["parameters"]["shared_memory_region"] == "out"
    assert meta["parameters"]["shared_memory_byte_size"] == OUT_BYTES
    got = shm.get_contents_as_numpy(h_out, np.float32, [4, 10], offset=16)
    np.testing.assert_allclose(got, direct(model_dir / "mlp.onnx", x), rtol=1e-5, atol=1e-5)

    # an input from a region, the output as the binary extension returns it
    inp = tritonhttp.InferInput("input", [4, 64], "FP32")
    inp.set_shared_memory("in", IN_BYTES)
    answer = client.infer("mlp", [inp]).as_numpy("logits")
    np.testing.assert_allclose(answer, got, rtol=1e-6)

    client.unregister_system_shared_memory("in")
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["out"]
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []
    assert series(e, "edged_shared_memory_regions") == 0
    with pytest.raises(InferenceServerException, match="no shared memory region 'in'"):
        _infer(client, "in", "out")


def test_attacks_are_refused_and_edged_keeps_serving(served, regions, tmp_path: Path) -> None:
    e, port = served
    client = tritonhttp.InferenceServerClient(f"127.0.0.1:{port}")
    _region(regions, "in", IN_BYTES)
    _region(regions, "out", OUT_BYTES)
    client.register_system_shared_memory("in", _key("in"), IN_BYTES)
    client.register_system_shared_memory("out", _key("out"), OUT_BYTES)

    def refused(match: str, call, *args, **kw) -> None:  # type: ignore[no-untyped-def]
        with pytest.raises(InferenceServerException, match=match):
            call(*args, **kw)

    # bounds: past the end, a region larger than its file, negative sizes and offsets
    refused("outside shared memory region 'in'", _infer, client, "in", "out", in_offset=4)
    refused("outside shared memory region 'out'", _infer, client, "in", "out", out_size=999)
    refused("must be a non-negative integer", _infer, client, "in", "out", in_size=-1)
    refused("outside", client.register_system_shared_memory, "big", _key("in"), IN_BYTES + 1)
    refused("outside", client.register_system_shared_memory, "off", _key("in"), 8, IN_BYTES)
    refused("non-negative", client.register_system_shared_memory, "neg", _key("in"), -4)
    refused("non-negative", client.register_system_shared_memory, "neg", _key("in"), 4, -1)
    # an output region too small for the answer: Triton's error, nothing written past it
    refused("shared_memory_byte_size is 16 bytes", _infer, client, "in", "out", out_size=16)
    # no region outside /dev/shm, no symbolic link, nothing but a regular file
    refused("must name a shared memory object", client.register_system_shared_memory, "p",
            "/../etc/passwd", 4)  # fmt: skip
    refused("must name a shared memory object", client.register_system_shared_memory, "p",
            "a/b", 4)  # fmt: skip
    link = Path("/dev/shm") / f"edgedtest-{os.getpid()}-link"
    link.symlink_to(Path("/dev/shm") / _key("in")[1:])
    try:
        refused("symbolic link", client.register_system_shared_memory, "l", "/" + link.name, 4)
    finally:
        link.unlink()
    fifo = Path("/dev/shm") / f"edgedtest-{os.getpid()}-fifo"
    os.mkfifo(fifo)
    try:
        refused("not a regular file", client.register_system_shared_memory, "f", "/" + fifo.name, 4)
    finally:
        fifo.unlink()
    # a file of another uid is never read
    other = _region(regions, "other", IN_BYTES)
    os.chown(Path("/dev/shm") / _key("other")[1:], 65534, 65534)
    refused("belongs to uid 65534", client.register_system_shared_memory, "o", _key("other"), 4)
    # limits per client: 4 regions, 64 KiB
    refused("over the limit of 65536", client.register_system_shared_memory, "x",
            _key("in"), 65536)  # fmt: skip
    client.register_system_shared_memory("in2", _key("in"), 4)
    client.register_system_shared_memory("in3", _key("in"), 4)
    refused("limit \\(sharedMemoryRegions\\)", client.register_system_shared_memory, "in4",
            _key("in"), 4)  # fmt: skip
    refused("already registered", client.register_system_shared_memory, "in", _key("in"), 4)
    # another client's names: a uid sees, uses and unregisters only its own
    refused("no shared memory region 'nope'", client.unregister_system_shared_memory, "nope")
    # a region truncated after it was registered: a 400, no SIGBUS
    os.truncate(Path("/dev/shm") / _key("in")[1:], 8)
    refused("shorter than registered", _infer, client, "in", "out")
    os.truncate(Path("/dev/shm") / _key("in")[1:], IN_BYTES)
    os.truncate(Path("/dev/shm") / _key("out")[1:], 8)
    refused("shorter than registered", _infer, client, "in", "out")
    os.truncate(Path("/dev/shm") / _key("out")[1:], OUT_BYTES)
    assert os.stat(Path("/dev/shm") / _key("out")[1:]).st_size == OUT_BYTES
    _infer(client, "in", "out")
    # a region whose file was removed is dropped at the next status (or register) of its uid
    shm.destroy_shared_memory_region(regions.pop(0))
    assert "in" not in [r["name"] for r in client.get_system_shared_memory_status()]
    refused("no shared memory region 'in'", _infer, client, "in", "out")
    assert other in regions and e.proc is not None and e.proc.poll() is None


OTHER_UID_CLIENT = """
import os, sys
import numpy as np
import tritonclient.http as th
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

port, root_key = sys.argv[1], sys.argv[2]
# warmed up as root (what the client imports lazily: the venv may not be readable by
# nobody), its connections closed, then a new client as nobody from here on
warm = th.InferenceServerClient("127.0.0.1:" + port)
warm.get_server_metadata()
warm.close()
from multiprocessing import resource_tracker
resource_tracker.ensure_running()  # what tritonclient's regions use, started as root too
key = "/edgedtest-nobody-%d" % os.getpid()
# its own region: made here where /dev/shm lets nobody make one, else made for it
fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
os.ftruncate(fd, 256)
os.fchown(fd, 65534, 65534)
os.close(fd)
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
c = th.InferenceServerClient("127.0.0.1:" + port)
print("status", c.get_system_shared_memory_status())
for call, args in (
    (c.unregister_system_shared_memory, ("in",)),
    (c.register_system_shared_memory, ("x", root_key, 4)),
):
    try:
        call(*args)
        print("accepted")
    except InferenceServerException as exc:
        print("refused", exc.message())
inp = th.InferInput("input", [1, 64], "FP32")
inp.set_shared_memory("in", 256)
try:
    c.infer("mlp", [inp])
    print("accepted")
except InferenceServerException as exc:
    print("refused", exc.message())
h = shm.create_shared_memory_region("mine", key, 256)
try:
    shm.set_shared_memory_region(h, [np.ones((1, 64), np.float32)])
    c.register_system_shared_memory("in", key, 256)
    print("own", c.infer("mlp", [inp]).as_numpy("logits").shape)
    c.unregister_system_shared_memory("in")
finally:
    shm.destroy_shared_memory_region(h)
    os.unlink("/dev/shm" + key)
"""


def test_another_uid_has_its_own_regions(served, regions, tmp_path: Path) -> None:
    """A client of another uid (over loopback TCP: the uid that owns its socket) cannot see,
    use or unregister root's regions, nor register root's file; its own file it can."""
    e, port = served
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another uid")
    client = tritonhttp.InferenceServerClient(f"127.0.0.1:{port}")
    _region(regions, "in", IN_BYTES)
    client.register_system_shared_memory("in", _key("in"), IN_BYTES)
    script = tmp_path / "other.py"
    script.write_text(OTHER_UID_CLIENT)
    script.chmod(0o644)
    tmp_path.chmod(0o755)
    run = subprocess.run(
        [sys.executable, str(script), str(port), _key("in")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    lines = run.stdout.splitlines()
    assert len(lines) == 5, (run.stdout, run.stderr[-3000:])
    assert lines[0] == "status []"
    assert lines[1].startswith("refused") and "uid 65534" in lines[1]
    assert lines[2].startswith("refused") and "belongs to uid 0" in lines[2]
    assert lines[3].startswith("refused") and "no shared memory region 'in'" in lines[3]
    assert lines[4] == "own (1, 10)"
    # root's region is still there, and its own unix-socket client (SO_PEERCRED) sees it
    status, body, _ = e.request("GET", "/v2/systemsharedmemory/region/in/status")
    assert status == 200 and b'"in"' in body, body


def test_requests_in_flight_at_once_each_get_their_own_output(
    served, regions, model_dir: Path
) -> None:
    """Several frames in flight (tritonclient's async_infer on 4 connections), each input and
    output at its own offset of two regions: every answer lands where its request said."""
    _e, port = served
    client = tritonhttp.InferenceServerClient(f"127.0.0.1:{port}", concurrency=4)
    k = 8
    rows = 1
    in_bytes, out_bytes = rows * 64 * 4, rows * 10 * 4
    xs = np.random.default_rng(11).standard_normal((k, rows, 64)).astype(np.float32)
    h_in = _region(regions, "ins", k * in_bytes)
    h_out = _region(regions, "outs", k * out_bytes)
    for i in range(k):
        shm.set_shared_memory_region(h_in, [xs[i]], offset=i * in_bytes)
    client.register_system_shared_memory("ins", _key("ins"), k * in_bytes)
    client.register_system_shared_memory("outs", _key("outs"), k * out_bytes)
    pending = []
    for i in range(k):
        inp = tritonhttp.InferInput("input", [rows, 64], "FP32")
        inp.set_shared_memory("ins", in_bytes, offset=i * in_bytes)
        out = tritonhttp.InferRequestedOutput("logits")
        out.set_shared_memory("outs", out_bytes, offset=i * out_bytes)
        pending.append(client.async_infer("mlp", [inp], outputs=[out]))
    for p in pending:
        p.get_result()
    want = direct(model_dir / "mlp.onnx", xs.reshape(k * rows, 64))
    for i in range(k):
        got = shm.get_contents_as_numpy(h_out, np.float32, [rows, 10], offset=i * out_bytes)
        np.testing.assert_allclose(got, want[i * rows : (i + 1) * rows], rtol=1e-5, atol=1e-5)
    client.unregister_system_shared_memory()
    client.close()


def test_a_name_registered_again_reads_the_new_file(served, regions, model_dir: Path) -> None:
    """edged works out a request header once; unregistering and registering the name again
    (another file) must never leave it reading the old one."""
    _e, port = served
    client = tritonhttp.InferenceServerClient(f"127.0.0.1:{port}")
    rng = np.random.default_rng(13)
    answers = []
    for name in ("first", "second"):
        x = rng.standard_normal((4, 64)).astype(np.float32)
        h = _region(regions, name, IN_BYTES)
        shm.set_shared_memory_region(h, [x])
        client.register_system_shared_memory("in", _key(name), IN_BYTES)
        for _ in range(2):  # the second time from what edged worked out the first
            inp = tritonhttp.InferInput("input", [4, 64], "FP32")
            inp.set_shared_memory("in", IN_BYTES)
            got = client.infer("mlp", [inp]).as_numpy("logits")
            np.testing.assert_allclose(got, direct(model_dir / "mlp.onnx", x), rtol=1e-5, atol=1e-5)
        answers.append(got)
        client.unregister_system_shared_memory("in")
    assert not np.allclose(answers[0], answers[1])


NO_DAC_CLIENT = """
import os, sys
import numpy as np
import tritonclient.http as th
from tritonclient.utils import InferenceServerException
from multiprocessing import resource_tracker

port = sys.argv[1]
warm = th.InferenceServerClient("127.0.0.1:" + port)
warm.get_server_metadata()
warm.close()
resource_tracker.ensure_running()
key = "/edgedtest-nodac-%d" % os.getpid()
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
c = th.InferenceServerClient("127.0.0.1:" + port)
fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
try:
    os.ftruncate(fd, 256 + 40)
    os.pwrite(fd, np.ones((1, 64), np.float32).tobytes(), 0)
    try:
        c.register_system_shared_memory("in", key, 296)
        print("accepted")
    except InferenceServerException as exc:
        print("refused", exc.message())
    os.fchmod(fd, 0o606)  # what the hint says, for edged's uid and gid here: root, 0
    c.register_system_shared_memory("in", key, 296)
    inp = th.InferInput("input", [1, 64], "FP32")
    inp.set_shared_memory("in", 256)
    out = th.InferRequestedOutput("logits")
    out.set_shared_memory("in", 40, offset=256)
    c.infer("mlp", [inp], outputs=[out])
    print("served", np.frombuffer(os.pread(fd, 40, 256), np.float32).shape)
    c.unregister_system_shared_memory()
finally:
    os.close(fd)
    os.unlink("/dev/shm" + key)
"""


def test_an_edged_without_dac_override_says_how_to_let_it_in(
    model_dir: Path, tmp_path: Path, edged_factory
) -> None:
    """As its unit runs it: root without CAP_DAC_OVERRIDE cannot open a client's 0600 file;
    the refusal says how to let it in, and once the client does, it is served."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    probe = subprocess.run(
        ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "true"],
        check=False,
        capture_output=True,
    )
    if probe.returncode != 0:
        pytest.skip("setpriv cannot drop CAP_DAC_OVERRIDE here")
    wrapper = tmp_path / "python-no-dac"
    wrapper.write_text(
        "#!/bin/sh\nexec setpriv --bounding-set=-dac_override,-dac_read_search -- "
        f'{sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    port = _port()
    write_manifest(model_dir)
    config = UNSIGNED_CONFIG.format(absent=tmp_path / "no-trust-root.json") + (
        f'[inference]\nlistenTcp = "127.0.0.1:{port}"\n'
    )
    e: Edged = edged_factory(model_dir, config=config)
    e.python = wrapper
    e.start().wait_ready()
    script = tmp_path / "nodac.py"
    script.write_text(NO_DAC_CLIENT)
    tmp_path.chmod(0o755)
    run = subprocess.run(
        [sys.executable, str(script), str(port)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    lines = run.stdout.splitlines()
    assert len(lines) == 2, (run.stdout, run.stderr[-3000:])
    assert lines[0].startswith("refused") and "setfacl -m u:0:rw /dev/shm/" in lines[0]
    assert lines[1] == "served (10,)"
    assert e.terminate() == 0
