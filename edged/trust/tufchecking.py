"""The checks of the signed metadata the hub sends, made before any byte of an artifact is
fetched: the fleet's trust roots, TUF and the baselines' publishers.

:class:`HubMetadataChecks` holds what one desired state is checked with:

1. the fleet's trust roots the state carries, followed from the root this device trusts
   (:meth:`~HubMetadataChecks.accept_roots`; a root that does not chain is refused, the root
   in force stays, and the hub cannot make one);
2. the TUF metadata, refreshed from the hub once per desired state
   (:meth:`~HubMetadataChecks.refresh_tuf`, python-tuf's client of :mod:`edged.trust.tufclient`
   in a thread): with TUF in use, every file of an artifact must be in a publisher's delegated
   targets, the role whose targets list it must have signed the artifact's envelope, and only a
   rollback allowance in that role's targets counts;
3. the publishers the fleet's SecurityBaselines allow (``spec.publishers``) for a deployment.

:meth:`~HubMetadataChecks.verify` runs them all for one artifact, with the gate's own checks
(root, threshold, expiry, no rollback: :meth:`edged.trust.admitting.ArtifactGate.verify_remote`).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import orjson

from edged.trust.admitting import ArtifactGate
from edged.trust.tufclient import FetchAsync, TufClient, sync_fetch
from edgefleet.api import ModelDeployment, SecurityBaseline
from edgefleet.errors import ArtifactError, TemporaryError, TrustError
from edgefleet.logs import get_logger
from edgefleet.trust.documents import ROLE_ARTIFACTS, ArtifactMetadata, FileInfo, parse_artifact
from edgefleet.trust.envelopes import (
    ARTIFACT_TYPE,
    decode_payload,
    parse_envelope_bytes,
    valid_signers,
)
from edgefleet.trust.publishers import check_publisher, check_signed_by_role
from edgefleet.trust.verifying import TrustState, verify_artifact_metadata

log = get_logger(__name__)

MAX_ROOTS = 1000  # trust roots in one desired state (a chain of rotations)


def envelope_subject(envelope: bytes) -> tuple[str, str] | None:
    """The (name, version) an artifact metadata envelope claims, read without trusting it."""
    try:
        doc = orjson.loads(envelope)
        payload = orjson.loads(base64.b64decode(doc["payload"]))
        return str(payload["name"]), str(payload["version"])
    except (ValueError, KeyError, TypeError):
        return None


def lists_publishers(baselines: tuple[SecurityBaseline, ...]) -> bool:
    """Whether any baseline lists publishers (``spec.publishers``)."""
    return any(b.spec.publishers is not None for b in baselines)


class HubMetadataChecks:
    def __init__(self, gate: ArtifactGate, tuf: TufClient | None = None) -> None:
        """``gate``: the device's trust root and trust state; ``tuf``: the device's TUF client
        (None: this device does not use TUF)."""
        self._gate = gate
        self._tuf = tuf
        # python-tuf's updater of this desired state (refreshed once per desired state), or
        # the refusal every artifact gets when TUF is required and its metadata was refused
        self._tuf_updater: Any = None
        self.tuf_refusal: ArtifactError | None = None

    # -- the trust roots -------------------------------------------------------------------
    def accept_roots(self, roots: list[bytes], now: float) -> TrustError | None:
        """The hub's roots, followed from the root this device trusts (before the state's
        artifacts are verified, so a rotation applies to them). A refusal keeps the root in
        force and is returned."""
        try:
            if len(roots) > MAX_ROOTS:
                raise TrustError("MalformedEnvelope", f"more than {MAX_ROOTS} roots")
            envs = [parse_envelope_bytes(r, what=f"trust_roots[{i}]") for i, r in enumerate(roots)]
            self._gate.accept_root_envelopes(envs, now, origin="the hub's trust roots")
        except TrustError as exc:
            return exc
        return None

    # -- TUF -------------------------------------------------------------------------------
    async def refresh_tuf(self, tuf_fetch: FetchAsync | None) -> None:
        """Update the TUF metadata from the hub once for this desired state (python-tuf's
        client in a thread, fetching over the hub link). TemporaryError: retry later."""
        self._tuf_updater = None
        self.tuf_refusal = None
        if self._tuf is None:
            return
        if tuf_fetch is None:
            if self._tuf.active or self._gate.state.tuf_root_version:
                self.tuf_refusal = ArtifactError(
                    "NoTufRepository", "TUF is required and no TUF metadata can be fetched"
                )
            return
        fetch = sync_fetch(tuf_fetch, asyncio.get_running_loop())
        floor = self._gate.state.tuf_root_version
        try:
            self._tuf_updater = await asyncio.to_thread(
                self._tuf.refresh, fetch, self._gate.root, floor=floor
            )
        except ArtifactError as exc:
            log.error("tuf metadata refused", reason=exc.reason, message=str(exc))
            self.tuf_refusal = exc
            return
        if self._tuf_updater is not None:
            self._gate.accept_tuf_root(await asyncio.to_thread(self._tuf.root_version))

    @property
    def tuf_in_use(self) -> bool:
        """Whether this device uses TUF: it holds a TUF root, its image requires TUF, or its
        trust state recorded one (then only TUF's rollback allowances count)."""
        if self._tuf is None:
            return False
        return self._tuf.active or bool(self._gate.state.tuf_root_version)

    def check_tuf(self, meta: ArtifactMetadata, envelope: bytes) -> None:
        """Every file of the artifact is in a publisher's delegated targets, when TUF is in
        use, and the role whose targets list it signed ``envelope`` (ArtifactError otherwise;
        TemporaryError when a delegated role could not be fetched)."""
        if self.tuf_refusal is not None:
            raise self.tuf_refusal
        if self._tuf_updater is not None and self._tuf is not None:
            TufClient.check(self._tuf_updater, meta)
            check_signed_by_role(
                parse_envelope_bytes(envelope, what="signed metadata"),
                self._tuf.publisher_role(meta),
                what=f"{meta.name} {meta.version}",
            )

    # -- publishers ------------------------------------------------------------------------
    def check_publisher(
        self,
        deployment: ModelDeployment,
        baselines: tuple[SecurityBaseline, ...],
        envelope: bytes,
        meta: ArtifactMetadata,
    ) -> None:
        """The baselines' ``spec.publishers`` allow the keys that signed the artifact (and,
        with TUF, the publisher role that lists it) for ``deployment``
        (``PublisherNotAllowed``). Called after the envelope and the TUF targets passed."""
        if not lists_publishers(baselines):
            return
        root = self._gate.root
        if root is None:  # verify_remote refused it already; never admit without a root
            raise ArtifactError("NoTrustRoot", "no trust root to check the publisher with")
        role = root.role(ROLE_ARTIFACTS)
        env = parse_envelope_bytes(envelope, what="signed metadata")
        tuf_role = None
        if self._tuf is not None and self._tuf_updater is not None:
            tuf_role = self._tuf.publisher_role(meta)
        check_publisher(
            baselines,
            what=f"{meta.name} {meta.version}",
            deployment=deployment.metadata.name,
            labels=deployment.metadata.labels,
            signers=valid_signers(env, root.keys, role.keyids),
            threshold=role.threshold,
            role=tuf_role,
        )

    # -- one artifact ----------------------------------------------------------------------
    async def verify(
        self,
        envelope: bytes,
        deployment: ModelDeployment,
        baselines: tuple[SecurityBaseline, ...],
        *,
        name: str,
        version: str,
        allowance: bytes | None,
        now: float,
    ) -> tuple[ArtifactMetadata, FileInfo]:
        """Every check of an artifact's signed metadata before it is fetched: the gate's (root,
        threshold, expiry, no rollback, with TUF's rollback allowance when TUF is in use), the
        TUF targets and the publishers. ArtifactError names the refusal."""
        grant = None
        if self._tuf_updater is not None:
            grant = await asyncio.to_thread(TufClient.rollback_grant, self._tuf_updater, envelope)
        meta, info = self._gate.verify_remote(
            envelope,
            name=name,
            version=version,
            allowance=allowance,
            now=now,
            grant=grant,
            tuf=self.tuf_in_use,
        )
        await asyncio.to_thread(self.check_tuf, meta, envelope)
        await asyncio.to_thread(self.check_publisher, deployment, baselines, envelope, meta)
        return meta, info

    def verify_held(self, envelope: bytes, now: float) -> bool:
        """Whether an envelope this device accepted before still verifies under the root in
        force (signatures, threshold, expiry), without the rollback checks: going back to it
        is not a rollback of what the device accepted."""
        try:
            parsed = parse_envelope_bytes(envelope, what="signed metadata")
            verify_artifact_metadata(self._gate.root, parsed, now=now, state=TrustState())
        except ArtifactError:
            return False
        return True

    async def in_targets(
        self,
        envelope: bytes,
        deployment: ModelDeployment,
        baselines: tuple[SecurityBaseline, ...],
    ) -> bool:
        """Whether an envelope already verified is in a publisher's targets (when TUF is in
        use) and from a publisher the baselines allow for ``deployment``: going back to an
        earlier artifact needs the current signed set and the current baselines to allow it."""
        if (
            self.tuf_refusal is None
            and self._tuf_updater is None
            and not lists_publishers(baselines)
        ):
            return True
        env = parse_envelope_bytes(envelope, what="signed metadata")
        meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="metadata"))
        try:
            await asyncio.to_thread(self.check_tuf, meta, envelope)
            await asyncio.to_thread(self.check_publisher, deployment, baselines, envelope, meta)
        except (ArtifactError, TemporaryError):
            return False
        return True

    def status(self) -> dict[str, Any]:
        """The TUF client's part of the hub source's status (none without TUF)."""
        return self._tuf.status() if self._tuf is not None else {}
