"""What every group of AdminService calls shares: refusals with a gRPC status code, the
authorization and error translation around each call (:func:`rpc`), and small checks."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import grpc

from edgefleet.errors import CompareFailed, StoreError, ValidationError
from edgefleet.logs import get_logger
from hub.api.auth import Caller, authorize
from hub.decide import apply
from hub.decide.placementview import KIND_PLACEMENT
from hub.decide.presentation import KIND_REGION, KIND_TOKEN
from hub.pki import Role
from hub.state import storekeys
from hub.state.cache import Cache

log = get_logger("hub.api.admin")

LISTED_KINDS: tuple[str, ...] = (
    storekeys.KIND_DEVICE,
    storekeys.KIND_MODEL,
    *apply.OBJECT_KINDS,
    KIND_TOKEN,
    KIND_REGION,
    KIND_PLACEMENT,
)


class Refused(Exception):
    """A call refused with a gRPC status code and a message that says why."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(message)


def invalid(message: str) -> Refused:
    return Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(kind: str, name: str) -> Refused:
    return Refused(grpc.StatusCode.NOT_FOUND, f'{kind} "{name}" not found')


def check_kind(kind: str) -> None:
    if kind not in LISTED_KINDS:
        raise invalid(f"unknown kind {kind!r}: must be one of {', '.join(LISTED_KINDS)}")


def problems_text(exc: ValidationError) -> str:
    """Every problem on its own line (one problem: one line)."""
    lines = [str(p) for p in exc.problems]
    if len(lines) == 1:
        return lines[0]
    return f"{len(lines)} problems:\n" + "\n".join(f"  - {line}" for line in lines)


def name_of(doc: Mapping[str, Any]) -> str:
    return str(doc.get("metadata", {}).get("name", ""))


class AdminAuth:
    """Who may call AdminService: an admin certificate of this hub's region, not revoked."""

    def __init__(self, cache: Cache, *, region: str) -> None:
        self._cache = cache
        self._region = region

    async def __call__(self, context: Any) -> Caller:
        return await authorize(
            context, region=self._region, revoked=self._cache.revoked, roles={Role.ADMIN}
        )


class _Group(Protocol):
    authorize: AdminAuth


G = TypeVar("G", bound=_Group)
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[[G, Req, Any], Awaitable[Resp]]


def rpc(fn: Handler[G, Req, Resp]) -> Handler[G, Req, Resp]:
    """Authorize, run, and turn refusals and store failures into gRPC statuses."""

    @functools.wraps(fn)
    async def handle(self: G, request: Req, context: Any) -> Resp:
        await self.authorize(context)
        try:
            return await fn(self, request, context)
        except Refused as exc:
            await context.abort(exc.code, exc.message)
        except CompareFailed as exc:
            await context.abort(
                grpc.StatusCode.ABORTED,
                f"changed concurrently, nothing was written; try again ({exc})",
            )
        except StoreError as exc:
            log.error("admin store failed", method=fn.__name__, error=str(exc))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the hub's store failed: {exc}")
        raise AssertionError("unreachable: context.abort raises")

    return handle


def refuse_root_owned(kind: str, name: str, value: bytes, what: str) -> None:
    """A regional hub's objects that came from its root hub change only at the root
    (hub.controllers.parentlink): FAILED_PRECONDITION, also while the root is unreachable."""
    generation = storekeys.federated_generation(value)
    if generation is not None:
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{kind} {name} is owned by the root hub (federation, generation {generation}): "
            f"{what} it at the root; a regional hub keeps enforcing it meanwhile",
        )


def model_users(cache: Cache, model: tuple[str, str]) -> list[str]:
    """The deployments that ask for ``model``, or whose rollout still sends it to devices."""
    users = {
        name
        for name, dep in cache.deployments.items()
        if (dep.spec.model.name, dep.spec.model.version) == model
    }
    for name, state in cache.rollouts.items():
        for number, what in ((state.stable, "stable"), (state.revision, "current")):
            revision = cache.revisions.get(name, {}).get(number)
            if name not in users and revision is not None and revision.model == model:
                users.add(f"{name} ({what} revision {number})")
    return sorted(users)


def model_records(cache: Cache) -> dict[str, storekeys.ModelRecord]:
    """The pushed models by their listed name (``NAME-VERSION``)."""
    return {
        f"{m.name}-{m.version}": m
        for m in sorted(cache.models.values(), key=lambda m: (m.name, m.version))
    }
