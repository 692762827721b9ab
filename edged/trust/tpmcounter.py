"""A TPM NV counter under the trust state: restoring an older ``D/trust/`` is detected.

The file checks of :func:`edgefleet.trust.verifying.lost_trust_state` see a trust state that
was deleted or cut in half, not one replaced *whole* by an older copy (a backup of
``D/trust/``): that would lower the highest accepted versions and re-open rollbacks. Where a
TPM exists, a monotonic NV counter (index :data:`NV_INDEX`, 8 bytes, TPM2_NT_COUNTER) counts
every write of the trust state, and the state records the count it was written with:

* write: the state is written with ``tpmCounter = n + 1``, then the counter is incremented
  (a crash between leaves the state one ahead, which the next write brings level);
* load: a counter above the state's ``tpmCounter`` means the state is older than the last
  one written (``TrustStateLost``); a defined counter and no state at all, too.

A counter only goes up, and a counter defined again after being undefined starts at least at
the highest value any counter of that TPM ever had (TPM 2.0, NV_DefineSpace), so undefining it
does not bring it back down. It is read and written with its own (empty) auth value: any
process that can open the TPM can raise it (refusing service, which root can do anyway), none
can lower it.
"""

from __future__ import annotations

from typing import Any

from edgefleet.errors import EdgefleetError
from edgefleet.logs import get_logger

log = get_logger(__name__)

NV_INDEX = 0x01C1EDF0  # owner range (0x01xxxxxx), the edgefleet trust-state counter


class TpmCounterError(EdgefleetError):
    """The TPM could not read or raise the counter."""


def _public() -> Any:
    from tpm2_pytss import TPM2_ALG, TPM2_NT, TPM2B_NV_PUBLIC, TPMA_NV, TPMS_NV_PUBLIC

    attributes = (
        TPMA_NV.AUTHREAD
        | TPMA_NV.AUTHWRITE
        | TPMA_NV.NO_DA
        | (TPM2_NT.COUNTER << TPMA_NV.TPM2_NT_SHIFT)
    )
    return TPM2B_NV_PUBLIC(
        nvPublic=TPMS_NV_PUBLIC(
            nvIndex=NV_INDEX, nameAlg=TPM2_ALG.SHA256, attributes=attributes, dataSize=8
        )
    )


class TpmCounter:
    """The trust-state counter of the TPM at ``tcti`` (opened for each call)."""

    def __init__(self, tcti: str) -> None:
        self.tcti = tcti

    def _open(self) -> Any:
        from tpm2_pytss import ESAPI

        try:
            return ESAPI(self.tcti)
        except Exception as exc:  # tpm2-pytss raises TSS2_Exception and others
            raise TpmCounterError(f"TPM ({self.tcti}): {exc}") from exc

    def read(self) -> int | None:
        """The counter's value; None when it is not defined (or never incremented)."""
        esapi = self._open()
        try:
            try:
                handle = esapi.tr_from_tpmpublic(NV_INDEX)
            except Exception:
                return None  # not defined
            try:
                data = esapi.nv_read(handle, 8, 0, auth_handle=handle)
            except Exception:
                return None  # defined, never incremented (TPM_RC_NV_UNINITIALIZED)
            return int.from_bytes(bytes(data), "big")
        finally:
            esapi.close()

    def increment(self) -> int:
        """Raise the counter (defining it first when needed); its new value."""
        from tpm2_pytss import TPM2B_AUTH

        esapi = self._open()
        try:
            try:
                handle = esapi.tr_from_tpmpublic(NV_INDEX)
            except Exception:
                handle = esapi.nv_define_space(TPM2B_AUTH(), _public())
                log.info("tpm counter defined", index=hex(NV_INDEX))
            esapi.nv_increment(handle, auth_handle=handle)
            data = esapi.nv_read(handle, 8, 0, auth_handle=handle)
            return int.from_bytes(bytes(data), "big")
        except TpmCounterError:
            raise
        except Exception as exc:
            raise TpmCounterError(f"TPM ({self.tcti}): trust-state counter: {exc}") from exc
        finally:
            esapi.close()


def counter_lost(*, tpm_value: int | None, state_exists: bool, state_counter: int) -> str | None:
    """Whether the trust state is older than the TPM counter says (pure): a message, or None.
    ``state_counter``: the ``tpmCounter`` the state was written with (0: never)."""
    if tpm_value is None:
        return None
    if not state_exists:
        return (
            f"the trust state is missing although the TPM counter is at {tpm_value}: it was deleted"
        )
    if tpm_value > state_counter:
        return (
            f"the trust state was written at TPM count {state_counter}, the TPM counter is "
            f"at {tpm_value}: an older copy of the trust state was restored"
        )
    return None
