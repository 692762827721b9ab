"""What an admin does from the dashboard (docs/dashboard.md, "Actions"): pause, resume,
promote, abort and undo a ModelDeployment's or an AgentUpgrade's rollout.

Each goes through the very function the admin API's ``RolloutAction`` runs,
:meth:`hub.api.admin.rollouts.Rollouts.perform` (the dashboard authorized the viewer already,
:mod:`hub.api.dashboard.serving`), so a button does exactly what ``edgectl rollout VERB``
does, refusals included, and the hub's own events name the admin as the actor. A verb the
admin API does not know (no such ``RolloutActionRequest`` action) would be shown disabled as
"not supported yet", never as a button that does nothing. Each action done is also recorded
as a ``DashboardAction`` event naming the admin who acted, how they were let in and the
certificate serial.

Forms are POST only with a CSRF token (:meth:`DashboardAccess.csrf_token`); the checks are in
the serving module, which alone sees requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from edgefleet.errors import CompareFailed, StoreError
from edgefleet.logs import get_logger
from edgefleet.v1 import admin_pb2
from hub.api.admin.common import Refused
from hub.api.dashboard.access import Viewer

if TYPE_CHECKING:
    from hub.api.admin.rollouts import Rollouts
    from hub.state.writer import DeviceWriter

log = get_logger(__name__)

MODEL_DEPLOYMENT = "ModelDeployment"
AGENT_UPGRADE = "AgentUpgrade"
MAX_REVISION = 10**9


@dataclass(frozen=True, slots=True)
class Verb:
    """One action: its URL segment, the admin API's action, its button and what it does."""

    name: str
    action: str  # RolloutActionRequest.Action's name
    label: str
    help: str
    kinds: tuple[str, ...] = ("ModelDeployment", "AgentUpgrade")  # the admin API's, for it

    @property
    def supported(self) -> bool:
        """Whether this hub's admin API knows the action (see the module doc)."""
        return hasattr(admin_pb2.RolloutActionRequest, self.action)

    def supported_for(self, kind: str) -> bool:
        """Whether the admin API does it for ``kind`` (Rollouts.perform refuses promote,
        abort and restart of an AgentUpgrade as not supported yet)."""
        return self.supported and kind in self.kinds


VERBS: dict[str, Verb] = {
    v.name: v
    for v in (
        Verb("pause", "PAUSE", "Pause", "stop moving devices to the new revision"),
        Verb(
            "resume",
            "RESUME",
            "Resume",
            "go on after a pause; after a rollback, roll the same revision out again",
        ),
        Verb(
            "promote",
            "PROMOTE",
            "Promote",
            "skip the remaining pauses of the canary steps (full: every remaining step, the "
            "analysis no longer rolling it back)",
            ("ModelDeployment",),
        ),
        Verb(
            "abort",
            "ABORT",
            "Abort",
            "send every device back to the stable revision and stay there until the next change",
            ("ModelDeployment",),
        ),
        Verb(
            "undo",
            "UNDO",
            "Undo",
            "apply an older revision again (empty: the stable one), rolled out as a new revision",
        ),
        Verb(
            "restart",
            "RESTART",
            "Restart",
            "roll the current revision out again",
            ("ModelDeployment",),
        ),
    )
}


class ActionFailed(Exception):
    """An action the hub refused or could not do: an HTTP status and a message for people."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


HTTP_OF = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.UNAVAILABLE: 503,
}


class RolloutActions:
    """Runs an admin's action on a rollout (module doc) and records who did it."""

    def __init__(self, rollouts: Rollouts, writer: DeviceWriter) -> None:
        self.rollouts = rollouts  # the admin API's group of rollout calls
        self.writer = writer  # the event naming who acted

    async def act(
        self,
        kind: str,
        name: str,
        verb: Verb,
        viewer: Viewer,
        to_revision: int = 0,
        *,
        full: bool = False,
    ) -> str:
        """Do ``verb`` on ``kind``/``name`` for ``viewer``; what was done, for a person.
        Raises :class:`ActionFailed` with the admin API's reason when refused."""
        if not verb.supported_for(kind):
            raise ActionFailed(501, f"rollout {verb.name} of an {kind}: not supported yet")
        if not 0 <= to_revision <= MAX_REVISION:
            raise ActionFailed(400, f"to: must be a revision number, got {to_revision}")
        actor = f'admin "{viewer.name}" on the dashboard'
        try:
            message = await self.rollouts.perform(
                kind,
                name,
                verb.name,
                actor=actor,
                to_revision=to_revision if verb.name == "undo" else 0,
                full=full and verb.name == "promote",
            )
        except Refused as exc:
            raise ActionFailed(HTTP_OF.get(exc.code, 409), exc.message) from None
        except CompareFailed:
            raise ActionFailed(
                409, f"{name} changed meanwhile, nothing was done; try again"
            ) from None
        except StoreError as exc:
            log.error("dashboard action: the store failed", kind=kind, name=name, error=str(exc))
            raise ActionFailed(503, f"the hub's store failed: {exc}") from None
        self.writer.event(
            kind,
            name,
            "Normal",
            "DashboardAction",
            f"rollout {verb.name} by admin {viewer.name} on the dashboard (signed in with "
            f"{'a token' if viewer.via == 'token' else 'a client certificate'}, certificate "
            f"serial {viewer.serial}): {message}",
        )
        log.info("dashboard action", kind=kind, name=name, verb=verb.name, admin=viewer.name)
        return message
