"""The soak harness (docs/soak.md) uses the end-to-end helpers (tests/e2e: fleet, harness,
rollouttesting...): their folder goes on sys.path as pytest's own does for tests/e2e."""

from __future__ import annotations

import sys
from pathlib import Path

E2E = str(Path(__file__).resolve().parent.parent / "e2e")
if E2E not in sys.path:
    sys.path.append(E2E)
