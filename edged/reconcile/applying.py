"""The applier: performs a plan's actions on the worker pool. All effects live here."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from edged.reconcile.model import (
    Action,
    ForgetReplica,
    KillReplica,
    RefetchArtifact,
    StartReplica,
    StopReplica,
)
from edged.runtime.launching import LaunchSpec
from edged.runtime.limiting import choose_limits
from edged.runtime.oomscoring import oom_score_adj, set_oom_score_adj
from edged.runtime.securing import DeviceSecurity, choose_sandbox, outdated_sandboxes
from edged.runtime.validating import FILE_NAME as VALIDATION_FILE
from edged.runtime.workerpool import WorkerPool
from edged.trust.secrets import secret_dir, workload_dir
from edged.workloads import DesiredWorkload, ReplicaId, WorkloadName
from edgefleet.errors import TemporaryError


def build_launch_spec(
    desired: DesiredWorkload,
    action: StartReplica,
    *,
    artifact_path: Path,
    cgroup_root: Path | None,
    cpu_count: int,
    log_level: str = "info",
    validation_path: Path | None = None,
    security: DeviceSecurity | None = None,
    device_paths: tuple[str, ...] = (),
    secret_root: Path | None = None,
    config_root: Path | None = None,
) -> LaunchSpec:
    """Pure: what a replica's worker process is told at launch. ``secret_root``: where the
    workloads' secrets are written (``edged/trust/secrets.py``); a worker may read its own
    workload's directory there, nothing else of it.

    Intra-op threads: ``runtime.intraOpThreads`` if set, else one per whole core of the cpu
    request (at least one), else one: a guest on a small device does not take every core.
    """
    spec = desired.deployment.spec
    cpu = spec.resources.cpu_millis
    threads = spec.runtime.intra_op_threads or (
        max(1, min(cpu_count, math.ceil(cpu / 1000))) if cpu else 1
    )
    limits = choose_limits(
        replica_id=action.replica_id,
        slot=action.slot,
        cpu_millis=cpu,
        memory_bytes=spec.resources.memory_bytes,
        cgroup_root=cgroup_root,
        cpu_count=cpu_count,
    )
    providers = action.providers or tuple(spec.runtime.execution_providers)
    sandbox = choose_sandbox(
        desired.deployment,
        providers,
        security or DeviceSecurity(sandbox="off"),
        device_paths=device_paths,
    )
    secret_dirs: tuple[tuple[str, str], ...] = ()
    if spec.secrets and secret_root is not None:
        secret_dirs = tuple(
            (m.mount_path, str(secret_dir(secret_root, desired.name, m.name))) for m in spec.secrets
        )
        sandbox = replace(sandbox, read_dirs=(str(workload_dir(secret_root, desired.name)),))
    config_dir = ""
    if config_root is not None:  # its model configuration (edged/state/modelconfigs.py)
        config_dir = str(config_root / desired.name)
        sandbox = replace(sandbox, read_dirs=(*sandbox.read_dirs, config_dir))
    return LaunchSpec(
        replica_id=action.replica_id,
        workload=desired.name,
        model_name=spec.model.name,
        model_version=spec.model.version,
        artifact_path=str(artifact_path),
        artifact_sha256=action.sha256 or desired.sha256,
        providers=providers,
        intra_op_threads=threads,
        max_batch_size=spec.runtime.max_batch_size,
        max_queue_delay_s=spec.runtime.max_queue_delay,
        limits=limits,
        log_level=log_level,
        validate=action.slot == 0,
        validation_path=str(validation_path or ""),
        validation_sha256=desired.extras.get(VALIDATION_FILE, ""),
        sandbox=sandbox,
        secret_dirs=secret_dirs,
        config_dir=config_dir,
    )


class Applier:
    def __init__(
        self,
        pool: WorkerPool,
        *,
        artifact_path: Callable[[str], Path],
        request_refetch: Callable[[], None],
        cgroup_root: Path | None,
        log_level: str = "info",
        security: Callable[[], DeviceSecurity] | None = None,
        device_paths: tuple[str, ...] = (),
        hold: Callable[[], str | None] | None = None,
        secret_root: Path | None = None,
        config_root: Path | None = None,
    ) -> None:
        """``security``: the device's sandbox settings now (config and accepted baselines);
        ``device_paths``: accelerator nodes a worker of a non-CPU provider may open;
        ``hold()``: why no replica may start now (the device is quarantined), or None."""
        self._security = security
        self._secret_root = secret_root
        self._config_root = config_root  # the workloads' model configurations
        self._hold = hold
        self.device_paths = device_paths
        self._pool = pool
        self._artifact_path = artifact_path
        self._request_refetch = request_refetch
        self._cgroup_root = cgroup_root
        self._cpu_count = len(os.sched_getaffinity(0))
        self._log_level = log_level

    async def apply(self, desired: DesiredWorkload | None, actions: tuple[Action, ...]) -> None:
        failures: list[str] = []
        for action in actions:
            if isinstance(action, StartReplica):
                assert desired is not None
                held = self._hold() if self._hold is not None else None
                if held is not None:
                    failures.append(f"{action.replica_id}: not started: {held}")
                    continue
                spec = build_launch_spec(
                    desired,
                    action,
                    artifact_path=self._artifact_path(action.sha256 or desired.sha256),
                    cgroup_root=self._cgroup_root,
                    cpu_count=self._cpu_count,
                    log_level=self._log_level,
                    validation_path=(
                        self._artifact_path(desired.extras[VALIDATION_FILE])
                        if VALIDATION_FILE in desired.extras
                        else None
                    ),
                    security=self._security() if self._security is not None else None,
                    device_paths=self.device_paths,
                    secret_root=self._secret_root,
                    config_root=self._config_root,
                )
                if self._config_root is not None:  # granted before any config is there
                    (self._config_root / desired.name).mkdir(parents=True, exist_ok=True)
                try:
                    await self._pool.start(
                        spec,
                        action.workload,
                        action.revision,
                        action.slot,
                        desired.deployment.spec.probes,
                    )
                except OSError as exc:
                    failures.append(f"{action.replica_id}: {exc}")
                else:
                    self._steer_oom_killer(action, desired)
            elif isinstance(action, StopReplica):
                self._pool.stop(action.replica_id)
            elif isinstance(action, KillReplica):
                self._pool.kill(action.replica_id, action.reason, action.message)
            elif isinstance(action, ForgetReplica):
                self._pool.forget(action.replica_id)
            elif isinstance(action, RefetchArtifact):
                self._request_refetch()
        if failures:
            raise TemporaryError("cannot start replicas: " + "; ".join(failures))

    def restart_outdated_sandboxes(
        self,
        desired: Callable[[WorkloadName], DesiredWorkload | None],
        security: DeviceSecurity,
    ) -> None:
        """The baselines changed (``security`` is what is in force now): a worker whose sandbox
        would now differ is killed (and started again by its reconciler, under the new one)."""
        running = []
        for rep in self._pool.replicas():
            wanted = desired(rep.workload)
            if wanted is None or rep.pid is None:
                continue
            want = choose_sandbox(
                wanted.deployment, rep.spec.providers, security, device_paths=self.device_paths
            )
            running.append((rep.id, rep.spec.sandbox, want))
        for replica_id in outdated_sandboxes(running):
            self._pool.kill(
                ReplicaId(replica_id),
                "SandboxChanged",
                "a SecurityBaseline changed: started again under the new sandbox",
            )

    def _steer_oom_killer(self, action: StartReplica, desired: DesiredWorkload) -> None:
        """Critical workers are the kernel's last choice, low-priority ones its first (only
        for deployments that set a priority: the others keep what they inherit)."""
        priority = desired.deployment.spec.priority
        rep = self._pool.get(action.replica_id)
        if priority is not None and rep is not None and rep.pid is not None:
            set_oom_score_adj(rep.pid, oom_score_adj(priority))


__all__ = ["Applier", "WorkloadName", "build_launch_spec"]
