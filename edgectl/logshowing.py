"""``edgectl logs``: devices' recent log lines, asked of each connected device through the hub
(AdminService ``DeviceLogs``; never stored at the hub).

* ``logs device/NAME [WORKLOAD]``: one device's lines: edged's own records and what its
  workers wrote to stderr (about WORKLOAD only, if given).
* ``logs deployment/NAME``: the lines about NAME of every device it is sent to or that reports
  it (the devices' ``status.deployments``, ``status.workloads``), merged by time, each with its
  device.
* ``-l SELECTOR``: the devices whose labels match (``logs -l site=a [WORKLOAD]``); with
  ``deployment/NAME``, those of its devices.
* ``--tail N`` (per device, 1-1000; 100), ``--since 10m`` (only newer lines; the newest 1000 of
  each device are asked then), ``-f`` (ask again every 2 s and print the new lines),
  ``--max-log-requests N`` (devices asked at most, 10: more is refused, as kubectl's),
  ``-o json`` (the records as JSON lines, with ``device`` when several devices are asked).

Lines are shown for a person by default (:func:`human_line`): ``TIME LEVEL [DEVICE] EVENT
key=value...``, a worker's stderr line as ``TIME LEVEL [DEVICE] REPLICA: LINE``. A device
that is not connected is named on stderr and left out when several are asked (exit 1 when
none answered); asked alone, its refusal is the error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from typing import Any

import orjson

from edgectl.client import DEFAULT_CHUNK_SIZE, AdminClient, ClientError, load_admin_config
from edgectl.errors import EXIT_DONE, EXIT_REFUSED, UsageError
from edgectl.resources import parse_refs
from edgefleet.configfiles import duration_option
from edgefleet.timestamps import epoch_of

FOLLOW_EVERY_S = 2.0
MOST_LINES = 1000  # what a device keeps and answers at most
WORKER_OUTPUT = "worker output"  # edged's event of a worker's stderr line


def _tail(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number from 1 to 1000, got {text!r}") from None
    if not 1 <= value <= MOST_LINES:
        raise argparse.ArgumentTypeError(f"must be from 1 to 1000, got {value}")
    return value


def _requests(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"must be a number from 1 to 1000, got {text!r}")
    return int(text)


def add_commands(sub: Any) -> None:
    logs = sub.add_parser(
        "logs",
        help="devices' recent log lines (edged's and what its workers wrote to stderr), asked "
        "of each device through the hub: device/NAME [WORKLOAD], deployment/NAME, -l SELECTOR",
    )
    logs.add_argument(
        "resource", nargs="*", metavar="ARG",
        help="device/NAME [WORKLOAD], deployment/NAME, or with -l: [WORKLOAD]",
    )  # fmt: skip
    logs.add_argument("-l", "--selector", default="", help="the devices whose labels match")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep asking (every 2 s) and print new lines"
    )
    logs.add_argument(
        "--tail", type=_tail, default=None, metavar="N",
        help="the newest N lines of each device (1-1000; 100, or 1000 with --since)",
    )  # fmt: skip
    logs.add_argument(
        "--since", type=duration_option, default=None, metavar="DURATION",
        help="only lines newer than this, e.g. 10m, 1h",
    )  # fmt: skip
    logs.add_argument(
        "--max-log-requests", type=_requests, default=10, metavar="N",
        help="ask at most N devices (10)",
    )  # fmt: skip
    logs.add_argument(
        "-o", "--output", choices=("", "json"), default="",
        help="json: the records as JSON lines (default: for a person)",
    )  # fmt: skip


# -- for a person ----------------------------------------------------------------------------
def _value(value: Any) -> str:
    if isinstance(value, str) and value and not any(c.isspace() or c in '"=' for c in value):
        return value
    return orjson.dumps(value).decode()


def human_line(line: str, device: str = "") -> str:
    """A device's JSON log record for a person (a line that is not one: as it is)."""
    where = f"[{device}] " if device else ""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return where + line
    if not isinstance(record, dict):
        return where + line
    fields = dict(record)
    ts, level = str(fields.pop("ts", "")), str(fields.pop("level", ""))
    event = str(fields.pop("event", ""))
    fields.pop("logger", None)
    head = f"{ts} {level:<7} {where}"
    if event == WORKER_OUTPUT:
        return f"{head}{fields.get('replica', '')}: {fields.get('line', '')}"
    rest = " ".join(f"{k}={_value(v)}" for k, v in fields.items())
    return f"{head}{event}" + (f" {rest}" if rest else "")


def line_time(line: str) -> float | None:
    """A record's time (``ts``), epoch seconds; None when it has none."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return epoch_of(record.get("ts")) if isinstance(record, dict) else None


def _json_line(line: str, device: str) -> str:
    if not device:
        return line
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        record = {"line": line}
    if not isinstance(record, dict):
        record = {"line": line}
    return orjson.dumps({**record, "device": device}).decode()


# -- which devices ---------------------------------------------------------------------------
def holds(device: Mapping[str, Any], deployment: str) -> bool:
    """Whether ``device`` is sent ``deployment`` (``status.deployments``) or reports it."""
    status = device.get("status", {})
    return deployment in (status.get("deployments") or ()) or deployment in (
        status.get("workloads") or {}
    )


def _targets(client: AdminClient, args: argparse.Namespace) -> tuple[list[str], str, bool]:
    """(the devices to ask, the workload, whether one device was named)."""
    words = list(args.resource)
    if not words and not args.selector:
        raise UsageError("logs: give device/NAME [WORKLOAD], deployment/NAME or -l SELECTOR")
    kind = name = ""
    if words and ("/" in words[0] or (len(words) >= 2 and not args.selector)):
        count = 1 if "/" in words[0] else 2
        _kind, refs = parse_refs(words[:count], allow=("Device", "ModelDeployment"))
        kind, name = refs[0].kind, refs[0].name
        words = words[count:]
    if not kind and not args.selector:
        raise UsageError("logs: give device/NAME [WORKLOAD], deployment/NAME or -l SELECTOR")
    if kind == "ModelDeployment" and words:
        raise UsageError(f"logs: deployment/{name} is the workload; no other (got {words[0]!r})")
    if len(words) > 1:
        raise UsageError(f"logs: one workload at most (got {' '.join(words)!r})")
    workload = name if kind == "ModelDeployment" else (words[0] if words else "")
    if kind == "Device":
        if args.selector:
            raise UsageError("logs: -l/--selector does not apply with device/NAME")
        return [name], workload, True
    docs, _ = client.list_objects("Device", args.selector, chunk_size=DEFAULT_CHUNK_SIZE)
    devices = [
        str(d["metadata"]["name"]) for d in docs if kind != "ModelDeployment" or holds(d, name)
    ]
    if kind == "ModelDeployment":
        client.get("ModelDeployment", name)  # NOT_FOUND names it
    if not devices:
        what = f"deployment/{name} is sent to no device" if kind else "no device matches"
        raise ClientError("NOT_FOUND", what + (f" (-l {args.selector})" if args.selector else ""))
    if len(devices) > args.max_log_requests:
        raise UsageError(
            f"logs: {len(devices)} devices would be asked, at most {args.max_log_requests} "
            "(--max-log-requests to raise it, or -l SELECTOR to choose)"
        )
    return sorted(devices), workload, False


# -- the command ---------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int | None:
    if args.command != "logs":
        return None
    from edgectl.commands import default_config

    config = load_admin_config(args.config or default_config(), args.context)
    with AdminClient(config) as client:
        return _logs(client, args)


def _ask(
    client: AdminClient, devices: list[str], workload: str, tail: int, *, alone: bool,
    missing: set[str],
) -> list[tuple[float, int, str, str]]:  # fmt: skip
    """Each device's lines as (time, order, device, line); a device that cannot be asked is
    added to ``missing`` (said once on stderr), or its error raised when it was asked alone."""
    got: list[tuple[float, int, str, str]] = []
    for device in devices:
        try:
            lines = client.device_logs(device, workload, tail)
        except ClientError as exc:
            if alone:
                raise
            if device not in missing:
                print(f"device/{device}: {exc.message}", file=sys.stderr, flush=True)
                missing.add(device)
            continue
        missing.discard(device)
        got += [(line_time(x) or 0.0, i, device, x) for i, x in enumerate(lines)]
    return got


def _show(rows: list[tuple[float, int, str, str]], args: argparse.Namespace, *, alone: bool,
          since: float | None) -> None:  # fmt: skip
    for at, _i, device, line in sorted(rows, key=lambda r: (r[0], r[2], r[1])):
        if since is not None and at < since:
            continue
        shown = "" if alone else device
        text = _json_line(line, shown) if args.output == "json" else human_line(line, shown)
        print(text, flush=True)


def _new_lines(printed: str | None, lines: list[str]) -> list[str]:
    """The lines after the last one printed (all of them when it is no longer among them)."""
    if printed is not None and printed in lines:
        return lines[len(lines) - lines[::-1].index(printed) :]
    return lines


def _logs(client: AdminClient, args: argparse.Namespace) -> int:
    devices, workload, alone = _targets(client, args)
    tail = args.tail or (MOST_LINES if args.since is not None else 100)
    since = time.time() - args.since if args.since is not None else None
    missing: set[str] = set()
    rows = _ask(client, devices, workload, tail, alone=alone, missing=missing)
    _show(rows, args, alone=alone, since=since)
    if not args.follow:
        return EXIT_REFUSED if len(missing) == len(devices) else EXIT_DONE
    last: dict[str, str | None] = {d: None for d in devices}
    for _at, _i, device, line in sorted(rows, key=lambda r: (r[2], r[1])):
        last[device] = line
    try:
        while True:
            time.sleep(FOLLOW_EVERY_S)
            fresh: list[tuple[float, int, str, str]] = []
            for device in devices:
                asked = _ask(client, [device], workload, MOST_LINES, alone=alone, missing=missing)
                lines = _new_lines(last[device], [r[3] for r in asked])
                fresh += [(line_time(x) or 0.0, i, device, x) for i, x in enumerate(lines)]
                if lines:
                    last[device] = lines[-1]
            _show(fresh, args, alone=alone, since=None)
    except KeyboardInterrupt:
        return EXIT_DONE
