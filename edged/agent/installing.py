"""Installing a verified edged release into the inactive slot (docs/agent-updates.md, "On the
device"), and refusing one this device cannot run, before anything switches.

The release's bytes already match their signed metadata (edged.hublink.agentreleases); what
is checked here is what is inside: the tarball is extracted member by member into a temporary
directory next to the slots, refusing absolute paths, ``..``, links of any kind, devices and
FIFOs, and bounding the member count, each file's size and the total (a gzip bomb stops at
the bound, not at the disk's end). Every file and directory is fsync'd, ``release.json`` is
checked (format, name, version, platform) and its ``requires`` against the base install
(``RequirementsNotMet``), and ``installed.json`` is written last; then the tree is renamed into
``D/agent/slots/<slot>``. The launcher runs a slot only with its ``installed.json``
(edged.launcher.state.slot_version): a power cut mid-install leaves a temporary directory that the
next install removes, never a half slot.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from edged.hublink.agentreleases import VerifiedRelease
from edged.launcher.state import SLOTS, fsync_dir, slot_dir, write_json_atomic
from edgefleet.errors import EdgefleetError

if TYPE_CHECKING:
    import tarfile

RELEASE_FORMAT = 1
MAX_MEMBERS = 20_000
MAX_FILE_BYTES = 64 << 20
MAX_TOTAL_BYTES = 512 << 20
MAX_NAME_BYTES = 1024
MAX_DEPTH = 32
MAX_RELEASE_JSON_BYTES = 64 << 10
_CHUNK = 1 << 20


class InstallRefused(EdgefleetError):
    """A release this device does not install; ``reason`` is CamelCase for AgentStatus."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Platform:
    arch: str
    python_abi: str

    @classmethod
    def of_this_device(cls) -> Platform:
        return cls(
            platform.machine().lower(), f"cp{sys.version_info.major}{sys.version_info.minor}"
        )


@dataclass(frozen=True, slots=True)
class InstalledSlot:
    slot: str
    version: str
    root: Path


def base_version(distribution: str) -> str | None:
    """The version of ``distribution`` in the base install (None: not installed)."""
    from importlib import metadata  # imported when installing only (docs/edged.md "Footprint")

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def install_release(
    release: VerifiedRelease,
    data_dir: Path,
    slot: str,
    *,
    device: Platform | None = None,
    installed: Callable[[str], str | None] = base_version,
    limits: tuple[int, int, int] = (MAX_MEMBERS, MAX_FILE_BYTES, MAX_TOTAL_BYTES),
) -> InstalledSlot:
    """Install ``release`` into ``slot`` (which must not be the one running or committed: the
    caller picks the inactive one). :class:`InstallRefused` when it cannot be, with the slot
    left as it was."""
    if slot not in SLOTS:
        raise InstallRefused("InvalidSlot", f"slot {slot!r} is not one of {SLOTS}")
    device = device or Platform.of_this_device()
    slots = slot_dir(data_dir, slot).parent
    slots.mkdir(parents=True, exist_ok=True, mode=0o700)
    for leftover in slots.glob(".*"):  # a cut install or a replaced slot: never run
        shutil.rmtree(leftover, ignore_errors=True)
    tmp = slots / f".install-{slot}-{os.getpid()}"
    tmp.mkdir(mode=0o755)
    try:
        count = _extract(release.path, tmp, limits)
        doc = _check_release_json(tmp, release, device, installed)
        if not (tmp / "lib" / "edged" / "__main__.py").is_file():
            raise InstallRefused("InvalidRelease", "the release has no lib/edged/__main__.py")
        write_json_atomic(
            tmp / "installed.json",
            {"version": doc["version"], "sha256": release.sha256, "files": count},
        )
        os.chmod(tmp / "installed.json", 0o644)
        fsync_dir(tmp)
        target = slot_dir(data_dir, slot)
        old = slots / f".old-{slot}-{os.getpid()}"
        if target.exists():
            os.rename(target, old)
        os.rename(tmp, target)
        fsync_dir(slots)
        shutil.rmtree(old, ignore_errors=True)
        return InstalledSlot(slot, release.version, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _extract(archive: Path, root: Path, limits: tuple[int, int, int]) -> int:
    max_members, max_file, max_total = limits
    total = count = 0
    dirs = {root}
    import tarfile  # installing only: an idle edged does without it

    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                count += 1
                if count > max_members:
                    raise InstallRefused(
                        "ReleaseTooLarge", f"more than {max_members} entries in the release"
                    )
                rel = _member_path(member)
                dest = root.joinpath(*rel.parts)
                if member.isdir():
                    dest.mkdir(parents=True, exist_ok=True, mode=0o755)
                    dirs.add(dest)
                    continue
                if not member.isreg():
                    raise InstallRefused(
                        "UnsafeRelease",
                        f"{member.name}: only files and directories are allowed "
                        f"(type {member.type!r}: links, devices and FIFOs are refused)",
                    )
                if member.size > max_file:
                    raise InstallRefused(
                        "ReleaseTooLarge", f"{member.name}: larger than {max_file} bytes"
                    )
                total += member.size
                if total > max_total:
                    raise InstallRefused(
                        "ReleaseTooLarge", f"the release unpacks to more than {max_total} bytes"
                    )
                dest.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
                dirs.add(dest.parent)
                source = tar.extractfile(member)
                assert source is not None  # a regular file
                mode = 0o755 if member.mode & 0o111 else 0o644
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
                try:
                    written = 0
                    while chunk := source.read(_CHUNK):
                        written += len(chunk)
                        if written > member.size:
                            raise InstallRefused("UnsafeRelease", f"{member.name}: size lies")
                        os.write(fd, chunk)
                    os.fsync(fd)
                finally:
                    os.close(fd)
    except (tarfile.TarError, EOFError, OSError, UnicodeError) as exc:
        raise InstallRefused(
            "InvalidRelease", f"the release is not a readable tar.gz: {exc}"
        ) from None
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(d)
    return count


def _member_path(member: tarfile.TarInfo) -> PurePosixPath:
    name = member.name
    if len(name.encode()) > MAX_NAME_BYTES or "\x00" in name or "\\" in name:
        raise InstallRefused("UnsafeRelease", f"{name[:200]!r}: invalid entry name")
    path = PurePosixPath(name)
    parts = [p for p in path.parts if p not in ("", ".")]
    if path.is_absolute() or ".." in parts or not parts or len(parts) > MAX_DEPTH:
        raise InstallRefused("UnsafeRelease", f"{name!r}: paths must stay inside the release")
    if parts[0] not in ("release.json", "lib"):
        raise InstallRefused("UnsafeRelease", f"{name!r}: only release.json and lib/ belong here")
    if member.mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX) and not member.isdir():
        raise InstallRefused("UnsafeRelease", f"{name!r}: setuid, setgid or sticky")
    return PurePosixPath(*parts)


def _check_release_json(
    tmp: Path,
    release: VerifiedRelease,
    device: Platform,
    installed: Callable[[str], str | None],
) -> dict[str, object]:
    path = tmp / "release.json"
    try:
        if path.stat().st_size > MAX_RELEASE_JSON_BYTES:
            raise InstallRefused("InvalidRelease", "release.json is too large")
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise InstallRefused("InvalidRelease", f"release.json: {exc}") from None
    if not isinstance(doc, dict):
        raise InstallRefused("InvalidRelease", "release.json is not an object")
    if doc.get("format") != RELEASE_FORMAT or doc.get("name") != "edged":
        raise InstallRefused("InvalidRelease", "release.json: not an edged release of format 1")
    if doc.get("version") != release.version:
        raise InstallRefused(
            "InvalidRelease",
            f"release.json: version {doc.get('version')!r}, signed as {release.version!r}",
        )
    plat = doc.get("platform")
    plat = plat if isinstance(plat, dict) else {}
    for key, signed, here in (
        ("arch", release.arch, device.arch),
        ("pythonAbi", release.python_abi, device.python_abi),
    ):
        if plat.get(key) != signed:
            raise InstallRefused(
                "InvalidRelease",
                f"release.json: platform.{key} {plat.get(key)!r}, signed {signed!r}",
            )
        if signed != here:
            raise InstallRefused(
                "PlatformMismatch", f"the release is for {key} {signed}, this device is {here}"
            )
    requires = doc.get("requires", {})
    if not isinstance(requires, Mapping) or len(requires) > 500:
        raise InstallRefused("InvalidRelease", "release.json: requires must be a mapping")
    missing = check_requirements({str(k): str(v) for k, v in requires.items()}, installed)
    if missing:
        raise InstallRefused(
            "RequirementsNotMet",
            "the base install lacks what the release was built against: " + "; ".join(missing),
        )
    return doc


def check_requirements(
    requires: Mapping[str, str], installed: Callable[[str], str | None] = base_version
) -> list[str]:
    """What of ``requires`` (distribution -> version) the base install does not have as is."""
    problems = []
    for name, version in sorted(requires.items()):
        if name == "edgefleet":
            continue  # the release itself
        have = installed(name)
        if have != version:
            problems.append(f"{name} {version} (installed: {have or 'none'})")
    return problems
