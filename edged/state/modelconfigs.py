"""A workload's model configuration on the device: checked, then written atomically as
read-only files that its worker reads (docs/model-config.md, "On the device").

The hub sends each workload's merged config in the desired state
(:meth:`edged.sources.hub.HubSource.apply` writes it): :class:`ConfigVolumes` takes a merged
config (the
``{"data": ..., "files": ...}`` document of :class:`edgefleet.api.modelconfigs.MergedConfig`),
checks it again (its bounds, its file names, the publisher's schema when the artifact carries
one: :mod:`edgefleet.configschemas`) and only then writes, per workload::

    <root>/<workload>/
        ..v-<digest12>-<random>/      one version (directory 0555, files 0444)
            config.json               the whole document, canonical JSON
            files/<name>              each file of spec.files
        ..data -> ..v-...             replaced by rename(2): a reader sees one version whole
        config.json -> ..data/config.json
        files -> ..data/files

as Kubernetes swaps a ConfigMap volume: a reader that opens ``config.json`` gets the old
version or the new one, never a mix, and nothing restarts. The worker is told the path in
:data:`ENV_CONFIG` (and the directory in :data:`ENV_CONFIG_DIR`); Landlock grants it read
access to ``<root>/<its workload>`` only. ``<root>`` is on the data directory's disk (a config
is no secret): the last verified version survives a reboot and hub loss as it is, and
:meth:`ConfigVolumes.clean` removes what a kill -9 left half written.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgefleet.api.modelconfigs import (
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_MERGED_BYTES,
    canonical_json,
    config_digest,
)
from edgefleet.configschemas import ConfigSchema
from edgefleet.errors import EdgefleetError
from edgefleet.logs import get_logger
from edgefleet.modelprocessing import ProcessingInvalid, read_processing

log = get_logger(__name__)

ENV_CONFIG = "EDGEFLEET_MODEL_CONFIG"
"""The worker's environment: the path of its ``config.json``."""
ENV_CONFIG_DIR = "EDGEFLEET_MODEL_CONFIG_DIR"
"""The worker's environment: the directory with ``config.json`` and ``files/``."""

DATA_LINK = "..data"
CONFIG_FILE = "config.json"
FILES_DIR = "files"
_VERSION_PREFIX = "..v-"


def config_root(data_dir: Path) -> Path:
    """Where the workloads' configurations are: on the data directory's disk."""
    return Path(data_dir) / "configs"


def static_device_name(data_dir: Path) -> str:
    """This device's name for the ModelConfigs of its static manifests: the name it enrolled
    with (``<data-dir>/hub/link.json``), else the one its hostname makes
    (:func:`edgefleet.devicenames.name_from_hostname`), else ``""``."""
    import socket

    from edgefleet.devicenames import name_from_hostname

    link = Path(data_dir) / "hub" / "link.json"
    try:
        doc = json.loads(link.read_text())
    except FileNotFoundError:
        doc = None  # not enrolled: the hostname's name is the device's name
    except (OSError, ValueError) as exc:
        # Not fatal here (the hub link refuses the file itself, loudly), but said: a device
        # enrolled under another name would render its static configs under the hostname's.
        log.warning("static configs named by hostname", why="link.json unreadable",
                    path=str(link), error=str(exc))  # fmt: skip
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("deviceName"), str):
        return str(doc["deviceName"])
    if doc is not None:
        log.warning("static configs named by hostname", why="link.json names no deviceName",
                    path=str(link))  # fmt: skip
    return name_from_hostname(socket.gethostname()) or ""


def config_volumes(data_dir: Path) -> ConfigVolumes:
    """The device's volumes, with what a kill -9 left half written removed."""
    volumes = ConfigVolumes(config_root(data_dir))
    volumes.clean()
    return volumes


class ConfigRefused(EdgefleetError):
    """A config the device will not give a worker; the message names each problem's path."""


def _check(document: Mapping[str, Any], schema: ConfigSchema | None) -> tuple[bytes, str]:
    """The canonical bytes and digest of a config a worker may see; ConfigRefused otherwise."""
    if set(document) != {"data", "files"}:
        raise ConfigRefused("a config is a document of data and files, nothing else")
    data, files = document["data"], document["files"]
    if not isinstance(data, Mapping) or not isinstance(files, Mapping):
        raise ConfigRefused("data and files must be mappings")
    raw = canonical_json(document)
    if len(raw) > MAX_MERGED_BYTES:
        raise ConfigRefused(f"the config is {len(raw)} bytes, more than {MAX_MERGED_BYTES}")
    if len(files) > MAX_FILES:
        raise ConfigRefused(f"files: at most {MAX_FILES}, got {len(files)}")
    for name, text in files.items():
        if (
            not isinstance(name, str)
            or name.startswith(".")
            or not name
            or len(name) > 128
            or any(not (c.isalnum() and c.isascii()) and c not in "._-" for c in name)
        ):
            raise ConfigRefused(f"files[{json.dumps(name)}]: not a plain file name")
        if not isinstance(text, str) or len(text.encode()) > MAX_FILE_BYTES:
            raise ConfigRefused(f"files[{json.dumps(name)}]: must be text of at most "
                                f"{MAX_FILE_BYTES} bytes")  # fmt: skip
    try:  # the processing stage the worker applies: its shape (its fit: the worker's check)
        read_processing(data)
    except ProcessingInvalid as exc:
        raise ConfigRefused(f"the config's processing is invalid: {exc}") from None
    if schema is not None:
        problems = schema.problems(data)
        if problems:
            raise ConfigRefused(
                "the config does not validate against the model's config schema: "
                + "; ".join(f"{p.path}: {p.message}" for p in problems)
            )
    return raw, config_digest(document)


class ConfigVolumes:
    """Per-workload config directories under ``root`` (module doc)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def workload_dir(self, workload: str) -> Path:
        if not workload or "/" in workload or workload.startswith("."):
            raise ConfigRefused(f"{workload!r} is not a workload name")
        return self.root / workload

    def config_path(self, workload: str) -> Path:
        """What :data:`ENV_CONFIG` says to the workload's worker."""
        return self.workload_dir(workload) / CONFIG_FILE

    def write(self, workload: str, document: Mapping[str, Any], schema: ConfigSchema | None) -> str:
        """Check ``document`` (ConfigRefused: nothing changes, the last good one stays), then
        make it the workload's config in one rename; its digest. Unchanged: nothing written."""
        raw, digest = _check(document, schema)
        if self.digest(workload) == digest:
            return digest
        base = self.workload_dir(workload)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o755)
        base.mkdir(exist_ok=True, mode=0o755)
        version = base / f"{_VERSION_PREFIX}{digest[7:19]}-{secrets.token_hex(4)}"
        version.mkdir(mode=0o755)
        (version / FILES_DIR).mkdir(mode=0o755)
        _write_file(version / CONFIG_FILE, raw)
        for name, text in document["files"].items():
            _write_file(version / FILES_DIR / name, str(text).encode())
        for d in (version / FILES_DIR, version):
            _fsync_dir(d)
            d.chmod(0o555)
        for link, target in ((CONFIG_FILE, f"{DATA_LINK}/{CONFIG_FILE}"),
                             (FILES_DIR, f"{DATA_LINK}/{FILES_DIR}")):  # fmt: skip
            if not (base / link).is_symlink():
                _replace_link(base / link, target)
        _replace_link(base / DATA_LINK, version.name)
        _fsync_dir(base)
        self._drop_old(base, keep=version.name)
        return digest

    def digest(self, workload: str) -> str | None:
        """The digest of the config the workload's worker reads now; None: none."""
        try:
            raw = (self.workload_dir(workload) / DATA_LINK / CONFIG_FILE).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return config_digest(json.loads(raw))

    def ensure(self, workload: str) -> Path:
        """The workload's directory, made (empty) if need be: a worker's sandbox grants it
        before any config is there, so that one written later is readable without a restart."""
        base = self.workload_dir(workload)
        base.mkdir(parents=True, exist_ok=True, mode=0o755)
        return base

    def remove_except(self, workloads: set[str]) -> None:
        """Remove the directories of every workload not in ``workloads``."""
        if self.root.is_dir():
            for base in self.root.iterdir():
                if base.name not in workloads and not base.name.startswith("."):
                    self.remove(base.name)

    def clear(self, workload: str) -> None:
        """The workload has no config any more: its files go, its directory stays (a running
        worker's sandbox is bound to that directory, and a config given later is seen
        there)."""
        base = self.workload_dir(workload)
        if not base.is_dir():
            return
        for link in (CONFIG_FILE, FILES_DIR, DATA_LINK):
            if (base / link).is_symlink():
                (base / link).unlink()
        self._drop_old(base, keep="")

    def remove(self, workload: str) -> None:
        base = self.workload_dir(workload)
        if base.exists():
            _make_writable(base)
            shutil.rmtree(base)

    def clean(self) -> None:
        """Remove the versions no ``..data`` points at (a write cut short by kill -9)."""
        if not self.root.is_dir():
            return
        for base in self.root.iterdir():
            if base.is_dir() and not base.is_symlink():
                link = base / DATA_LINK
                keep = os.readlink(link) if link.is_symlink() else ""
                self._drop_old(base, keep=keep)

    @staticmethod
    def _drop_old(base: Path, *, keep: str) -> None:
        for entry in base.iterdir():
            if entry.name.startswith(_VERSION_PREFIX) and entry.name != keep:
                _make_writable(entry)
                shutil.rmtree(entry, ignore_errors=True)


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_link(link: Path, target: str) -> None:
    tmp = link.with_name(f".{link.name}.{secrets.token_hex(4)}")
    os.symlink(target, tmp)
    os.rename(tmp, link)


def _make_writable(path: Path) -> None:
    for dirpath, dirnames, _ in os.walk(path):
        os.chmod(dirpath, 0o755)
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if not os.path.islink(full):
                os.chmod(full, 0o755)
