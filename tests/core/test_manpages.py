"""Manual pages generated from the programs' parsers: scripts/gen-manpages writes them, groff
(Debian ``groff-base``) formats them without a warning, and every subcommand and option the
parsers know is on the page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("man")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-manpages"), str(out)],
        check=True,
        capture_output=True,
        env={"SOURCE_DATE_EPOCH": "1800000000", "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    return out


@pytest.mark.parametrize(
    ("page", "texts"),
    [
        ("edgectl.1", ['.TH EDGECTL 1 "2027-01-15"', ".SS edgectl get", "\\-\\-sort\\-by",
                       ".SS edgectl config use\\-context", ".SH EXIT STATUS", "hub\\fR(8)"]),
        ("hub.8", [".TH HUB 8", ".SS hub init", "\\-\\-hub\\-address", ".SS hub serve"]),
        ("edged.8", [".TH EDGED 8", ".SS edged doctor", ".SS edged enroll", "\\-\\-data\\-dir"]),
    ],
)  # fmt: skip
def test_pages_hold_every_command_and_format_cleanly(
    pages: Path, page: str, texts: list[str]
) -> None:
    text = (pages / page).read_text()
    for expected in texts:
        assert expected in text, expected
    checked = subprocess.run(
        ["groff", "-man", "-ww", "-z", "-Tutf8", str(pages / page)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (checked.returncode, checked.stderr) == (0, "")
