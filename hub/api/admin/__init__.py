"""AdminService (one module per group of calls): what operators (``edgectl``) call, over
mutual TLS with an admin certificate.

Every call is authorized first (:func:`hub.api.auth.authorize` with ``roles={Role.ADMIN}``): a
device or child-hub certificate gets PERMISSION_DENIED, a revoked one UNAUTHENTICATED.

* **Apply** is all or nothing. Documents are parsed and validated first
  (:mod:`hub.decide.apply`: INVALID_ARGUMENT naming ``documents[i].<path>`` for every problem);
  then each object's key is read, canonical equality decides the outcome, and every changed
  object is written in **one** store transaction that compares each key's mod revision as it
  was read. A concurrent change makes it fail whole: ABORTED, retryable. Unchanged objects are
  not written (no revision bump).
* Reads (Get, List, ListEvents) come from the in-memory cache (:class:`hub.state.cache.Cache`, which
  is written through), with store revisions as resource versions; Watch replays the store's
  watch from a revision (List, then Watch from its revision, misses nothing).
* Device commands (Cordon, Uncordon, RevokeDevice, Delete of a Device) change the device
  record and persist it before answering, record an event, and mark the device for
  projection; revocation and deletion close the device's stream.

gRPC status codes: INVALID_ARGUMENT (bad input, nothing written), NOT_FOUND, ABORTED (a
concurrent change; retry), OUT_OF_RANGE (a watch from a compacted revision), UNAVAILABLE (the
store failed); PushArtifact's refusals are listed in docs/trust.md ("The hub side").

Modules: :mod:`~hub.api.admin.servicer` (the servicer, a thin class over the groups),
:mod:`~hub.api.admin.applying` (Apply), :mod:`~hub.api.admin.reading` (Get, List,
ListEvents), :mod:`~hub.api.admin.watching` (Watch), :mod:`~hub.api.admin.deleting` (Delete),
:mod:`~hub.api.admin.devices` (Cordon, Uncordon, DeviceLogs, RevokeDevice, RevokeRegion),
:mod:`~hub.api.admin.rollouts` (ListRevisions, RolloutAction), :mod:`~hub.api.admin.tokens`
(CreateToken, CreateDashboardToken), :mod:`~hub.api.admin.artifacts` (PushArtifact,
PushRollbackAllowance, FetchTufMetadata); :mod:`~hub.api.admin.showing` shows objects and
:mod:`~hub.api.admin.common` holds the refusals and the authorization around each call.
"""

from hub.api.admin.common import LISTED_KINDS, AdminAuth, Refused, problems_text
from hub.api.admin.servicer import AdminServicer

__all__ = ["LISTED_KINDS", "AdminAuth", "AdminServicer", "Refused", "problems_text"]
