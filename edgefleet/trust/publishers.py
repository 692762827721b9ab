"""Publishers per deployment: which publisher keys may sign the artifacts of which deployments
(``spec.publishers`` of the SecurityBaselines; docs/trust.md, "Publishers per deployment").

Pure. The fleet trust root says which keys may sign artifacts at all, and TUF's delegations
which model names each publisher may sign; a baseline narrows that per deployment (by name
pattern or labels). An artifact of a deployment is admitted only when, for **every** baseline
that lists publishers, the rules covering the deployment name

* a threshold (the trust root's artifacts threshold) of the keys whose signatures on the
  artifact's envelope are valid, and
* with TUF, a threshold (the delegation's) of the keys of the delegated targets role that
  lists the artifact: the publisher python-tuf took it from.

Apart from baselines, with TUF the artifact's envelope must be signed by a threshold of the
keys of that very role (:func:`check_signed_by_role`): any key of the trust root's artifacts
role is not enough, or a publisher delegated ``vision-*`` could re-sign another publisher's
``audio-x`` (issue 29, item 9). A delegated key reaches only its delegated names.

A deployment no rule of such a baseline covers gets no publisher: ``PublisherNotAllowed``.
Baselines only narrow: a hub that drops one gives back only what the offline-signed trust
root and TUF delegations allow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from edgefleet.api.baselines import PublisherRule, SecurityBaseline
from edgefleet.errors import TrustError
from edgefleet.trust.envelopes import Envelope, valid_signers


@dataclass(frozen=True, slots=True)
class DelegatedRole:
    """The TUF role whose targets list an artifact: its name, key ids and threshold, and
    the raw Ed25519 public keys of those ids as its delegator names them (``keys``)."""

    name: str
    keyids: frozenset[str]
    threshold: int
    keys: Mapping[str, bytes] = field(default_factory=dict, compare=False)


def _short(keys: Iterable[str]) -> str:
    return ", ".join(k[:16] + "..." for k in sorted(keys)) or "none"


def allowed_keys(
    rules: Sequence[PublisherRule], deployment: str, labels: Mapping[str, str]
) -> frozenset[str]:
    """The keys the rules that cover the deployment name (empty: no rule covers it)."""
    out: set[str] = set()
    for rule in rules:
        if rule.covers(deployment, labels):
            out.update(rule.keys)
    return frozenset(out)


def check_publisher(
    baselines: Iterable[SecurityBaseline],
    *,
    what: str,
    deployment: str,
    labels: Mapping[str, str],
    signers: frozenset[str],
    threshold: int,
    role: DelegatedRole | None = None,
) -> None:
    """Raise ``PublisherNotAllowed`` unless every baseline that lists publishers allows the
    artifact (``what``: "det 1.0.0") for ``deployment``: ``signers`` are the key ids with a
    valid signature on its envelope, ``threshold`` the artifacts role's; ``role`` the TUF
    delegated role that lists it, when the device uses TUF."""
    for baseline in baselines:
        rules = baseline.spec.publishers
        if rules is None:
            continue
        allowed = allowed_keys(rules, deployment, labels)
        source = f"SecurityBaseline {baseline.name}"
        if not allowed:
            raise TrustError(
                "PublisherNotAllowed",
                f"{what}: no rule of {source}'s spec.publishers covers deployment "
                f"{deployment!r}, so no publisher may sign its artifacts",
            )
        by_allowed = signers & allowed
        if len(by_allowed) < threshold:
            raise TrustError(
                "PublisherNotAllowed",
                f"{what}: signed by key(s) {_short(signers)}, which {source} does not allow "
                f"for deployment {deployment!r} ({len(by_allowed)} of the {threshold} "
                f"signature(s) needed are by allowed keys: {_short(allowed)})",
            )
        if role is not None and len(role.keyids & allowed) < role.threshold:
            raise TrustError(
                "PublisherNotAllowed",
                f"{what}: listed by TUF publisher role {role.name!r} (keys "
                f"{_short(role.keyids)}, threshold {role.threshold}), which {source} does "
                f"not allow for deployment {deployment!r} (allowed keys: {_short(allowed)})",
            )


def check_signed_by_role(env: Envelope, role: DelegatedRole, *, what: str) -> None:
    """Raise ``SignerNotDelegated`` unless a threshold of the keys of ``role`` — the TUF
    role whose targets list the artifact — signed its envelope ``env`` (pure; ``what``:
    "audio-x 1.0.0"). Called on top of the trust root's artifacts threshold, never instead."""
    by_role = valid_signers(env, role.keys, role.keyids)
    if len(by_role) >= role.threshold:
        return
    signed = frozenset(kid for kid, _ in env.signatures)
    raise TrustError(
        "SignerNotDelegated",
        f"{what}: the signed metadata is signed by key(s) {_short(signed)}, but the TUF role "
        f"{role.name!r} that lists it needs {role.threshold} signature(s) by its own keys "
        f"({_short(role.keyids)}), {len(by_role)} valid: a publisher signs only the model "
        "names delegated to it",
    )


def known_key_problems(
    baseline: SecurityBaseline, known: frozenset[str], *, prefix: str = ""
) -> list[tuple[str, str]]:
    """``(field path, message)`` for every key a baseline's publishers name that is not a
    publisher key the hub knows (``known``: the trust root's artifacts keys and the keys of
    the TUF delegations)."""
    problems = []
    for i, rule in enumerate(baseline.spec.publishers or ()):
        for j, kid in enumerate(rule.keys):
            if kid not in known:
                problems.append(
                    (
                        f"{prefix}spec.publishers[{i}].keys[{j}]",
                        f"key {kid} is not a publisher key of this hub's trust root or TUF "
                        "delegations (edgectl keys generate prints a key's id)",
                    )
                )
    return problems
