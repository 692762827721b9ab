"""Logs are events: a constant message plus key-value fields.

``log = get_logger(__name__)``; ``log.info("worker started", model="mnist", pid=123)``.
JSON lines when stderr is not a terminal (journald, files), ``msg key=value`` on a terminal.
"""

from __future__ import annotations

import logging
import sys
import time
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


def get_logger(name: str) -> EventLogger:
    return EventLogger(logging.getLogger(name))


def _clean(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: ("<redacted>" if k in _SECRET_KEYS else v) for k, v in fields.items()}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        out.update(_clean(getattr(record, "fields", {})))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        fields = " ".join(f"{k}={v}" for k, v in _clean(getattr(record, "fields", {})).items())
        line = f"{stamp} {record.levelname.lower():7} {record.getMessage()}"
        if fields:
            line += "  " + fields
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(level: str = "info", *, json_output: bool | None = None) -> None:
    """Set up the root logger once, at process start (never at import)."""
    if json_output is None:
        json_output = not sys.stderr.isatty()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_output else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
