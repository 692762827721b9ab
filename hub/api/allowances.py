"""Signed rollback allowances, carried by the hub to the devices that need them.

A device refuses a model version older than the highest it accepted unless a **rollback
allowance** signed by the fleet's artifact keys (``edgectl rollback allow``) names exactly
that model name, version and model file (docs/trust.md). Going back to the version a device
ran just before needs none (it still holds that envelope); anything older does, e.g. ``rollout
undo --to-revision`` two versions back.

AdminService ``PushRollbackAllowance`` (:meth:`AllowanceReceiver.receive`, called after the
admin check): the envelope is verified here with the devices' own code against the hub's trust root
(threshold of artifacts-role signatures, the rollback type, not expired), its model must be
pushed with the very bytes it names; then it is kept in the model's record (one
compare-and-swap), an event is recorded and every device is projected again: a device sent
that model version gets the allowance with its metadata (:mod:`hub.decide.desired`). A newer
allowance for the same version replaces the older; deleting the model deletes it.

A hub with a TUF repository (its own or relayed) refuses them: its devices honour only the
allowance a publisher puts in its own delegated targets (``edgectl models push
--allow-rollback``), which TUF binds to the model names delegated to that publisher.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import grpc

from edgefleet.errors import CompareFailed, TrustError
from edgefleet.logs import get_logger
from edgefleet.trust.documents import ROLE_ARTIFACTS, RollbackAllowance, Root, parse_rollback
from edgefleet.trust.envelopes import (
    ROLLBACK_TYPE,
    decode_payload,
    parse_envelope_bytes,
    require_threshold,
)
from edgefleet.trust.verifying import TUF_ALLOWANCE_FIELD, verify_initial_root
from hub.api.push import PushRefused
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.store import Store
from hub.state.trustroots import HubRoots
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

MAX_ALLOWANCE_BYTES = 64 * 1024


def verify_allowance(
    root: Root, envelope: bytes, now: float, *, tuf: bool = False
) -> RollbackAllowance:
    """The allowance, if the fleet's artifact keys signed it and it has not expired (pure).
    ``tuf``: this hub keeps (or relays) a TUF repository, so its devices honour only the
    allowance in the publisher's own targets, and a separate envelope is refused
    (``RollbackAllowanceNotInTargets``): any artifacts key may sign one, also a publisher's
    that is not delegated the model name."""
    what = "rollback allowance"
    if tuf:
        raise TrustError(
            "RollbackAllowanceNotInTargets",
            f"{what}: this hub keeps a TUF repository, and its devices honour only a rollback "
            "allowance in the publisher's own delegated targets (custom "
            f"{TUF_ALLOWANCE_FIELD} of the model's target), never a separate envelope: "
            "the publisher pushes that model version again with "
            "edgectl models push FILE --name N --version V --allow-rollback DURATION",
        )
    env = parse_envelope_bytes(envelope, what=what)
    role = root.role(ROLE_ARTIFACTS)
    require_threshold(env, root.keys, role.keyids, role.threshold, what=what)
    allow = parse_rollback(decode_payload(env, expected_type=ROLLBACK_TYPE, what=what), what=what)
    if now >= allow.expires:
        raise TrustError(
            "RollbackAllowanceExpired", f"{what} for {allow.name} {allow.version}: expired"
        )
    return allow


class AllowanceReceiver:
    """Verifies and keeps rollback allowances (the module doc); hub.server builds it with
    what it uses."""

    def __init__(
        self,
        store: Store,
        cache: Cache,
        writer: DeviceWriter,
        *,
        tuf: Callable[[], TufRepository | RelayedTuf | None],
    ) -> None:
        self.store = store
        self.cache = cache  # its trust roots verify allowances; its models hold them
        self.writer = writer
        self.tuf = tuf  # the TUF repository held now: with one, allowances are refused

    async def receive(self, envelope: bytes, *, now: float) -> tuple[RollbackAllowance, bool]:
        """Verify and keep an allowance; (it, whether it changed what the hub holds). Refusals
        are :class:`hub.api.push.PushRefused`."""
        if len(envelope) > MAX_ALLOWANCE_BYTES:
            raise PushRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                "AllowanceTooLarge",
                f"envelope: at most {MAX_ALLOWANCE_BYTES} bytes, got {len(envelope)}",
            )
        trust_root = HubRoots(self.cache.trust_roots).current
        if not trust_root:
            raise PushRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                "NoTrustRoot",
                "this hub has no trust root (D/trust-root.json): it cannot check who signed it",
            )
        try:
            root = verify_initial_root(
                parse_envelope_bytes(trust_root, what="the hub's trust root"),
                now,
                what="the hub's trust root",
            )
            allow = verify_allowance(root, envelope, now, tuf=self.tuf() is not None)
        except TrustError as exc:
            code = (
                grpc.StatusCode.FAILED_PRECONDITION
                if exc.reason == "RollbackAllowanceNotInTargets"
                else grpc.StatusCode.INVALID_ARGUMENT
            )
            raise PushRefused(code, exc.reason, str(exc)) from None
        what = f"{allow.name} {allow.version}"
        model = self.cache.models.get((allow.name, allow.version))
        if model is None:
            raise PushRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                "ModelNotPushed",
                f"model {what} has not been pushed: push it first (edgectl models push), then its "
                "rollback allowance",
            )
        if model.sha256 != allow.sha256:
            raise PushRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                "RollbackAllowanceMismatch",
                f"the allowance names other bytes (sha256 {allow.sha256}) than the pushed model "
                f"{what} (sha256 {model.sha256})",
            )
        if model.rollback_allowance == envelope:
            return allow, False
        key = storekeys.model_key(allow.name, allow.version)
        current = await self.store.get(key)
        if current is None:
            raise PushRefused(grpc.StatusCode.ABORTED, "ConcurrentChange", f"{what} changed; again")
        stored = storekeys.ModelRecord.from_json(storekeys.loads(current.value))
        record = replace(stored, rollback_allowance=envelope)
        try:
            await self.store.put(
                key, storekeys.dumps(record.to_json()), expect_mod_revision=current.mod_revision
            )
        except CompareFailed:
            raise PushRefused(
                grpc.StatusCode.ABORTED, "ConcurrentChange", f"{what} changed meanwhile; push again"
            ) from None
        self.cache.put_model(record)  # every device is projected again (hub.state.feed)
        self.writer.event(
            storekeys.KIND_MODEL,
            f"{allow.name}-{allow.version}",
            "Normal",
            "RollbackAllowed",
            f"a signed rollback allowance for {what} is sent with it to devices",
        )
        log.info("rollback allowance stored", model=allow.name, version=allow.version)
        return allow, True
