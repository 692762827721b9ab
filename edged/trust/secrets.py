"""Secrets on the device: opened with the identity key, written to a tmpfs, swapped atomically.

The hub sends each Secret a workload mounts sealed to this device's identity key
(:mod:`edgefleet.sealing`). :class:`SecretVolumes` opens them and writes, per workload and
secret, ``<root>/<workload>/<secret>/``::

    ..v3-1a2b3c4d/        the values of version 3 (directory 0500, files 0400)
    ..data -> ..v3-1a2b3c4d
    tls.key -> ..data/tls.key      one link per key

A new version is written beside the old one and ``..data`` is replaced by ``rename(2)`` (as
Kubernetes does): a reader sees the old set or the new one, never a mix, and no worker
restarts. ``<root>`` (0700) must be on a tmpfs (values never reach a disk) unless the config
allows otherwise (tests). Workers run as edged's user, so file modes cannot tell one worker
from another: the kernel does, through each worker's Landlock rules, which grant read access to
``<root>/<its workload>`` only (``runtime/sandboxing.py``).

A Secret with ``spec.requireTpm`` (the flag is bound in the seal) is opened only when this
device holds a TPM attestation key the hub bound to its TPM's endorsement key
(``D/identity/ak.json``, kept only when the hub bound it): otherwise the workload mounting it
is refused with :class:`SecretTpmRequired`'s reason, whatever the hub sent.

The sealed secrets (ciphertext only) are kept in ``D/state/secrets.json`` so that after a
reboot (the tmpfs is empty) the files are written again without the hub. No value is ever
logged, reported or written anywhere else.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import secrets as random_tokens
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from edged.trust.tpmattesting import AK_FILE
from edgefleet.errors import EdgefleetError
from edgefleet.logs import get_logger
from edgefleet.persisting import read_json, write_json_atomic
from edgefleet.sealing import SealedForDevice, SealError, open_from_hub, public_key_of

log = get_logger(__name__)

TMPFS_MAGIC = 0x01021994
RAMFS_MAGIC = 0x858458F6
DATA_LINK = "..data"


class SecretsUnavailable(EdgefleetError):
    """The secrets directory cannot be used (not a tmpfs, owned by another user...)."""


class SecretTpmRequired(EdgefleetError):
    """A Secret that requires a TPM reached a device with no EK-bound attestation key."""


def default_root(data_dir: Path, runtime_dir: Path | None) -> Path:
    """``$RUNTIME_DIRECTORY/secrets`` under systemd, else a directory of this user and data
    directory in /dev/shm."""
    if runtime_dir is not None:
        return runtime_dir / "secrets"
    digest = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:12]
    return Path("/dev/shm") / f"edged-{os.getuid()}-{digest}"


def filesystem_type(path: Path) -> int:
    """``f_type`` of statfs(2) for ``path`` (Linux)."""

    class _Statfs(ctypes.Structure):
        _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 256)]

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    buf = _Statfs()
    if libc.statfs(str(path).encode(), ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(path))
    return int(buf.f_type) & 0xFFFFFFFF


def on_tmpfs(path: Path) -> bool:
    return filesystem_type(path) in (TMPFS_MAGIC, RAMFS_MAGIC)


def workload_dir(root: Path, workload: str) -> Path:
    return root / workload


def secret_dir(root: Path, workload: str, name: str) -> Path:
    return root / workload / name


class SecretVolumes:
    """The device's secret files (see the module doc)."""

    def __init__(
        self,
        root: Path,
        *,
        data_dir: Path,
        device_name: str,
        allow_non_tmpfs: bool = False,
        identity: Any = None,
        tpm: str = "off",
        worker_uids: bool = False,
    ) -> None:
        """``identity``: the key that opens the secrets (default: the file identity key of
        ``data_dir``, loaded at the first use). ``tpm``: ``trust.tpm``, the TPM whose sealing
        key opens the Secrets that require a TPM. ``worker_uids``: workers may run as uids of
        their own (edged is root); they read their secrets through a descriptor of its
        directory opened while they were root, so the files below ``<root>/<workload>/`` are
        readable to all (0444, directories 0555 and 0755) while ``<root>`` and
        ``<root>/<workload>`` (0700) let nobody else reach them by path."""
        self._modes = _SHARED_MODES if worker_uids else _OWNER_MODES
        self.root = root
        self._state = data_dir / "state" / "secrets.json"
        self._identity_dir = data_dir
        self._device = device_name
        self._allow_non_tmpfs = allow_non_tmpfs
        self._tpm = tpm
        self._sealed: dict[str, SealedForDevice] = {}
        self._opened: dict[tuple[str, int], dict[str, bytes]] = {}
        self._identity: Any = identity
        self.problem: str = ""  # why no secret can be written here (status)
        # workloads of the last write whose secret the hub did not send (withdrawn: deleted at
        # the hub, or this device is no longer trusted): they must not keep running on it
        self.withheld: set[str] = set()
        self._load()

    # -- the directory ----------------------------------------------------------------------
    def _check_root(self) -> None:
        root = self.root
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = root.lstat()
        if root.is_symlink() or not root.is_dir():
            raise SecretsUnavailable(f"{root} is not a directory")
        if st.st_uid != os.getuid():
            raise SecretsUnavailable(f"{root} belongs to uid {st.st_uid}, not edged's")
        if st.st_mode & 0o077:
            os.chmod(root, 0o700)
        if not self._allow_non_tmpfs and not on_tmpfs(root):
            raise SecretsUnavailable(
                f"{root} is not on a tmpfs: secret values would reach a disk (set [secrets] dir "
                "to a tmpfs directory such as /run/edged/secrets)"
            )

    # -- persisted sealed secrets ---------------------------------------------------------------
    def _load(self) -> None:
        doc = read_json(self._state)
        if not isinstance(doc, dict):
            return
        try:
            for item in doc.get("sealed", []):
                s = SealedForDevice.from_json(item)
                self._sealed[s.name] = s
        except (KeyError, TypeError, ValueError):
            log.warning("secrets state unreadable", path=str(self._state))
            self._sealed = {}

    def _save(self) -> None:
        write_json_atomic(
            self._state,
            {"sealed": [s.to_json() for _, s in sorted(self._sealed.items())]},
        )

    @property
    def versions(self) -> dict[str, int]:
        return {name: s.version for name, s in sorted(self._sealed.items())}

    # -- opening ----------------------------------------------------------------------------------
    def _open(self, sealed: SealedForDevice) -> dict[str, bytes]:
        if sealed.require_tpm and not (self._identity_dir / AK_FILE).exists():
            raise SecretTpmRequired(
                "requires a TPM (spec.requireTpm) and this device is software-attested (no TPM "
                f"attestation key bound to its endorsement key in {self._identity_dir / AK_FILE})"
                ": not opened"
            )
        cached = self._opened.get((sealed.name, sealed.version))
        if cached is not None:
            return cached
        if sealed.require_tpm:
            values = self._open_in_tpm(sealed)
        else:
            values = self._open_with_identity(sealed)
        self._opened = {
            k: v for k, v in self._opened.items() if k[0] != sealed.name
        }  # only the newest version of each stays in memory
        self._opened[(sealed.name, sealed.version)] = values
        return values

    def _open_in_tpm(self, sealed: SealedForDevice) -> dict[str, bytes]:
        """A Secret that requires a TPM: sealed to the TPM sealing key, opened by ECDH in the
        TPM (the identity file key does not open it)."""
        from edged.trust.identity import resolve_tcti
        from edged.trust.tpmattesting import TpmAttestationError, TpmSealingKey

        tcti = resolve_tcti(self._tpm)
        if tcti is None:
            raise SecretTpmRequired(
                f"requires a TPM (spec.requireTpm) and trust.tpm ({self._tpm!r}) selects none "
                "on this device: not opened"
            )
        try:
            with TpmSealingKey(self._identity_dir, tcti) as key:
                return open_from_hub(
                    key.exchange, public_key_of(key.public_key_pem()), self._device, sealed
                )
        except TpmAttestationError as exc:
            raise SecretTpmRequired(f"requires a TPM (spec.requireTpm): {exc}") from None

    def _open_with_identity(self, sealed: SealedForDevice) -> dict[str, bytes]:
        if self._identity is None:
            from edged.trust.identity import load_or_create_identity

            # the file key, whatever trust.tpm says: it is the key the hub seals to (the TLS
            # key of the stream); a TPM identity key refuses ECDH (TpmIdentity.exchange)
            self._identity = load_or_create_identity(self._identity_dir, tpm="off")
        ident = self._identity
        return open_from_hub(
            ident.exchange, public_key_of(ident.public_key_pem()), self._device, sealed
        )

    # -- one desired state ----------------------------------------------------------------------
    def update(
        self,
        sealed: Iterable[SealedForDevice],
        mounts: Mapping[str, tuple[str, ...]],
    ) -> dict[str, str]:
        """Take the hub's sealed secrets (replacing those held) and write, for each workload
        of ``mounts`` (workload -> secret names), its secrets' files. Returns the workloads
        that cannot have theirs, with why; their files are left as they were."""
        received = {s.name: s for s in sealed}
        if received != self._sealed or (received and not self._state.exists()):
            self._sealed = received
            self._save()
        return self.write(mounts)

    def write(self, mounts: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
        """Write the files of ``mounts`` from the sealed secrets held (at start: after a
        reboot emptied the tmpfs). Workloads that cannot have theirs, with why."""
        problems: dict[str, str] = {}
        self.withheld = set()
        if not any(mounts.values()):
            return problems
        try:
            self._check_root()
            self.problem = ""
        except (OSError, SecretsUnavailable) as exc:
            self.problem = str(exc)
            log.error("secrets directory unusable", path=str(self.root), error=str(exc))
            return {w: self.problem for w, names in mounts.items() if names}
        for workload, names in sorted(mounts.items()):
            for name in names:
                sealed = self._sealed.get(name)
                if sealed is None:
                    self.withheld.add(workload)
                    problems[workload] = (
                        f"secret {name} has not been received (missing at the hub, or withheld: "
                        "the device is not trusted while a SecurityBaseline requires attestation)"
                    )
                    break
                try:
                    values = self._open(sealed)
                    self._materialize(secret_dir(self.root, workload, name), sealed.version, values)
                except (SealError, OSError, EdgefleetError) as exc:
                    problems[workload] = f"secret {name} version {sealed.version}: {exc}"
                    log.error(
                        "secret not written",
                        workload=workload,
                        secret=name,
                        version=sealed.version,
                        error=str(exc),
                    )
                    break
        return problems

    def _materialize(self, path: Path, version: int, values: Mapping[str, bytes]) -> None:
        """The files of ``version`` at ``path``, swapped in atomically (no-op when there)."""
        secret_mode, version_mode, file_mode = self._modes
        path.parent.mkdir(mode=0o700, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path, secret_mode)
        link = path / DATA_LINK
        current = os.readlink(link) if link.is_symlink() else ""
        prefix = f"..v{version}-"
        if current.startswith(prefix) and all((path / current / k).is_file() for k in values):
            for key in values:  # modes of another setting (edged was root, or not, before)
                os.chmod(path / current / key, file_mode)
            os.chmod(path / current, version_mode)
            return
        target = f"{prefix}{random_tokens.token_hex(4)}"
        staged = path / target
        staged.mkdir(mode=0o700)
        for key, value in values.items():
            fd = os.open(staged / key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            try:
                os.write(fd, value)
                os.fchmod(fd, file_mode)
            finally:
                os.close(fd)
        os.chmod(staged, version_mode)
        tmp_link = path / f"..data.{random_tokens.token_hex(4)}"
        os.symlink(target, tmp_link)
        os.rename(tmp_link, link)  # the swap: atomic
        for key in values:
            key_link = path / key
            if not key_link.is_symlink():
                os.symlink(f"{DATA_LINK}/{key}", key_link)
        for entry in path.iterdir():
            name = entry.name
            if name.startswith("..v") and name != target:
                _remove_tree(entry)
            elif not name.startswith("..") and name not in values:
                entry.unlink()  # a key the new version does not have
        log.info("secret written", path=str(path), version=version, keys=len(values))

    def remove_except(self, mounts: Mapping[str, tuple[str, ...]]) -> None:
        """Remove the files of every workload and secret not in ``mounts``."""
        if not self.root.is_dir():
            return
        for wdir in self.root.iterdir():
            keep = mounts.get(wdir.name, ())
            if not keep:
                _remove_tree(wdir)
                continue
            for sdir in wdir.iterdir():
                if sdir.name not in keep:
                    _remove_tree(sdir)

    def status(self) -> dict[str, Any]:
        """Names and versions only."""
        return {
            "dir": str(self.root),
            "held": self.versions,
            **({"problem": self.problem} if self.problem else {}),
        }


# (secret directory, version directory, file) modes
_OWNER_MODES = (0o700, 0o500, 0o400)  # workers run as edged's user
_SHARED_MODES = (0o755, 0o555, 0o444)  # workers of their own uids, below a 0700 <root>/<workload>


def _remove_tree(path: Path) -> None:
    """Remove ``path`` (read-only directories made writable first)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
        return
    for dirpath, dirnames, _ in os.walk(path):
        os.chmod(dirpath, 0o700)
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if not os.path.islink(full):
                os.chmod(full, 0o700)
    shutil.rmtree(path, ignore_errors=True)
