"""Each device's desired record, indexed by the deployments it holds.

:class:`DesiredRecords` is the cache's ``desired`` table (device name -> its
:class:`~hub.state.storekeys.DesiredRecord`, as the projector last wrote it) that also keeps
the reverse index, deployment -> the devices whose record holds it, up to date on every write
(``records[name] = ...``, ``del``, ``pop``, ``clear``, ``update``). A rollout reads "the
devices the projector placed this deployment on" at each reconcile (its views, its analysis,
the devices a step changes); with the index that costs what the deployment has, not what the
fleet has, so one device's report costs in proportion to its own deployments.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, MutableMapping, ValuesView
from typing import TypeVar, overload

from hub.state.storekeys import DesiredRecord

_NONE: frozenset[str] = frozenset()
T = TypeVar("T")


class DesiredRecords(MutableMapping[str, DesiredRecord]):
    """Device name -> desired record, with :meth:`holding` (see the module doc)."""

    __slots__ = ("_holding", "_records")

    def __init__(self) -> None:
        self._records: dict[str, DesiredRecord] = {}
        self._holding: dict[str, set[str]] = {}  # deployment -> device names

    # -- the index --------------------------------------------------------------------------
    def holding(self, deployment: str) -> frozenset[str]:
        """The devices whose desired record holds ``deployment``."""
        devices = self._holding.get(deployment)
        return frozenset(devices) if devices else _NONE

    def by_deployment(self) -> dict[str, frozenset[str]]:
        """Every deployment some record holds -> those devices."""
        return {d: frozenset(names) for d, names in self._holding.items()}

    def _unindex(self, name: str, record: DesiredRecord) -> None:
        for deployment in record.deployments:
            devices = self._holding.get(deployment)
            if devices is not None:
                devices.discard(name)
                if not devices:
                    del self._holding[deployment]

    # -- the mapping ------------------------------------------------------------------------
    def __getitem__(self, name: str) -> DesiredRecord:
        return self._records[name]

    def __setitem__(self, name: str, record: DesiredRecord) -> None:
        before = self._records.get(name)
        if before is not None:
            self._unindex(name, before)
        self._records[name] = record
        for deployment in record.deployments:
            self._holding.setdefault(deployment, set()).add(name)

    def __delitem__(self, name: str) -> None:
        record = self._records.pop(name)
        self._unindex(name, record)

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, name: object) -> bool:
        return name in self._records

    def __repr__(self) -> str:
        return f"DesiredRecords({self._records!r})"

    # the hot reads go to the dict itself, not through the mixins' __getitem__
    @overload
    def get(self, name: str, /) -> DesiredRecord | None: ...
    @overload
    def get(self, name: str, /, default: DesiredRecord | T) -> DesiredRecord | T: ...
    def get(self, name: str, /, default: object = None) -> object:
        return self._records.get(name, default)

    def keys(self) -> KeysView[str]:
        return self._records.keys()

    def values(self) -> ValuesView[DesiredRecord]:
        return self._records.values()

    def items(self) -> ItemsView[str, DesiredRecord]:
        return self._records.items()

    def clear(self) -> None:
        self._records.clear()
        self._holding.clear()
