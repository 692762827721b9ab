"""Line charts of a soak run's series as PNG files, with the standard library only (zlib):
RSS and open descriptors of every process, inference errors per device, over the run's time.
No text is drawn: each chart's legend (the colour of each series, the axes' ranges) goes into
the report (``plots`` in report.json, and report.txt)."""

from __future__ import annotations

import itertools
import struct
import zlib
from pathlib import Path
from typing import Any

WIDTH, HEIGHT, MARGIN = 800, 300, 20
PALETTE = [
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
]  # fmt: skip
FAULT_SHADE = (255, 228, 228)


def write_png(path: Path, width: int, height: int, rgb: bytearray) -> None:
    rows = b"".join(
        b"\x00" + bytes(rgb[y * width * 3 : (y + 1) * width * 3]) for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9))
    path.write_bytes(data + chunk(b"IEND", b""))


class Canvas:
    def __init__(self, width: int = WIDTH, height: int = HEIGHT) -> None:
        self.width, self.height = width, height
        self.rgb = bytearray(b"\xff" * width * height * 3)

    def dot(self, x: int, y: int, colour: tuple[int, int, int]) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.rgb[i : i + 3] = bytes(colour)

    def line(self, x0: int, y0: int, x1: int, y1: int, colour: tuple[int, int, int]) -> None:
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            self.dot(x0, y0, colour)
            self.dot(x0, y0 + 1, colour)  # two pixels thick
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy


def line_chart(
    path: Path,
    series: dict[str, list[tuple[float, float] | None]],
    t_end: float,
    windows: list[tuple[float, float]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """One chart of ``series`` (name -> (t, value)) from t=0 to ``t_end``, fault windows
    shaded; the legend returned."""
    c = Canvas()
    values = [p[1] for points in series.values() for p in points if p is not None]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    if high == low:
        high = low + 1.0
    span = max(t_end, 1e-6)

    def x_of(t: float) -> int:
        return MARGIN + int((WIDTH - 2 * MARGIN) * min(max(t / span, 0.0), 1.0))

    def y_of(v: float) -> int:
        return HEIGHT - MARGIN - int((HEIGHT - 2 * MARGIN) * (v - low) / (high - low))

    for begin, end in windows:
        for x in range(x_of(begin), x_of(end) + 1):
            for y in range(MARGIN, HEIGHT - MARGIN):
                c.dot(x, y, FAULT_SHADE)
    grey = (160, 160, 160)
    c.line(MARGIN, HEIGHT - MARGIN, WIDTH - MARGIN, HEIGHT - MARGIN, grey)
    c.line(MARGIN, MARGIN, MARGIN, HEIGHT - MARGIN, grey)
    legend: dict[str, Any] = {"file": path.name, "t": [0, round(t_end, 1)],
                              "y": [round(low, 2), round(high, 2)], "series": {}}  # fmt: skip
    for i, (name, points) in enumerate(sorted(series.items())):
        colour = PALETTE[i % len(PALETTE)]
        legend["series"][name] = "#{:02x}{:02x}{:02x}".format(*colour)
        for a, b in itertools.pairwise(points):
            if a is not None and b is not None:  # None: a restart, the line breaks
                c.line(x_of(a[0]), y_of(a[1]), x_of(b[0]), y_of(b[1]), colour)
    write_png(path, WIDTH, HEIGHT, c.rgb)
    return legend


def plot_run(directory: Path, resources: dict[str, Any], inference_errors: dict[str, Any],
             windows: list[dict[str, Any]], t_end: float,
             lags: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """The run's charts: rss.png (MiB), fds.png, inference-errors.png (cumulative per device),
    and convergence-lag.png (seconds each device has been out of step with the root)."""
    shaded = [(w["begin"], w["end"] if w["end"] is not None else t_end) for w in windows]
    rss = {n: _lives(samples, lambda s: s[2] / 2**20) for n, samples in resources.items()}
    fds = {n: _lives(samples, lambda s: float(s[3])) for n, samples in resources.items()}
    errors: dict[str, list[tuple[float, float] | None]] = {}
    for device, times in inference_errors.items():
        points = [(0.0, 0.0)] + [(t, float(i + 1)) for i, t in enumerate(sorted(times))]
        errors[device] = [*points, (t_end, float(len(times)))]
    charts = [
        line_chart(directory / "rss.png", rss, t_end, shaded),
        line_chart(directory / "fds.png", fds, t_end, shaded),
        line_chart(directory / "inference-errors.png", errors, t_end, shaded),
    ]
    if lags:
        charts.append(line_chart(directory / "convergence-lag.png", lags, t_end, shaded))
    return charts


def _lives(samples: list[Any], value: Any) -> list[tuple[float, float] | None]:
    """(t, value) of each sample, None between two lives of a process (another pid)."""
    out: list[tuple[float, float] | None] = []
    for i, s in enumerate(samples):
        if i and samples[i - 1][1] != s[1]:
            out.append(None)
        out.append((s[0], value(s)))
    return out
