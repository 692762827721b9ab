"""The accepted desired state, persisted in ``<data-dir>/state/desired.json``.

Accepted means validated and with every artifact in the store. edged loads it before anything
else at start, so after kill -9 or a reboot it serves the same workloads before it reads a
manifest or talks to a hub. Each change bumps ``generation``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.state import formats
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import ModelDeployment, parse_manifest
from edgefleet.errors import EdgefleetError, StateError
from edgefleet.persisting import read_json, write_json_atomic

NAME = "state/desired.json"  # its formats: edged.state.formats
FORMAT = formats.FORMATS[NAME].writes


@dataclass(frozen=True, slots=True)
class DesiredSnapshot:
    generation: int
    workloads: dict[WorkloadName, DesiredWorkload]


def _encode(w: DesiredWorkload) -> dict[str, Any]:
    doc = {"manifest": w.deployment.to_dict(), "sha256": w.sha256, "source": w.source}
    if w.extras:
        doc["extras"] = dict(sorted(w.extras.items()))
    return doc


class DesiredState:
    def __init__(self, path: Path) -> None:
        self._path = path
        self.generation = 0
        self.workloads: dict[WorkloadName, DesiredWorkload] = {}

    def load(self) -> None:
        doc = read_json(self._path)
        if doc is None:
            return
        try:
            if not formats.readable(NAME, doc.get("format")):
                raise StateError(f"{self._path}: unknown format {doc.get('format')!r}")
            workloads = {}
            for item in doc["workloads"]:
                dep = parse_manifest(item["manifest"], source=str(self._path))
                if not isinstance(dep, ModelDeployment):
                    raise StateError(f"{self._path}: a {dep.kind} is not a workload")
                w = DesiredWorkload(
                    dep,
                    str(item["sha256"]),
                    str(item.get("source", "")),
                    {str(k): str(v) for k, v in item.get("extras", {}).items()},
                )
                workloads[w.name] = w
            self.generation = int(doc["generation"])
        except (KeyError, TypeError, AttributeError, ValueError, EdgefleetError) as exc:
            raise StateError(f"{self._path} is not a valid desired state: {exc}") from None
        self.workloads = workloads

    def get(self, name: WorkloadName) -> DesiredWorkload | None:
        return self.workloads.get(name)

    def snapshot(self) -> DesiredSnapshot:
        return DesiredSnapshot(self.generation, dict(self.workloads))

    def replace(self, workloads: dict[WorkloadName, DesiredWorkload]) -> set[WorkloadName]:
        """Accept a new desired state; persist it first; return the names that changed."""
        changed = self._changed(workloads)
        if changed:
            write_json_atomic(self._path, self._document(workloads))
            self._take(workloads)
        return changed

    async def replace_in_thread(
        self, workloads: dict[WorkloadName, DesiredWorkload]
    ) -> set[WorkloadName]:
        """:meth:`replace`, the file written in a thread: the event loop, which answers
        inference and health checks, never waits on the disk (a slow disk held it for the
        write's five operations). The state in memory changes once the file is written;
        callers make one replace at a time (the Acceptor's lock)."""
        changed = self._changed(workloads)
        if changed:
            await asyncio.to_thread(write_json_atomic, self._path, self._document(workloads))
            self._take(workloads)
        return changed

    def _changed(self, workloads: dict[WorkloadName, DesiredWorkload]) -> set[WorkloadName]:
        return {
            n
            for n in set(workloads) | set(self.workloads)
            if workloads.get(n) != self.workloads.get(n)
        }

    def _document(self, workloads: dict[WorkloadName, DesiredWorkload]) -> dict[str, Any]:
        return {
            "format": formats.write_format(NAME),
            "generation": self.generation + 1,
            "workloads": [_encode(workloads[n]) for n in sorted(workloads)],
        }

    def _take(self, workloads: dict[WorkloadName, DesiredWorkload]) -> None:
        self.generation += 1
        self.workloads = dict(workloads)
