"""Conditions, as Kubernetes objects carry them in ``status.conditions``: a type, a status
(True, False or Unknown), a CamelCase reason and a message for a person. The one condition type
of the project: edged's workloads and the hub's deployments both report them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"

    @classmethod
    def of(cls, value: bool) -> ConditionStatus:
        return cls.TRUE if value else cls.FALSE

    def __bool__(self) -> bool:
        """Only True is true (a plain ``str`` "False" would be truthy: a trap)."""
        return self is ConditionStatus.TRUE


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: ConditionStatus
    reason: str
    message: str = ""

    def to_json(self) -> dict[str, str]:
        return {
            "type": self.type,
            "status": self.status.value,
            "reason": self.reason,
            "message": self.message,
        }
