"""``python -m edged.launcher``: the launcher (:mod:`edged.launcher`)."""

from edged.launcher.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
