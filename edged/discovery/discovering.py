"""The ``discovery`` component of edged: accelerators (udev, hotplug), facts, labels, health.

At start (:meth:`Discovery.prepare`): enumerate accelerators, read facts and operator labels,
learn which execution providers the workers' onnxruntime offers (``discovery.
executionProviders`` in edged.toml, else by asking the worker Python once). Then
(:meth:`Discovery.run`): a udev monitor on the event loop; a burst of udev events is debounced
(0.2 s) into one re-enumeration, and when the accelerators changed, every workload key is
enqueued (events only enqueue keys). Health is sampled every ``discovery.healthPeriod`` and
evaluated against the DeviceHealthPolicy documents (pure, with hysteresis).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from edged.discovery.classifying import merge
from edged.discovery.hardware import Accelerator, DeviceFacts, HealthSample
from edged.discovery.health import DEFAULT_POLICY, HealthVerdict, evaluate_health
from edged.discovery.inventory import read_facts, read_sample
from edged.discovery.labelling import discovered_labels, merge_labels
from edged.discovery.providers import ProviderSelection, providers_for, select_providers
from edged.discovery.udev import UdevError, UdevWatch, read_records
from edgefleet.api import DeviceHealthPolicy
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop

log = get_logger(__name__)

DEBOUNCE_S = 0.2
PROBE_TIMEOUT_S = 60.0
_PROBE = "import json, onnxruntime; print(json.dumps(onnxruntime.get_available_providers()))"


def read_operator_labels(path: Path) -> dict[str, str]:
    """``D/labels.json`` (written at enrollment): a JSON object of strings; {} if absent."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.error("operator labels unreadable", path=str(path), error=str(exc))
        return {}
    if not isinstance(doc, dict):
        log.error("operator labels must be a JSON object", path=str(path))
        return {}
    return {str(k): str(v) for k, v in doc.items()}


async def probe_available_providers(python: str) -> tuple[str, ...]:
    """The execution providers the worker Python's onnxruntime build offers."""
    try:
        proc = await asyncio.create_subprocess_exec(
            python,
            "-c",
            _PROBE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT_S)
        if proc.returncode == 0:
            found = json.loads(out)
            return tuple(str(p) for p in found)
        log.error("onnxruntime probe failed", python=python, error=err.decode()[-500:])
    except (OSError, TimeoutError, ValueError) as exc:
        log.error("onnxruntime probe failed", python=python, error=str(exc))
    return ("CPUExecutionProvider",)


class Discovery:
    name = "discovery"

    def __init__(
        self,
        *,
        data_dir: Path,
        python: str,
        health_period_s: float,
        configured_providers: Sequence[str] = (),
        config_labels: Mapping[str, str] | None = None,
        on_accelerators_changed: Callable[[], None] = lambda: None,
        on_status_changed: Callable[[], None] = lambda: None,
        follow_udev: bool = True,
    ) -> None:
        self._data_dir = data_dir
        self._python = python
        self._period = health_period_s
        self._configured = tuple(configured_providers)
        self._config_labels = dict(config_labels or {})
        self._on_accelerators_changed = on_accelerators_changed
        self._on_status_changed = on_status_changed
        self._follow = follow_udev
        self.accelerators: tuple[Accelerator, ...] = ()
        self.available_providers: tuple[str, ...] = ("CPUExecutionProvider",)
        self.providers_source = "default"
        self.facts: DeviceFacts | None = None
        self.sample: HealthSample | None = None
        self.verdict: HealthVerdict | None = None
        self.labels: dict[str, str] = {}
        self.policies: tuple[DeviceHealthPolicy, ...] = ()
        self.udev_error = ""
        self._rescan: asyncio.TimerHandle | None = None
        self._watch: UdevWatch | None = None

    # -- reading --------------------------------------------------------------------------
    def scan(self) -> bool:
        """Enumerate accelerators again; whether they changed."""
        try:
            found = tuple(merge(read_records()))
            self.udev_error = ""
        except UdevError as exc:
            if exc.args[0] != self.udev_error:
                log.error("cannot read accelerators", error=str(exc))
            self.udev_error = str(exc)
            found = ()
        changed = found != self.accelerators
        if changed:
            self.accelerators = found
            log.info(
                "accelerators",
                found=",".join(f"{a.kind}:{a.id}{'' if a.usable else '(unusable)'}" for a in found)
                or "none",
            )
            self._relabel()
        return changed

    def _relabel(self) -> None:
        if self.facts is None:
            return
        operator = read_operator_labels(self._data_dir / "labels.json")
        self.labels = merge_labels(
            discovered_labels(self.facts, self.accelerators), self._config_labels, operator
        )

    def sample_health(self) -> None:
        self.sample = read_sample(self._data_dir)
        policies = self.policies or (DEFAULT_POLICY,)
        verdict = evaluate_health(
            policies, self.sample, self.accelerators, self.labels, self.verdict
        )
        changed = self.verdict is None or (verdict.schedulable, verdict.reasons) != (
            self.verdict.schedulable,
            self.verdict.reasons,
        )
        if self.verdict is None or verdict.schedulable != self.verdict.schedulable:
            log.info(
                "device health",
                schedulable=verdict.schedulable,
                reasons="; ".join(verdict.reasons) or "-",
            )
        self.verdict = verdict
        if changed:  # not every sample: the persisted status is not rewritten every period
            self._on_status_changed()

    def set_policies(self, policies: Sequence[DeviceHealthPolicy]) -> None:
        if tuple(policies) != self.policies:
            self.policies = tuple(policies)
            if self.sample is not None:
                self.sample_health()

    async def prepare(self) -> None:
        """Enumerate, read facts and labels, learn onnxruntime's providers (once, at start)."""
        self.facts = read_facts()
        self.scan()
        self._relabel()
        if self._configured:
            self.available_providers, self.providers_source = self._configured, "config"
        else:
            self.available_providers = await probe_available_providers(self._python)
            self.providers_source = "onnxruntime"
        log.info(
            "execution providers available",
            providers=",".join(self.available_providers),
            source=self.providers_source,
        )
        self.sample_health()

    def select(self, preferred: Sequence[str], accelerator: str | None) -> ProviderSelection:
        return select_providers(preferred, accelerator, self.accelerators, self.available_providers)

    # -- following ------------------------------------------------------------------------
    def _on_udev_event(self, action: str, sys_path: str) -> None:
        log.debug("udev event", action=action, sys_path=sys_path)
        if self._rescan is None:
            loop = asyncio.get_running_loop()
            self._rescan = loop.call_later(DEBOUNCE_S, self._rescan_now)

    def _rescan_now(self) -> None:
        self._rescan = None
        if self.scan():
            self._on_accelerators_changed()
            self._on_status_changed()
            if self.facts is not None:
                self.sample_health()  # required accelerators may have come or gone

    async def run(self, stop: asyncio.Event) -> None:
        if self.facts is None:
            await self.prepare()
        if self._follow and self._watch is None:
            watch = UdevWatch(self._on_udev_event)
            try:
                watch.start()
                self._watch = watch
            except UdevError as exc:
                log.warning(
                    "no udev events: accelerators are re-read at each health sample", error=str(exc)
                )
        try:
            while not stop.is_set():
                if not await wait_for_stop(stop, self._period):
                    if self._watch is None and self._follow:
                        self._rescan_now()
                    self.sample_health()
        finally:
            if self._watch is not None:
                self._watch.stop()
                self._watch = None
            if self._rescan is not None:
                self._rescan.cancel()
                self._rescan = None

    # -- status ---------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The ``device`` additions of ``/v1/status``: facts, accelerators, labels, health."""
        return {
            "facts": self.facts.to_json() if self.facts else None,
            "accelerators": [
                {
                    **a.to_json(),
                    "executionProviders": [
                        {"name": p, "inOnnxRuntime": ok}
                        for p, ok in providers_for(a, self.available_providers)
                    ],
                }
                for a in self.accelerators
            ],
            "executionProviders": {
                "available": list(self.available_providers),
                "source": self.providers_source,
            },
            "labels": self.labels,
            "health": {
                **(self.verdict.to_json() if self.verdict else {"schedulable": True}),
                "sample": self.sample.to_json() if self.sample else None,
            },
            "udevError": self.udev_error or None,
        }
