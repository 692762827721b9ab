"""Logs are events: a constant message plus key-value fields.

``log = get_logger(__name__)``; ``log.info("worker started", model="mnist", pid=123)``.
Event names are lowercase words separated by spaces (``artifact downloaded``), never
``kebab-case`` (tests/core/test_logs.py checks every call in the tree).

JSON lines when stderr is not a terminal (journald, files), ``msg key=value`` on a terminal;
timestamps are RFC 3339 in UTC, to the millisecond (``2026-11-30T21:05:09.123Z``). Under
systemd, when stderr is the journal (``$JOURNAL_STREAM`` names it), every line starts with its
syslog priority (``<6>`` info, ``<4>`` warning, ``<3>`` error), which journald reads as the
entry's priority (``journalctl -p warning`` then works). There Python's warnings become
records (``py.warnings``, warning) and an uncaught exception one record (``uncaught
exception``, critical) rather than unprefixed text; what still reaches stderr without a prefix
(a native library's own lines) gets the unit's ``SyslogLevel=`` (edged.service: warning).

gRPC's own logging (its C core writes glog lines such as ``I1130 ... fork_posix.cc:71]`` to
stderr) is limited to errors unless ``$GRPC_VERBOSITY`` says otherwise, and its Python loggers
to warnings: :func:`configure_logging` must run before grpc is imported, as every program's
``main`` does.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import deque
from datetime import UTC, datetime
from typing import Any

import orjson

_SECRET_KEYS = frozenset({"token", "password", "secret", "private_key", "key_material"})


class EventLogger:
    """A thin wrapper that turns keyword arguments into structured fields."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def _log(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={"fields": fields})

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._logger.exception(event, extra={"fields": fields})

    def at(self, level: int, event: str, **fields: Any) -> None:
        """At a level decided at run time (edged's forwarded worker output)."""
        self._log(level, event, fields)


def get_logger(name: str) -> EventLogger:
    return EventLogger(logging.getLogger(name))


def _clean(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: ("<redacted>" if k in _SECRET_KEYS else v) for k, v in fields.items()}


def timestamp(created: float) -> str:
    """RFC 3339, UTC, milliseconds: ``2026-11-30T21:05:09.123Z``."""
    moment = datetime.fromtimestamp(created, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


SYSLOG_PRIORITIES = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


def syslog_priority(levelno: int) -> int:
    """The syslog priority of a logging level (between levels: the next lower one's)."""
    for level in sorted(SYSLOG_PRIORITIES, reverse=True):
        if levelno >= level:
            return SYSLOG_PRIORITIES[level]
    return 7


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        out.update(_clean(getattr(record, "fields", {})))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class JournalFormatter(logging.Formatter):
    """Another formatter's lines, each with the syslog priority prefix journald reads."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in self.inner.format(record).splitlines())


def stderr_is_journal(environ: dict[str, str] | None = None) -> bool:
    """Whether stderr is the journal: ``$JOURNAL_STREAM`` (``DEVICE:INODE``, set by systemd
    for units whose output goes to the journal) names the file stderr is."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    device, colon, inode = value.partition(":")
    if not colon or not device.isdigit() or not inode.isdigit():
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = timestamp(record.created)
        fields = " ".join(f"{k}={v}" for k, v in _clean(getattr(record, "fields", {})).items())
        line = f"{stamp} {record.levelname.lower():7} {record.getMessage()}"
        if fields:
            line += "  " + fields
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(
    level: str = "info", *, json_output: bool | None = None, journal: bool | None = None
) -> None:
    """Set up the root logger once, at process start (never at import): JSON or text, with
    syslog priorities when stderr is the journal; gRPC's own logging quietened (module doc)."""
    if json_output is None:
        json_output = not sys.stderr.isatty()
    if journal is None:
        journal = stderr_is_journal()
    formatter: logging.Formatter = JsonFormatter() if json_output else TextFormatter()
    if journal:
        formatter = JournalFormatter(formatter)
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # read by grpc's core when it starts
    logging.getLogger("grpc").setLevel(max(logging.WARNING, root.level))


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
    """sys.excepthook under the journal: the traceback as one critical record."""
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    logging.getLogger("uncaught").critical(
        "uncaught exception", exc_info=(kind, exc, tb), extra={"fields": {}}
    )


MAX_RECENT_LINE = 2048
"""A kept line longer than this is cut (and says so)."""


class RecentLines(logging.Handler):
    """The newest ``capacity`` log records, as JSON lines, for ``edgectl logs``: a bounded ring
    (memory: at most ``capacity`` x ``MAX_RECENT_LINE``) of the records that reach the root
    logger's level. A record is about the workload its ``workload`` field names, or that of
    its ``replica`` field (edged's ``WORKLOAD-REVISION-SLOT``)."""

    def __init__(self, capacity: int = 1000, *, skip_events: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self._skip = skip_events
        # (time, workload, line)
        self._lines: deque[tuple[float, str, str]] = deque(maxlen=capacity)

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg in self._skip:
            return  # kept elsewhere (edged keeps its workers' output per replica)
        try:
            line = self.format(record)
        except Exception:  # a record that cannot be formatted is not kept
            return
        if len(line) > MAX_RECENT_LINE:
            line = line[: MAX_RECENT_LINE - 12] + " [cut short]"
        fields = getattr(record, "fields", {})
        workload = fields.get("workload") or ""
        if not workload and isinstance(fields.get("replica"), str):
            workload = fields["replica"].rsplit("-", 2)[0]  # edged's WORKLOAD-REVISION-SLOT
        self._lines.append((record.created, str(workload), line))

    def tail(self, count: int, workload: str = "") -> list[str]:
        """The newest ``count`` lines (about ``workload`` only, if given), oldest first."""
        return [line for _, line in self.records(workload)[-count:]] if count > 0 else []

    def records(self, workload: str = "") -> list[tuple[float, str]]:
        """Every kept line (about ``workload`` only, if given) with its time, oldest first."""
        return [(at, line) for at, w, line in self._lines if not workload or w == workload]


def keep_recent_lines(
    capacity: int = 1000, *, skip_events: frozenset[str] = frozenset()
) -> RecentLines:
    """Add a :class:`RecentLines` to the root logger (after :func:`configure_logging`);
    records whose event is in ``skip_events`` are not kept."""
    handler = RecentLines(capacity, skip_events=skip_events)
    logging.getLogger().addHandler(handler)
    return handler
