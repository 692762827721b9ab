"""The launcher's files (:mod:`edged.launcher`): its journal lines, atomic writes, the slots
(``D/agent/slots/a|b``, complete only with their ``installed.json``), its state
(``D/agent/launcher.json``, :data:`STATE_FORMAT`) and edged's data directory. Stdlib only:
edged.agent reads the same files through this module."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

STATE_FORMAT = 1
SLOTS = ("a", "b")
PACKAGE = "package"
DEFAULT_DATA_DIR = "/var/lib/edged"
DEFAULT_MAX_TRIES = 3
DEFAULT_COMMIT_DEADLINE_S = 300.0
MAX_REQUEST_BYTES = 64 << 10


def _log(text: str) -> None:
    """One line on stderr (the journal); ``<4>``/``<6>`` is its syslog priority."""
    sys.stderr.write(f"<6>edged-launcher: {text}\n")
    sys.stderr.flush()


def _warn(text: str) -> None:
    sys.stderr.write(f"<4>edged-launcher: {text}\n")
    sys.stderr.flush()


# -- files -------------------------------------------------------------------------------------
def write_json_atomic(path: Path, doc: dict[str, Any], between: Any = None) -> None:
    """``doc`` at ``path``, whole or not at all (temp file, fsync, rename, fsync the dir);
    ``between()`` runs before the rename (a test's power cut there)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = json.dumps(doc, indent=2, sort_keys=True).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if between is not None:
        between()
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_small_json(path: Path, limit: int = MAX_REQUEST_BYTES) -> dict[str, Any]:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def slot_dir(data_dir: Path, slot: str) -> Path:
    return data_dir / "agent" / "slots" / slot


def slot_version(data_dir: Path, slot: str, package_version: str = "") -> str | None:
    """The release a slot holds, or None when it is not completely installed: its
    ``installed.json`` (the installer's last file) must name the version ``release.json`` has.
    The package is always there."""
    if slot == PACKAGE:
        return package_version
    if slot not in SLOTS:
        return None
    root = slot_dir(data_dir, slot)
    try:
        release = _read_small_json(root / "release.json")
        installed = _read_small_json(root / "installed.json")
    except (OSError, ValueError):
        return None
    version = release.get("version")
    if not isinstance(version, str) or not version or installed.get("version") != version:
        return None
    return version if (root / "lib" / "edged").is_dir() else None


# -- state -------------------------------------------------------------------------------------
def empty_state() -> dict[str, Any]:
    return {
        "format": STATE_FORMAT,
        "committed": PACKAGE,
        "committedVersion": "",
        "trying": None,
        "last": None,
        "lastRequest": "",
    }


def read_state(path: Path) -> tuple[dict[str, Any], str]:
    """The state, and a problem ("" when none). An absent file is a device that never updated;
    an unreadable or invalid one falls back to the package (always installed), said loudly."""
    try:
        doc = _read_small_json(path)
    except FileNotFoundError:
        return empty_state(), ""
    except (OSError, ValueError) as exc:
        return empty_state(), f"{path} unreadable ({exc}): running the package"
    state = empty_state()
    committed = doc.get("committed")
    if doc.get("format") != STATE_FORMAT or committed not in (PACKAGE, *SLOTS):
        return state, f"{path} has an unknown format or committed slot: running the package"
    state["committed"] = committed
    state["committedVersion"] = str(doc.get("committedVersion", ""))
    state["lastRequest"] = str(doc.get("lastRequest", ""))
    if isinstance(doc.get("last"), dict):
        state["last"] = doc["last"]
    trying = doc.get("trying")
    if isinstance(trying, dict) and trying.get("slot") in (PACKAGE, *SLOTS):
        try:
            trying["tries"] = int(trying.get("tries", 0))
            trying["maxTries"] = max(1, int(trying.get("maxTries", DEFAULT_MAX_TRIES)))
            trying["commitDeadlineSeconds"] = float(
                trying.get("commitDeadlineSeconds", DEFAULT_COMMIT_DEADLINE_S)
            )
        except (TypeError, ValueError):
            return state, f"{path}: the trial is unreadable: it is dropped"
        state["trying"] = trying
    return state, ""


def data_dir_of(args: list[str], env: dict[str, str]) -> Path:
    """edged's ``--data-dir`` (as ``edged run`` resolves it: the flag, else
    ``$STATE_DIRECTORY``, else /var/lib/edged)."""
    for i, arg in enumerate(args):
        if arg == "--data-dir" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--data-dir="):
            return Path(arg.split("=", 1)[1])
    state = env.get("STATE_DIRECTORY", "").split(":")[0]
    return Path(state) if state.startswith("/") else Path(DEFAULT_DATA_DIR)
