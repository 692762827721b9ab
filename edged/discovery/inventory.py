"""Effects: host facts and health samples through psutil (and ``platform``)."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import psutil

from edged.discovery.hardware import DeviceFacts, HealthSample, normalize_arch

# Sensor chips that measure the CPU (package or die), most specific first.
_CPU_CHIPS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal", "soc_thermal")


def read_facts() -> DeviceFacts:
    return DeviceFacts(
        arch=normalize_arch(platform.machine()),
        cpu_count=os.cpu_count() or 1,
        memory_total_bytes=psutil.virtual_memory().total,
        kernel=platform.release(),
        os=platform.system().lower() or "linux",
    )


def cpu_temperature() -> float | None:
    """The CPU's temperature in °C (hottest sensor of the CPU chip), if the device has one."""
    try:
        chips = psutil.sensors_temperatures()
    except (OSError, AttributeError):
        return None
    for name in _CPU_CHIPS:
        readings = [t.current for t in chips.get(name, ()) if t.current is not None]
        if readings:
            return float(max(readings))
    for name, entries in chips.items():  # thermal zones named otherwise (e.g. x86_pkg_temp)
        if "cpu" in name or "pkg" in name or "soc" in name:
            readings = [t.current for t in entries if t.current is not None]
            if readings:
                return float(max(readings))
    return None


def read_sample(data_dir: Path, *, boot_time: float | None = None) -> HealthSample:
    boot = boot_time if boot_time is not None else psutil.boot_time()
    try:
        disk_free: int | None = psutil.disk_usage(str(data_dir)).free
    except OSError:
        disk_free = None
    battery = None
    try:
        battery = psutil.sensors_battery()
    except (OSError, AttributeError):
        pass
    return HealthSample(
        uptime_s=max(0.0, time.time() - boot),
        memory_available_bytes=psutil.virtual_memory().available,
        disk_free_bytes=disk_free,
        cpu_temperature_c=cpu_temperature(),
        load=os.getloadavg(),
        battery_percent=None if battery is None else float(battery.percent),
        on_battery=None if battery is None else not battery.power_plugged,
    )
