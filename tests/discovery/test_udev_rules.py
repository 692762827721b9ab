"""packaging/udev rules: a syntax check (systemd 252 has no ``udevadm verify``) and coverage.

The check follows udev(7): each rule is comma-separated ``KEY[{attr}]OP"value"`` pairs, with
match keys (``==``/``!=``) and assignment keys (``=``, ``+=``, ``-=``, ``:=``) from the known set;
GOTO targets must exist as LABELs.
"""

from __future__ import annotations

import re
from pathlib import Path

RULES = Path(__file__).parents[2] / "packaging" / "udev" / "70-edgefleet-accelerators.rules"

MATCH_KEYS = {
    "ACTION",
    "DEVPATH",
    "KERNEL",
    "KERNELS",
    "NAME",
    "SYMLINK",
    "SUBSYSTEM",
    "SUBSYSTEMS",
    "DRIVER",
    "DRIVERS",
    "TAG",
    "TAGS",
    "TEST",
    "PROGRAM",
    "RESULT",
    "CONST",
}
MATCH_ATTR_KEYS = {"ATTR", "ATTRS", "SYSCTL", "ENV", "TEST", "CONST"}
ASSIGN_KEYS = {
    "NAME",
    "SYMLINK",
    "OWNER",
    "GROUP",
    "MODE",
    "TAG",
    "RUN",
    "LABEL",
    "GOTO",
    "IMPORT",
    "OPTIONS",
    "SECLABEL",
}
ASSIGN_ATTR_KEYS = {"ENV", "ATTR", "SYSCTL", "RUN", "IMPORT", "SECLABEL"}
PAIR = re.compile(r'\s*([A-Z_]+)(?:\{([^}]+)\})?\s*(==|!=|\+=|-=|:=|=)\s*"([^"]*)"\s*(?:,|$)')


def parse(text: str) -> list[list[tuple[str, str | None, str, str]]]:
    rules = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pairs, pos = [], 0
        while pos < len(line):
            m = PAIR.match(line, pos)
            assert m, f"line {number}: cannot parse at column {pos + 1}: {line[pos : pos + 40]!r}"
            key, attr, op, value = m.groups()
            if op in ("==", "!="):
                ok = key in (MATCH_ATTR_KEYS if attr else MATCH_KEYS)
            else:
                ok = key in (ASSIGN_ATTR_KEYS if attr else ASSIGN_KEYS)
            assert ok, f"line {number}: {key}{'{' + attr + '}' if attr else ''} {op} is invalid"
            if key == "MODE" and op != "==":
                assert re.fullmatch(r"0[0-7]{3}", value), f"line {number}: MODE {value!r}"
            pairs.append((key, attr, op, value))
            pos = m.end()
        rules.append(pairs)
    return rules


def test_rules_parse_and_gotos_have_labels() -> None:
    rules = parse(RULES.read_text())
    labels = {v for r in rules for k, _, _, v in r if k == "LABEL"}
    gotos = {v for r in rules for k, _, _, v in r if k == "GOTO"}
    assert gotos <= labels


def test_the_checker_rejects_broken_rules() -> None:
    for bad in (
        'SUBSYSTEM="drm", MODE="0660"x',
        'KERNL=="x", MODE="0660"',
        'MODE="660"',
        'ATTR{vendor}=="0x10de" GROUP="edged"',
    ):
        try:
            parse(bad)
        except AssertionError:
            continue
        raise AssertionError(f"accepted: {bad}")


def test_each_kind_is_tagged_with_access_for_edged() -> None:
    rules = parse(RULES.read_text())
    text = RULES.read_text()
    granting = [r for r in rules if ("GROUP", None, "=", "edged") in r]
    assert granting and all(("MODE", None, "=", "0660") in r for r in granting)
    for needle in [
        'ATTRS{vendor}=="0x10de"',
        'ATTRS{vendor}=="0x1002"',
        'ATTRS{vendor}=="0x8086"',
        "nvidia[0-9]*",
        "nvhost-ctrl-gpu",
        'SUBSYSTEM=="accel"',
        "hailo_chardev",
        "RKNPU",
        'SUBSYSTEM=="apex"',
        '"1a6e"',
        '"18d1"',
        '"03e7"',
        "2150|2485|f63b",
    ]:
        assert needle in text, needle
    classes = {v for r in rules for k, a, _, v in r if k == "ENV" and a == "EDGEFLEET_ACCELERATOR"}
    assert classes == {"gpu", "npu", "tpu", "vpu"}
    tagged = [r for r in rules if ("TAG", None, "+=", "edgefleet") in r]
    assert len(tagged) >= 10
