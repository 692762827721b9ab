"""Static desired state from a directory of manifests (``edged run --manifests DIR``).

Like kubelet's static pods: every ``*.yaml``, ``*.yml`` and ``*.json`` file in DIR (not hidden,
not in subdirectories, not ``*.metadata.json`` or ``*.rollback.json``, which are signed
documents) holds ModelDeployment documents whose ``spec.model.path`` names a local ``.onnx``
file, relative to the manifest's directory. :meth:`StaticManifests.sync` turns the directory
into desired workloads, ingesting artifacts into the store on the way — through the
:class:`~edged.trust.admitting.ArtifactGate`, which verifies the signed metadata
(``spec.model.metadata``, default ``<path>.metadata.json``) against the trust root first.
Files may also hold DeviceHealthPolicy documents (returned in ``SyncResult.policies``; an
invalid file keeps the policies it had).

A file that is invalid (whatever the loader raises: an integer of 5001 digits, a tag...), or
whose model cannot be ingested, does not take anything down and never blocks the other files:
the workloads it defined in the last accepted state are kept, and the problem is reported with the
file name and field path. A file that is deleted removes its workloads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from edged.state.modelconfigs import ConfigRefused, ConfigVolumes
from edged.trust.admitting import METADATA_SUFFIX, ArtifactGate, ArtifactRequest
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import (
    DeviceHealthPolicy,
    ModelDeployment,
    SecurityBaseline,
    load_manifest_file,
)
from edgefleet.api.modelconfigs import ModelConfig, merge_for_device
from edgefleet.artifacts.storing import ArtifactStore, is_disk_full
from edgefleet.configschemas import FILE_NAME as SCHEMA_FILE
from edgefleet.configschemas import SchemaError, parse_schema
from edgefleet.errors import ArtifactError, ValidationError
from edgefleet.logs import get_logger

log = get_logger(__name__)

SUFFIXES = (".yaml", ".yml", ".json")
# Signed documents that live next to models and manifests, not manifests themselves.
SIGNED_SUFFIXES = (METADATA_SUFFIX, ".rollback.json")
RETRYABLE = frozenset({"ArtifactNotFound", "ArtifactUnreadable"})


@dataclass(frozen=True, slots=True)
class SourceProblem:
    file: str
    workload: str  # "" when the whole file is rejected
    reason: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {
            "file": self.file,
            "workload": self.workload,
            "reason": self.reason,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class SyncResult:
    workloads: dict[WorkloadName, DesiredWorkload]
    problems: tuple[SourceProblem, ...] = ()
    retryable: bool = False
    files: tuple[str, ...] = field(default=())
    policies: tuple[DeviceHealthPolicy, ...] = ()
    baselines: tuple[SecurityBaseline, ...] = ()


class StaticManifests:
    def __init__(
        self,
        directory: Path,
        store: ArtifactStore,
        *,
        max_artifact_bytes: int,
        gate: ArtifactGate,
        configs: ConfigVolumes | None = None,
        device_name: str = "",
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """``configs``: where the static workloads' model configurations are written (a
        ModelConfig among the manifests, merged for ``device_name`` and ``labels``: this
        device's name and its operator-set labels; None: a ModelConfig is refused)."""
        self._configs = configs
        self._device_name = device_name
        self._labels = dict(labels or {})
        self.directory = directory
        self._store = store
        self._max_bytes = max_artifact_bytes
        self._gate = gate
        self._by_file: dict[str, set[WorkloadName]] = {}
        self._policies_by_file: dict[str, tuple[DeviceHealthPolicy, ...]] = {}
        self._baselines_by_file: dict[str, tuple[SecurityBaseline, ...]] = {}

    def list_files(self) -> list[Path]:
        try:
            entries = sorted(self.directory.iterdir())
        except FileNotFoundError:
            return []
        return [
            p
            for p in entries
            if p.suffix in SUFFIXES
            and not p.name.startswith(".")
            and not p.name.endswith(SIGNED_SUFFIXES)
            and p.is_file()
        ]

    def sync(self, current: dict[WorkloadName, DesiredWorkload]) -> SyncResult:
        """Read the directory; return the workloads to accept and every problem found."""
        out: dict[WorkloadName, DesiredWorkload] = {}
        owner: dict[WorkloadName, str] = {}
        problems: list[SourceProblem] = []
        by_file: dict[str, set[WorkloadName]] = {}
        policies_by_file: dict[str, tuple[DeviceHealthPolicy, ...]] = {}
        baselines_by_file: dict[str, tuple[SecurityBaseline, ...]] = {}
        retryable = False
        model_configs: dict[str, tuple[str, ModelConfig]] = {}  # by model: (file, config)
        now = self._gate.begin()  # one time for every check of this update
        files = self.list_files()
        for path in files:
            fname = path.name
            names: set[WorkloadName] = set()
            by_file[fname] = names
            try:
                manifests = load_manifest_file(path)
            except OSError as exc:
                problems.append(SourceProblem(fname, "", "Unreadable", str(exc)))
                retryable = True
                continue
            except Exception as exc:  # one file's problem, whatever the loader raised
                message = (
                    str(exc)
                    if isinstance(exc, ValidationError)
                    else f"{fname}: cannot be loaded: {type(exc).__name__}: {exc}"
                )
                if not isinstance(exc, ValidationError):
                    log.error("manifest loader failed", file=fname, error=message)
                problems.append(SourceProblem(fname, "", "InvalidManifest", message))
                policies_by_file[fname] = self._policies_by_file.get(fname, ())
                baselines_by_file[fname] = self._baselines_by_file.get(fname, ())
                for name in self._by_file.get(fname, set()):
                    if name in current and name not in out:
                        out[name] = current[name]
                        owner[name] = fname
                        names.add(name)
                continue
            policies_by_file[fname] = tuple(
                m for m in manifests if isinstance(m, DeviceHealthPolicy)
            )
            baselines_by_file[fname] = tuple(
                m for m in manifests if isinstance(m, SecurityBaseline)
            )
            problems += [
                SourceProblem(
                    fname,
                    "",
                    "NotSupported",
                    f"SecurityBaseline {m.name!r}: spec.publishers is not supported yet in a "
                    "device's static manifests (it applies to the hub's deployments: apply the "
                    "baseline at the hub); its other fields apply",
                )
                for m in baselines_by_file[fname]
                if m.spec.publishers is not None
            ]
            problems += [
                SourceProblem(
                    fname,
                    "",
                    "NotSupported",
                    f"SecurityBaseline {m.name!r}: {', '.join(fields)} not supported in a "
                    "device's static manifests: attestation is judged by a hub (apply the "
                    "baseline there); its other fields apply",
                )
                for m in baselines_by_file[fname]
                if (fields := _attestation_fields(m))
            ]
            problems += [
                SourceProblem(
                    fname,
                    "",
                    "UnsupportedKind",
                    f"{m.kind} {m.name!r} is applied at the hub (edgectl apply), not in a "
                    "device's static manifests: ignored"
                    if m.kind != "ModelConfig"
                    else f"ModelConfig {m.name!r}: this device has no directory for model "
                    "configurations: not applied",
                )
                for m in manifests
                if not isinstance(m, DeviceHealthPolicy | ModelDeployment | SecurityBaseline)
                and not (isinstance(m, ModelConfig) and self._configs is not None)
            ]
            for m in manifests:
                if isinstance(m, ModelConfig) and self._configs is not None:
                    if m.spec.model in model_configs:
                        message = (
                            f"spec.model: model {m.spec.model!r} already has ModelConfig "
                            f"{model_configs[m.spec.model][1].name!r}: one config per model"
                        )
                        problems.append(SourceProblem(fname, "", "DuplicateModelConfig", message))
                    else:
                        model_configs[m.spec.model] = (fname, m)
            deployments = [m for m in manifests if isinstance(m, ModelDeployment)]
            for dep in deployments:
                name = WorkloadName(dep.metadata.name)
                if name in owner:
                    problems.append(
                        SourceProblem(
                            fname,
                            name,
                            "DuplicateName",
                            f"metadata.name: {name!r} is already defined in {owner[name]}",
                        )
                    )
                    continue
                owner[name] = fname
                names.add(name)
                if dep.spec.secrets:
                    problems.append(
                        SourceProblem(
                            fname,
                            name,
                            "SecretsNotSupported",
                            "spec.secrets: not supported yet in a device's static manifests: "
                            "Secrets come from the hub (edgectl apply)",
                        )
                    )
                    continue
                try:
                    sha, extras = self._ingest(path, dep, now)
                except Exception as exc:  # this workload's problem, never the whole source's
                    if isinstance(exc, ArtifactError):
                        reason, message = exc.reason, str(exc)
                    elif isinstance(exc, OSError) and is_disk_full(exc):
                        reason = "InsufficientDisk"
                        message = f"cannot store the model: {exc}"
                    else:
                        reason = "IngestFailed"
                        message = f"cannot ingest the model: {type(exc).__name__}: {exc}"
                        log.error("ingest failed", file=fname, workload=name, error=message)
                    problems.append(SourceProblem(fname, name, reason, message))
                    retryable = retryable or reason in RETRYABLE or reason == "IngestFailed"
                    if name in current:
                        out[name] = current[name]
                    continue
                out[name] = DesiredWorkload(dep, sha, fname, extras)
        self._by_file = by_file
        self._policies_by_file = policies_by_file
        self._baselines_by_file = baselines_by_file
        baselines = tuple(b for f in sorted(baselines_by_file) for b in baselines_by_file[f])
        problems += self._check_model_names(out)
        problems += self._write_configs(out, model_configs)
        policies = tuple(p for f in sorted(policies_by_file) for p in policies_by_file[f])
        return SyncResult(
            out, tuple(problems), retryable, tuple(p.name for p in files), policies, baselines
        )

    def _ingest(
        self, manifest_path: Path, dep: ModelDeployment, now: float
    ) -> tuple[str, dict[str, str]]:
        model = dep.spec.model
        if not model.path:
            raise ArtifactError(
                "ModelPathMissing",
                "spec.model.path: required for a static manifest (a local .onnx file)",
            )

        def local(p: str) -> Path:
            path = Path(p)
            return path if path.is_absolute() else manifest_path.parent / path

        path = local(model.path)
        request = ArtifactRequest(
            name=model.name,
            version=model.version,
            model_path=path,
            metadata_path=(
                local(model.metadata)
                if model.metadata
                else path.with_name(path.name + METADATA_SUFFIX)
            ),
            allowance_path=local(model.rollback_allowance) if model.rollback_allowance else None,
            pinned_sha256=model.sha256,
        )
        return self._gate.admit_with_extras(
            request, self._store, now=now, max_bytes=self._max_bytes
        )

    def _write_configs(
        self,
        out: dict[WorkloadName, DesiredWorkload],
        by_model: Mapping[str, tuple[str, ModelConfig]],
    ) -> list[SourceProblem]:
        """Each static workload's model configuration, merged for this device, checked (the
        artifact's schema) and written (edged.state.modelconfigs); a refused one keeps the
        previous config and is a problem of its file."""
        configs = self._configs
        if configs is None:
            return []
        problems = []
        for name, w in sorted(out.items()):
            found = by_model.get(w.deployment.spec.model.name)
            if found is None:
                configs.clear(name)
                continue
            fname, config = found
            merged = merge_for_device(config, self._device_name, self._labels)
            try:
                digest = w.extras.get(SCHEMA_FILE)
                schema = parse_schema(self._store.path_for(digest).read_bytes()) if digest else None
                configs.write(name, merged.document(), schema)
            except (ConfigRefused, SchemaError, OSError) as exc:
                problems.append(SourceProblem(fname, name, "ModelConfigRefused", str(exc)))
        return problems

    @staticmethod
    def _check_model_names(out: dict[WorkloadName, DesiredWorkload]) -> list[SourceProblem]:
        """Two workloads may not serve the same model name: the second (by name) is dropped."""
        seen: dict[str, WorkloadName] = {}
        problems = []
        for name in sorted(out):
            model = out[name].deployment.spec.model.name
            if model in seen:
                problems.append(
                    SourceProblem(
                        out[name].source,
                        name,
                        "DuplicateModelName",
                        f"spec.model.name: {model!r} is already served by {seen[model]!r}",
                    )
                )
                del out[name]
            else:
                seen[model] = name
        return problems


def _attestation_fields(baseline: SecurityBaseline) -> list[str]:
    """The fields of ``baseline`` set that only a hub acts on (it judges the device's
    attestation evidence); edged alone has nobody to prove anything to."""
    spec = baseline.spec
    named = (
        ("spec.requireAttestation", spec.require_attestation),
        ("spec.requireTpm", spec.require_tpm),
        ("spec.requireMeasurementPcr", spec.require_measurement_pcr),
        ("spec.allowedCodeDigests", spec.allowed_code_digests),
        ("spec.allowedConfigDigests", spec.allowed_config_digests),
        ("spec.allowedModelDigests", spec.allowed_model_digests),
        ("spec.allowedPcrValues", spec.allowed_pcr_values),
    )
    return [name for name, value in named if value]
