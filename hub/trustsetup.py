"""The trust part of ``hub init``: the fleet trust root, and a publisher key for the quickstart.

:func:`quickstart_trust` (the default of ``hub init``) writes::

    D/publisher.key, D/publisher.pub   an Ed25519 publisher key pair (the key 0600)
    D/root.key, D/root.pub             an Ed25519 root key pair (the key 0600)
    D/trust-root.json                  the fleet trust root, version 1, valid for a year:
                                       root role = the root key, artifacts role = the
                                       publisher key, threshold 1, signed by the root key

and adds ``[publisher] key = "D/publisher.key"`` to ``D/admin.toml`` so that
``edgectl models push`` signs with it by default. By default it also keeps a TUF repository
(:func:`make_quickstart_tuf`; ``hub init --no-tuf`` leaves it out).

**This is for a quickstart or a lab.** Keys that sign models and roots belong offline (an
HSM, a signing service, a laptop that never talks to the fleet): the hub is not trusted to
author models, and a hub that holds the publisher key could. In production make the keys and
the root elsewhere (``edgectl keys generate``, ``edgectl trust root create``) and give the hub
only the signed root: ``hub init --trust-root FILE`` (:func:`operator_trust`), which checks
that the root is well-formed, signed by a threshold of its own root keys and not expired, and
copies it. ``hub init --no-trust-root`` makes none; such a hub refuses every push.
"""

from __future__ import annotations

import asyncio
import time
import tomllib
from pathlib import Path

from edgefleet.errors import HubDirError, TrustError
from edgefleet.persisting import write_atomic
from edgefleet.trust import signing
from edgefleet.trust.envelopes import parse_envelope_bytes
from edgefleet.trust.verifying import root_digest, verify_initial_root
from hub import pki
from hub.initializing import HubPaths, TrustSetup

TRUST_ROOT_FILE = "trust-root.json"  # the same name hub.server reads
PUBLISHER_PREFIX = "publisher"
AGENT_PUBLISHER_PREFIX = "agent-publisher"  # signs edged releases (docs/agent-updates.md)
TARGETS_PREFIX = "targets"
LAB_ROLE = "lab"  # the quickstart's delegation: the publisher key, every model name
ROOT_PREFIX = "root"
ROOT_LIFETIME_S = 365 * signing.DAY


def trust_root_path(paths: HubPaths) -> Path:
    return paths.data_dir / TRUST_ROOT_FILE


def publisher_key_path(paths: HubPaths) -> Path:
    return paths.data_dir / f"{PUBLISHER_PREFIX}.key"


def _quoted(path: Path) -> str:
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


def agent_publisher_key_path(paths: HubPaths) -> Path:
    return paths.data_dir / f"{AGENT_PUBLISHER_PREFIX}.key"


def add_publisher_to_admin_config(
    paths: HubPaths, key: Path, *, agent_key: Path | None = None
) -> None:
    """Add ``[publisher] key = ...`` (and ``agentKey``, what ``edgectl agent push`` signs
    with) to admin.toml unless it has a publisher already."""
    text = paths.admin_config.read_text()
    if "publisher" in tomllib.loads(text):
        return
    text += (
        "\n# The publisher key edgectl models push signs with by default (agentKey: edgectl agent\n"
        "# push). Made by hub init for a quickstart: production keeps publisher keys offline,\n"
        "# not next to the hub.\n"
        f"[publisher]\nkey = {_quoted(key.absolute())}\n"
        + (f"agentKey = {_quoted(agent_key.absolute())}\n" if agent_key is not None else "")
    )
    write_atomic(paths.admin_config, text.encode(), mode=0o600)


def make_quickstart_trust(paths: HubPaths, *, now: float | None = None, tuf: bool = False) -> None:
    """Write the publisher and root key pairs and a trust root listing them (module doc);
    with ``tuf``, also a targets key pair (``D/targets.key``) and the TUF repository
    ``D/tuf/`` (:func:`make_quickstart_tuf`)."""
    d = paths.data_dir
    signing.generate_key_pair(d / PUBLISHER_PREFIX)
    signing.generate_key_pair(d / ROOT_PREFIX)
    signing.create_root(
        root_keys=[d / f"{ROOT_PREFIX}.key"],
        artifact_keys=[d / f"{PUBLISHER_PREFIX}.pub"],
        threshold=1,
        expires_in_s=ROOT_LIFETIME_S,
        out=trust_root_path(paths),
        now=now,
    )
    if tuf:
        make_quickstart_tuf(paths, now=now)
    add_publisher_to_admin_config(
        paths,
        publisher_key_path(paths),
        agent_key=agent_publisher_key_path(paths) if tuf else None,
    )


def make_quickstart_tuf(paths: HubPaths, *, now: float | None = None) -> None:
    """The TUF repository of a quickstart (``hub init --tuf``): a TUF root signed by the
    quickstart root key (so devices check it against the fleet root), a targets key
    ``D/targets.key`` that signs the top-level targets, one delegation ``lab`` to the
    quickstart publisher key for every model name, one delegation ``agent`` of edged releases
    (path ``agent/edged/*/*`` only) to the key ``D/agent-publisher.key``, and the hub's online
    key for snapshot and timestamp (``D/tuf/online.key``). Production makes the root, the
    targets and the delegations offline (docs/trust.md, "TUF roles")."""
    from edgefleet.trust import tufmeta
    from edgefleet.trust.agentreleases import AGENT_ROLE
    from hub.state.tufrepo import create_repository

    d = paths.data_dir
    now = time.time() if now is None else now
    signing.generate_key_pair(d / TARGETS_PREFIX)
    signing.generate_key_pair(d / AGENT_PUBLISHER_PREFIX)
    create_repository(
        d,
        root_keys=[d / f"{ROOT_PREFIX}.key"],
        targets_key=d / f"{TARGETS_PREFIX}.key",
        delegations=[
            tufmeta.Delegation(
                LAB_ROLE,
                (signing.load_public_key_raw(d / f"{PUBLISHER_PREFIX}.pub"),),
                1,
                ("*",),
            ),
            tufmeta.Delegation(
                AGENT_ROLE,
                (signing.load_public_key_raw(d / f"{AGENT_PUBLISHER_PREFIX}.pub"),),
                1,
                (),
                agent=True,
            ),
        ],
        now=now,
        root_lifetime_s=ROOT_LIFETIME_S,
        targets_lifetime_s=ROOT_LIFETIME_S,
    )


async def quickstart_trust(paths: HubPaths, ca: pki.CertifiedKey) -> None:
    """The default :data:`~hub.initializing.TrustSetup` of ``hub init`` (see module doc)."""
    await asyncio.to_thread(make_quickstart_trust, paths)


async def quickstart_trust_with_tuf(paths: HubPaths, ca: pki.CertifiedKey) -> None:
    """``hub init --tuf``: the quickstart trust and a TUF repository."""
    await asyncio.to_thread(make_quickstart_trust, paths, tuf=True)


def install_operator_root(paths: HubPaths, source: Path, *, now: float) -> None:
    """Check an operator-made root and copy it to ``D/trust-root.json`` (HubDirError if bad)."""
    try:
        data = Path(source).read_bytes()
    except OSError as exc:
        raise HubDirError(f"--trust-root {source}: cannot read: {exc.strerror}") from None
    try:
        verify_initial_root(parse_envelope_bytes(data, what=str(source)), now)
    except TrustError as exc:
        raise HubDirError(f"--trust-root {source}: {exc.reason}: {exc}") from None
    write_atomic(trust_root_path(paths), data, mode=0o644)


def operator_trust(source: Path) -> TrustSetup:
    """A TrustSetup that installs ``source`` (``hub init --trust-root FILE``)."""

    async def setup(paths: HubPaths, ca: pki.CertifiedKey) -> None:
        install_operator_root(paths, source, now=time.time())

    return setup


def choose_trust_setup(
    *,
    no_trust_root: bool,
    trust_root: Path | None,
    tuf: bool | None = None,
    replicas: bool = False,
) -> TrustSetup | None:
    """What ``hub init`` does about trust, from its options. ``tuf``: None is the default,
    a TUF repository whenever ``hub init`` makes the keys (the quickstart trust); with an
    operator's root (``--trust-root``) the repository comes from the offline ceremony
    (``hub tuf online-key``, ``hub tuf install``), and ``--no-trust-root`` has none.
    ``replicas`` (``--replica-address``): no repository by default; with ``--tuf`` one that
    every replica copies with the data directory, its snapshot and timestamp versions kept
    in the shared store (:mod:`hub.state.sharedtuf`)."""
    if tuf is None:
        tuf = not no_trust_root and trust_root is None and not replicas
    if tuf and (no_trust_root or trust_root is not None):
        raise HubDirError(
            "--tuf: not supported yet with --trust-root or --no-trust-root (it makes a "
            "quickstart TUF repository; for offline keys place the signed TUF files in D/tuf/, "
            "docs/trust.md)"
        )
    if tuf:
        return quickstart_trust_with_tuf
    if no_trust_root:
        return None
    if trust_root is not None:
        return operator_trust(trust_root)
    return quickstart_trust


def root_pin(paths: HubPaths) -> str | None:
    """``sha256:<hex>``, the pin of the hub's current trust root (its payload digest), for
    ``edged enroll --root-hash``; None without a root. A device image that carries the root
    needs no pin; an operator who does not trust this hub's disk takes the pin from the root
    ceremony (``edgectl trust root create`` prints it) instead."""
    root = trust_root_path(paths)
    if not root.exists():
        return None
    try:
        env = parse_envelope_bytes(root.read_bytes(), what=str(root))
    except TrustError:
        return None
    return f"sha256:{root_digest(env)}"


def describe_trust(paths: HubPaths) -> list[str]:
    """Lines for ``hub init``'s output about the trust files it made."""
    root = trust_root_path(paths)
    if not root.exists():
        return ["trust root:       none (artifact pushes will be refused)"]
    lines = [f"trust root:       {root}", f"root hash (pin):  {root_pin(paths)}"]
    if (paths.data_dir / "tuf" / "root.json").exists():
        lines.append(
            f"TUF repository:   {paths.data_dir / 'tuf'}  (snapshot and timestamp signed by "
            "the hub's online key; targets by targets.key, delegated to the publisher key and, "
            "for edged releases, to agent-publisher.key)"
        )
    else:
        lines.append(
            "TUF repository:   none (devices rely on the per-artifact envelopes; install one "
            "from an offline ceremony with hub tuf online-key and hub tuf install)"
        )
    publisher = publisher_key_path(paths)
    if publisher.exists():
        lines.append(
            f"publisher key:    {publisher}  (quickstart only: keep publisher and root keys "
            "offline in production)"
        )
    return lines
