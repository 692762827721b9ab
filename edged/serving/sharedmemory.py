"""The Open Inference Protocol's system shared-memory extension, as Triton defines it.

A client puts a tensor in a POSIX shared-memory object (``shm_open``: a file in ``/dev/shm``),
registers a region of it (``POST /v2/systemsharedmemory/region/{name}/register`` with
``{"key", "offset", "byte_size"}``), and then names the region in an infer request instead of
sending the bytes: an input or requested output with the parameters ``shared_memory_region``,
``shared_memory_byte_size`` and ``shared_memory_offset``. ``GET /v2/systemsharedmemory[/region/
{name}]/status`` lists regions; ``POST /v2/systemsharedmemory[/region/{name}]/unregister``
drops one, or all.

It is done here, in the control process, so that the worker sees only what it already takes:
an input's bytes are read from the region and given to the worker as a binary tensor
(``binary_data_size``), an output in a region is asked of the worker as a binary output, and
its bytes are written into the region before the answer goes out (its entry then names the
region, with no data).

Ownership: a region is registered by the uid that connected (``SO_PEERCRED`` on the unix
socket; on loopback TCP, the uid that owns the client's socket, from the kernel's socket table
of edged's network namespace: ``/proc/net/tcp``, ``tcp6``), and it must be a regular file in
``/dev/shm`` owned by that uid: opened relative to ``/dev/shm`` with ``O_NOFOLLOW`` (a key is
one path component; a symbolic link, a FIFO, a file of another uid, a file on another
filesystem are refused). Each uid has its own names: a client can neither use, see nor
unregister another uid's regions. A peer whose uid cannot be told is refused.

Limits, per uid: ``sharedMemoryRegions`` regions and ``sharedMemoryBytes`` registered bytes
(``[inference]`` in edged.toml; 0 regions turns the extension off). An infer request assembled
from regions is held to its model's body limit, as a request that carried the bytes would be.

Bytes are moved with ``preadv``/``pwrite`` on the descriptor opened at registration, never a
mapping: a region truncated after registration gives a short read (answered 400), never a
SIGBUS. A region whose file was removed is dropped when its uid next registers a region or
asks for their status, so that its memory is freed (until then it serves what it held, as
Triton's mapping would); otherwise regions live until unregistered or until edged stops, as
in Triton.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from edged.runtime.httpserver import Response

if TYPE_CHECKING:
    from edged.runtime.httpserver import HttpConnection, Request
    from edgefleet.metrics import Registry

SHM_DIR = Path("/dev/shm")
MAX_NAME = 128
MAX_KEY = 255
PREFIX = "/v2/systemsharedmemory"
_SHM_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
_CRED = struct.Struct("3i")
_MARK = b"shared_memory_region"
MAX_PLANS = 256  # request headers worked out, all uids together (cleared when full)
MAX_PLAN_KEY = 8192  # headers longer than this are worked out each time


class ShmError(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Region:
    name: str
    key: str
    offset: int  # within the object
    byte_size: int
    fd: int
    writable: bool

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }

    def gone(self) -> bool:
        try:
            return os.fstat(self.fd).st_nlink == 0
        except OSError:
            return True

    def read_into(self, buf: memoryview, offset: int) -> None:
        """Fill ``buf`` from the region at ``offset`` (one copy, straight into the request)."""
        got = os.preadv(self.fd, [buf], self.offset + offset)
        if got != len(buf):
            raise ShmError(
                f"shared memory region {self.name!r} is shorter than registered: "
                f"{len(buf)} bytes at offset {offset} asked, {got} there "
                "(its file was truncated)"
            )

    def write(self, offset: int, data: bytes) -> None:
        if not self.writable:
            raise ShmError(f"shared memory region {self.name!r} is not writable by edged")
        end = self.offset + offset + len(data)
        if os.fstat(self.fd).st_size < end:  # pwrite would grow a truncated file
            raise ShmError(
                f"shared memory region {self.name!r} is shorter than registered "
                "(its file was truncated)"
            )
        written = os.pwrite(self.fd, data, self.offset + offset)
        if written != len(data):
            raise ShmError(f"shared memory region {self.name!r}: short write")


_MARK_AT = _MARK.index(b"_")
_MAX_UNDERSCORES = 32


def names_region(body: bytes, end: int) -> bool:
    """Whether ``body[:end]`` has ``shared_memory_region``: on every infer request, so cheap.
    ``in`` costs ~0.5 ns a byte here (10 us for the medium MLP's 20 KB of JSON); ``_`` is
    found at memchr's speed and a JSON request has few (keys such as ``binary_data_size``;
    numbers have none), so each is checked for the name around it, and past
    :data:`_MAX_UNDERSCORES` of them the rest is searched for the name whole."""
    find = body.find
    i = find(b"_", 0, end)
    seen = 0
    while i >= 0:
        if i >= _MARK_AT and body.startswith(_MARK, i - _MARK_AT):
            return True
        seen += 1
        if seen == _MAX_UNDERSCORES:
            return find(_MARK, i, end) >= 0
        i = find(b"_", i + 1, end)
    return False


def _int_field(doc: dict[str, Any], field: str, what: str, default: int | None = None) -> int:
    value = doc.get(field, default)
    if value is None:
        raise ShmError(f"{what}: {field} is required")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ShmError(f"{what}: {field} must be a non-negative integer, got {value!r}")
    return value


def _check_name(name: str) -> str:
    if not name or len(name) > MAX_NAME or not name.isprintable() or "/" in name:
        raise ShmError(
            f"region name must be 1 to {MAX_NAME} printable characters without '/', got {name!r}"
        )
    return name


# -- who is at the other end ---------------------------------------------------------------------
def _hex_addr(family: int, host: str) -> str:
    if family == socket.AF_INET:
        return f"{struct.unpack('=I', socket.inet_pton(socket.AF_INET, host))[0]:08X}"
    words = struct.unpack("=4I", socket.inet_pton(socket.AF_INET6, host))
    return "".join(f"{w:08X}" for w in words)


def tcp_peer_uid(sock: Any, proc_net: Path = Path("/proc/net")) -> int:
    """The uid that owns the other end of a loopback TCP connection: the socket whose local
    address is our peer's and whose remote address is ours, established, in edged's network
    namespace (``/proc/net/tcp`` or ``tcp6``). Raises ShmError when there is none."""
    family = sock.family
    peer_host, peer_port = sock.getpeername()[:2]
    our_host, our_port = sock.getsockname()[:2]
    table = "tcp"
    if family == socket.AF_INET6:
        mapped = peer_host.startswith("::ffff:") and our_host.startswith("::ffff:")
        if mapped:  # an IPv4 client of a dual-stack listener: its socket is in ``tcp``
            family, peer_host, our_host = socket.AF_INET, peer_host[7:], our_host[7:]
        else:
            table = "tcp6"
    local = f"{_hex_addr(family, peer_host)}:{peer_port:04X}"
    remote = f"{_hex_addr(family, our_host)}:{our_port:04X}"
    try:
        with open(proc_net / table, encoding="ascii") as f:
            next(f, None)
            for line in f:
                cols = line.split()
                if len(cols) > 7 and cols[1] == local and cols[2] == remote and cols[3] == "01":
                    return int(cols[7])
    except OSError as exc:
        raise ShmError(f"cannot tell who connected: {exc.strerror}", 403) from exc
    raise ShmError(
        "cannot tell who connected: the client's socket is not in edged's network namespace",
        403,
    )


def peer_uid(conn: HttpConnection | None) -> int:
    """The uid of the client of ``conn`` (asked once per connection)."""
    if conn is None:
        raise ShmError("cannot tell who connected", 403)
    uid = conn.peer_uid
    if uid is not None:
        return uid
    sock = conn.socket()
    if sock is None:
        raise ShmError("the connection is closed", 403)
    try:
        if sock.family == socket.AF_UNIX:
            uid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        elif sock.family in (socket.AF_INET, socket.AF_INET6):
            uid = tcp_peer_uid(sock)
        else:
            raise ShmError("cannot tell who connected", 403)
    except OSError as exc:
        raise ShmError(f"cannot tell who connected: {exc.strerror}", 403) from exc
    conn.peer_uid = uid
    return uid


# -- the regions ----------------------------------------------------------------------------------
class SharedMemory:
    """The regions registered, per client uid, and the extension's HTTP endpoints."""

    def __init__(
        self,
        *,
        max_regions: int = 32,
        max_bytes: int = 1 << 30,
        shm_dir: Path = SHM_DIR,
    ) -> None:
        self.max_regions = max_regions
        self.max_bytes = max_bytes
        self.shm_dir = shm_dir
        self._regions: dict[int, dict[str, Region]] = {}
        # (uid, request header) -> what it asks; any change of the regions clears it, so a
        # plan never names a region that was unregistered (its descriptor closed)
        self._plans: dict[tuple[int, bytes], _Plan] = {}

    def export(self, registry: Registry) -> None:
        """Gauges of the regions registered, all uids together (read when scraped)."""
        registry.gauge(
            "edged_shared_memory_regions", "Shared-memory regions registered (all clients)"
        ).set_function(lambda: float(sum(len(m) for m in self._regions.values())))
        registry.gauge(
            "edged_shared_memory_bytes", "Bytes of the shared-memory regions registered"
        ).set_function(
            lambda: float(sum(r.byte_size for m in self._regions.values() for r in m.values()))
        )

    def regions(self, uid: int) -> dict[str, Region]:
        return self._regions.get(uid, {})

    # -- register / unregister --------------------------------------------------------------
    def register(self, uid: int, name: str, key: str, offset: int, byte_size: int) -> Region:
        _check_name(name)
        self._sweep(uid)
        mine = self._regions.get(uid, {})
        if name in mine:
            raise ShmError(f"shared memory region {name!r} is already registered")
        if len(mine) >= self.max_regions:
            raise ShmError(
                f"uid {uid} has {len(mine)} shared memory regions registered, the limit "
                f"(sharedMemoryRegions); unregister one first"
            )
        used = sum(r.byte_size for r in mine.values())
        if used + byte_size > self.max_bytes:
            raise ShmError(
                f"uid {uid} would have {used + byte_size} bytes of shared memory registered, "
                f"over the limit of {self.max_bytes} (sharedMemoryBytes)"
            )
        if byte_size == 0:
            raise ShmError("byte_size must be more than 0")
        fd, writable = self._open(uid, key)
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise ShmError(
                    f"region [{offset}, {offset + byte_size}) is outside {key!r}, "
                    f"which has {size} bytes"
                )
        except BaseException:
            os.close(fd)
            raise
        region = Region(name, key, offset, byte_size, fd, writable)
        self._plans.clear()
        self._regions.setdefault(uid, {})[name] = region
        return region

    def _open(self, uid: int, key: str) -> tuple[int, bool]:
        """A descriptor of ``/dev/shm/<key>``, which must be a regular file of ``uid`` there."""
        base = key[1:] if key.startswith("/") else key
        if (
            not base
            or len(key) > MAX_KEY
            or "/" in base
            or base in (".", "..")
            or "\0" in base
            or not base.isprintable()
        ):
            raise ShmError(
                f"key must name a shared memory object (one name, as shm_open takes it), "
                f"got {key!r}"
            )
        flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
        try:
            dfd = os.open(self.shm_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise ShmError(f"cannot open {self.shm_dir}: {exc.strerror}", 500) from exc
        try:
            dir_dev = os.fstat(dfd).st_dev
            writable = True
            try:
                fd = os.open(base, os.O_RDWR | flags, dir_fd=dfd)
            except PermissionError:
                writable = False
                fd = os.open(base, os.O_RDONLY | flags, dir_fd=dfd)
        except OSError as exc:
            why = exc.strerror
            if exc.errno == 40:  # ELOOP: O_NOFOLLOW met a symbolic link
                why = "it is a symbolic link"
            elif exc.errno == 13:  # EACCES: edged's unit has no CAP_DAC_OVERRIDE
                uid, gid = os.geteuid(), os.getegid()
                why = (
                    f"edged (uid {uid}, gid {gid}, which its unit gives no right to read other "
                    f"users' files) may not open it: let it read and write the file, e.g. "
                    f"setfacl -m u:{uid}:rw {self.shm_dir / base}, or make it group {gid}'s "
                    "with mode 0660"
                )
            raise ShmError(f"cannot open shared memory object {key!r}: {why}") from exc
        finally:
            os.close(dfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ShmError(f"shared memory object {key!r} is not a regular file")
            if st.st_dev != dir_dev:
                raise ShmError(f"shared memory object {key!r} is not on {self.shm_dir}")
            if st.st_uid != uid:
                raise ShmError(
                    f"shared memory object {key!r} belongs to uid {st.st_uid}, not to uid "
                    f"{uid} that registers it",
                    403,
                )
        except BaseException:
            os.close(fd)
            raise
        return fd, writable

    def unregister(self, uid: int, name: str | None) -> None:
        self._plans.clear()  # before any descriptor is closed
        mine = self._regions.get(uid, {})
        if name is None:
            for region in mine.values():
                os.close(region.fd)
            mine.clear()
        else:
            gone = mine.pop(name, None)
            if gone is None:
                raise ShmError(f"no shared memory region {name!r} is registered by uid {uid}", 404)
            os.close(gone.fd)
        if not mine:
            self._regions.pop(uid, None)

    def _sweep(self, uid: int) -> None:
        mine = self._regions.get(uid, {})
        for name in [n for n, r in mine.items() if r.gone()]:
            self._plans.clear()  # before its descriptor is closed
            os.close(mine.pop(name).fd)
        if not mine:
            self._regions.pop(uid, None)

    def _use(self, uid: int, name: object, what: str) -> Region:
        if not isinstance(name, str):
            raise ShmError(f"{what}: shared_memory_region must be a string")
        region = self._regions.get(uid, {}).get(name)
        if region is None:
            raise ShmError(f"{what}: no shared memory region {name!r} is registered by uid {uid}")
        return region

    # -- the HTTP endpoints ------------------------------------------------------------------
    def handle(self, req: Request, resp: Response) -> None:
        """``/v2/systemsharedmemory/...``"""
        try:
            rest = req.path[len(PREFIX) :]
            name: str | None = None
            if rest.startswith("/region/"):
                from urllib.parse import unquote  # only here: edged imports little while idle

                name, _, action = rest[8:].rpartition("/")
                name = _check_name(unquote(name))
            else:
                action = rest[1:] if rest.startswith("/") and rest.count("/") == 1 else ""
            if action not in ("status", "register", "unregister") or (
                action == "register" and name is None
            ):
                resp.send_error(404, f"no such endpoint: {req.path}")
                return
            want = "GET" if action == "status" else "POST"
            if req.method != want:
                resp.send_error(405, f"use {want}")
                return
            uid = peer_uid(req.conn)
            if action == "status":
                self._sweep(uid)
                mine = self.regions(uid)
                if name is not None and name not in mine:
                    raise ShmError(f"no shared memory region {name!r} is registered", 404)
                shown = [mine[name]] if name is not None else list(mine.values())
                resp.send_json(200, [r.status() for r in shown])
            elif action == "unregister":
                self.unregister(uid, name)
                resp.send(200, b"")
            else:
                assert name is not None
                try:
                    doc = orjson.loads(req.body)
                except orjson.JSONDecodeError as exc:
                    raise ShmError(f"register: the body is not JSON: {exc}") from exc
                if not isinstance(doc, dict):
                    raise ShmError("register: the body must be a JSON object")
                key = doc.get("key")
                if not isinstance(key, str):
                    raise ShmError("register: key must be a string")
                offset = _int_field(doc, "offset", "register", 0)
                size = _int_field(doc, "byte_size", "register")
                self.register(uid, name, key, offset, size)
                resp.send(200, b"")
        except ShmError as exc:
            resp.send_error(exc.status, str(exc))

    # -- infer ------------------------------------------------------------------------------
    def wants(self, req: Request) -> bool:
        """Whether an infer request names a region (a cheap look at its JSON)."""
        hdr = req.headers.get("inference-header-content-length")
        body = req.body
        end = int(hdr) if hdr is not None and hdr.isdigit() else len(body)
        return names_region(body, min(end, len(body)))

    def rewrite(self, req: Request, limit: int) -> dict[str, tuple[Region, int, int]]:
        """Put the bytes of the request's inputs in regions into its body as binary tensors
        and ask for its outputs in regions as binary outputs; the outputs' regions, by name
        (``region, offset, byte_size``). ``limit``: the largest body the model takes.

        What a JSON header asks is worked out once per uid and header (:class:`_Plan`: a
        client sends the same header with every frame) and kept until any region is
        registered or unregistered: then only the bytes are moved."""
        uid = peer_uid(req.conn)
        body = req.body
        hdr = req.headers.get("inference-header-content-length")
        hlen = int(hdr) if hdr is not None and hdr.isdigit() else len(body)
        if hlen > len(body):
            raise ShmError(
                f"Inference-Header-Content-Length ({hlen}) is larger than the request body "
                f"({len(body)} bytes)"
            )
        key = None
        if hlen <= MAX_PLAN_KEY:
            key = (uid, body if hlen == len(body) else body[:hlen])
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            plan = self._plan(uid, body, hlen)
            if key is not None:
                if len(self._plans) >= MAX_PLANS:
                    self._plans.clear()
                self._plans[key] = plan
        header = plan.header
        if plan.shm_bytes + len(header) > limit:
            raise ShmError(f"the inputs are larger than this model takes ({limit} bytes)", 413)
        binary = memoryview(body)[hlen:]
        room = len(binary)
        sizes = [  # a slice of the request's own binary section ends where it does
            size if region is not None else max(0, min(room if size < 0 else at + size, room) - at)
            for region, at, size in plan.pieces
        ]
        out = bytearray(len(header) + sum(sizes))
        view = memoryview(out)
        view[: len(header)] = header
        pos = len(header)
        for (region, at, _), size in zip(plan.pieces, sizes, strict=True):
            if region is not None:
                region.read_into(view[pos : pos + size], at)
            elif size:
                view[pos : pos + size] = binary[at : at + size]
            pos += size
        view.release()
        req.body = out  # type: ignore[assignment]  # bytes-like: the channel only joins it
        req.headers["inference-header-content-length"] = str(len(header))
        return plan.outs

    def _plan(self, uid: int, body: bytes, hlen: int) -> _Plan:
        try:
            doc = orjson.loads(memoryview(body)[:hlen])
        except orjson.JSONDecodeError as exc:
            raise ShmError(f"the request is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise ShmError("the request must be a JSON object")
        pieces: list[tuple[Region | None, int, int]] = []
        pos = 0
        total = 0
        inputs = doc.get("inputs")
        for i, inp in enumerate(inputs if isinstance(inputs, list) else ()):
            params = inp.get("parameters") if isinstance(inp, dict) else None
            if not isinstance(params, dict):
                continue
            what = f"input {inp.get('name', i)!r}"
            if "shared_memory_region" in params:
                if "binary_data_size" in params or "data" in inp:
                    raise ShmError(f"{what}: has both shared memory and data")
                region = self._use(uid, params["shared_memory_region"], what)
                size = _int_field(params, "shared_memory_byte_size", what)
                offset = _int_field(params, "shared_memory_offset", what, 0)
                if offset + size > region.byte_size:
                    raise ShmError(
                        f"{what}: {size} bytes at offset {offset} are outside shared memory "
                        f"region {region.name!r} ({region.byte_size} bytes)"
                    )
                total += size
                pieces.append((region, offset, size))
                for k in _SHM_KEYS:
                    params.pop(k, None)
                params["binary_data_size"] = size
            elif "binary_data_size" in params:
                size = _int_field(params, "binary_data_size", what)
                pieces.append((None, pos, size))
                pos += size
        pieces.append((None, pos, -1))  # what no input claimed: the worker says what is wrong
        outs: dict[str, tuple[Region, int, int]] = {}
        outputs = doc.get("outputs")
        for i, out in enumerate(outputs if isinstance(outputs, list) else ()):
            params = out.get("parameters") if isinstance(out, dict) else None
            if not isinstance(params, dict) or "shared_memory_region" not in params:
                continue
            name = out.get("name")
            what = f"output {name if isinstance(name, str) else i!r}"
            if not isinstance(name, str):
                raise ShmError(f"{what}: name must be a string")
            region = self._use(uid, params["shared_memory_region"], what)
            size = _int_field(params, "shared_memory_byte_size", what)
            offset = _int_field(params, "shared_memory_offset", what, 0)
            if offset + size > region.byte_size:
                raise ShmError(
                    f"{what}: {size} bytes at offset {offset} are outside shared memory "
                    f"region {region.name!r} ({region.byte_size} bytes)"
                )
            if not region.writable:
                raise ShmError(f"{what}: shared memory region {region.name!r} is read-only")
            for k in _SHM_KEYS:
                params.pop(k, None)
            params["binary_data"] = True
            outs[name] = (region, offset, size)
        return _Plan(orjson.dumps(doc), tuple(pieces), outs, total)


@dataclass(slots=True, frozen=True)
class _Plan:
    """What one request header asks, worked out: the header the worker gets; the pieces of
    the binary section it gets, in order (``(region, offset, size)`` read from a region, or
    ``(None, start, size)`` of the request's own binary section, size -1 for the rest); the
    outputs to write into regions; the bytes read from regions."""

    header: bytes
    pieces: tuple[tuple[Region | None, int, int], ...]
    outs: dict[str, tuple[Region, int, int]]
    shm_bytes: int


def write_outputs(
    outs: dict[str, tuple[Region, int, int]], body: bytes, hlen: int
) -> tuple[bytes, int | None]:
    """Write the outputs of a worker's binary answer that go to regions; the answer left
    (its JSON header's length, None when no binary output is left)."""
    doc = orjson.loads(memoryview(body)[:hlen])
    binary = memoryview(body)[hlen:]
    kept: list[memoryview] = []
    pos = 0
    done = set()
    for out in doc.get("outputs") or ():
        params = out.get("parameters") or {}
        size = params.get("binary_data_size")
        if not isinstance(size, int):
            continue
        chunk = binary[pos : pos + size]
        pos += size
        plan = outs.get(out.get("name"))
        if plan is None:
            kept.append(chunk)
            continue
        region, offset, room = plan
        if size > room:
            raise ShmError(
                f"output {out['name']!r}: shared_memory_byte_size is {room} bytes, the output "
                f"has {size}"
            )
        region.write(offset, chunk.tobytes())
        out["parameters"] = {
            "shared_memory_region": region.name,
            "shared_memory_byte_size": size,
            "shared_memory_offset": offset,
        }
        done.add(out["name"])
    missing = set(outs) - done
    if missing:
        raise ShmError(f"the model gave no output {sorted(missing)[0]!r} to put in shared memory")
    header = orjson.dumps(doc)
    if not kept:
        return header, None
    return b"".join((header, *kept)), len(header)


_HLEN = b"Inference-Header-Content-Length:"


class ShmAnswer(Response):
    """Stands for a request's answer while its worker answers: writes the outputs that go to
    regions, then answers the client (``outer``) with the rest."""

    __slots__ = ("_outer", "_outs")

    def __init__(self, outer: Response, outs: dict[str, tuple[Region, int, int]]) -> None:
        self._outer = outer
        self._outs = outs
        self.keep_alive = outer.keep_alive
        self.data = None

    def send(
        self,
        status: int,
        body: bytes,
        content_type: bytes = b"application/json",
        headers: bytes = b"",
    ) -> None:
        if self.data is not None:
            return
        self.data = b""
        outer = self._outer
        if status != 200:
            outer.send(status, body, content_type, headers)
            return
        if not headers.startswith(_HLEN):
            outer.send_error(500, "the worker gave no binary outputs for shared memory")
            return
        try:
            answer, hlen = write_outputs(self._outs, body, int(headers[len(_HLEN) :]))
        except ShmError as exc:
            outer.send_error(exc.status, str(exc))
            return
        if hlen is None:
            outer.send(200, answer)
        else:
            outer.send(200, answer, content_type, b"%s %d\r\n" % (_HLEN, hlen))
