"""The device's power state for ``spec.power``: its local time of day and its battery.

* Local time: the wall clock in ``[power] timeZone`` (empty: the system's local time).
* Battery: ``psutil.sensors_battery()``; no battery (or no way to read it) is "not on
  battery". Read at most once per ``BATTERY_CACHE_S``: the reconciler asks per workload.
* Test-only seams (nothing else reads them): ``EDGED_TEST_LOCAL_TIME`` names a file holding
  the local time as ``HH:MM`` or ``HH:MM:SS``, used instead of the clock while it is readable;
  ``EDGED_TEST_BATTERY`` names a file holding ``PERCENT on-battery|plugged``. They let the
  scenario tests open a power window without waiting for the wall clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import datetime
from zoneinfo import ZoneInfo

import psutil

from edged.reconcile.precision import PowerState

TEST_LOCAL_TIME_ENV = "EDGED_TEST_LOCAL_TIME"
TEST_BATTERY_ENV = "EDGED_TEST_BATTERY"
BATTERY_CACHE_S = 5.0


def _read_small(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None


def _parse_local_time(text: str) -> float | None:
    parts = text.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        return None
    if len(numbers) not in (2, 3) or not 0 <= numbers[0] < 24 or not 0 <= numbers[1] < 60:
        return None
    seconds = numbers[2] if len(numbers) == 3 else 0
    if not 0 <= seconds < 60:
        return None
    return numbers[0] * 3600.0 + numbers[1] * 60.0 + seconds


class PowerReader:
    """``read() -> PowerState``, for the workload reconciler."""

    def __init__(
        self,
        time_zone: str = "",
        *,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._zone = ZoneInfo(time_zone) if time_zone else None
        self._wall = wall_clock
        self._monotonic = monotonic
        self._battery: tuple[float, bool, float | None] | None = None  # (read at, on, percent)

    def read(self) -> PowerState:
        on_battery, percent = self._read_battery()
        return PowerState(self._local_seconds(), on_battery, percent)

    def _local_seconds(self) -> float:
        path = os.environ.get(TEST_LOCAL_TIME_ENV)
        if path:
            text = _read_small(path)
            seconds = _parse_local_time(text) if text is not None else None
            if seconds is not None:
                return seconds
        now = datetime.fromtimestamp(self._wall(), self._zone) if self._zone else None
        local = now if now is not None else datetime.fromtimestamp(self._wall())
        return local.hour * 3600.0 + local.minute * 60.0 + local.second + local.microsecond / 1e6

    def _read_battery(self) -> tuple[bool, float | None]:
        now = self._monotonic()
        if self._battery is not None and now - self._battery[0] < BATTERY_CACHE_S:
            return self._battery[1], self._battery[2]
        on, percent = _battery()
        self._battery = (now, on, percent)
        return on, percent


def _battery() -> tuple[bool, float | None]:
    path = os.environ.get(TEST_BATTERY_ENV)
    if path:
        text = _read_small(path)
        if text is not None:
            fields = text.split()
            try:
                return len(fields) == 2 and fields[1] == "on-battery", float(fields[0])
            except (ValueError, IndexError):
                return False, None
    try:
        battery = psutil.sensors_battery()
    except (OSError, RuntimeError, AttributeError):  # no sensors on this platform
        return False, None
    if battery is None:
        return False, None
    return not battery.power_plugged, float(battery.percent)
