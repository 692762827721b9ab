"""The A/B launcher systemd starts (docs/agent-updates.md): stdlib only. Written in issue 32."""

from __future__ import annotations


def main() -> int:
    raise SystemExit("edged-launcher: not built yet")
