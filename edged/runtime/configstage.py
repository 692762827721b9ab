"""The worker's processing stage: its ModelConfig's ``edgefleet.io/processing`` applied around
every inference (docs/model-config.md, "The processing stage").

:class:`ConfigStage` stands in for the ONNX Runtime session (``run``, ``get_inputs``,
``get_outputs``): it normalises the inputs and post-processes the outputs as the config the
worker reads through ``EDGEFLEET_MODEL_CONFIG`` says (the section's format:
:mod:`edgefleet.modelprocessing`), so the answers served *and* the validation set's accuracy
are the model's with its config.

* **A change needs no restart.** The stage looks at the config's version (the ``..data``
  link edged replaces by one rename) at most every :data:`CHECK_EVERY_S` on the inference
  path and on every PING, and compiles the new one against the model. The compiled stage is
  swapped by one assignment: a batch runs with one version whole.
* **A config that does not fit the model is refused here**, with its reason (a name the model
  does not have, a list whose length is not the channel count, a non-float tensor): the
  previous one stays in force, and ``report()`` (sent in every PONG) says which config was
  refused and why; edged reports it to the hub as the workload's config error, which makes a
  config canary broken (rolled back). At start (no previous one), it is a load failure.
* **The accuracy follows the config.** On the replica that evaluates the validation set
  (slot 0), each config taken into force is evaluated again in a thread of its own, and the
  report carries the result with the digest it was measured with (edged reports an accuracy
  only when that digest is the config it wrote: ``edged.runtime.configreports``).

numpy is imported by the worker anyway; this module imports it only when a stage compiles.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edgefleet.modelprocessing import Processing, ProcessingInvalid, read_processing

MAX_MERGED_BYTES = 256 << 10  # edgefleet.api.modelconfigs.MAX_MERGED_BYTES (not imported:
# the worker imports what it needs before its sandbox, and edgefleet.api is large)
CHECK_EVERY_S = 0.05
FLOATS = {"FP16": "float16", "FP32": "float32", "FP64": "float64"}
MAX_ERROR = 1024


class ConfigUnfit(ValueError):
    """The config cannot drive this model; the message says why."""


class _Compiled:
    """One config's processing, compiled against the model: numpy arrays ready to apply."""

    __slots__ = ("inputs", "outputs")

    def __init__(
        self,
        inputs: dict[str, tuple[Any, Any, Any]],
        outputs: dict[str, tuple[Any, float | None, float]],
    ) -> None:
        self.inputs = inputs  # name -> (scale, mean, std) of the input's dtype, broadcastable
        self.outputs = outputs  # name -> (class indices or None, threshold, below)

    def pre(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(feeds)
        for name, (scale, mean, std) in self.inputs.items():
            x = out.get(name)
            if x is not None:
                y = x * scale  # a new array of the input's dtype (never the request's bytes)
                y -= mean
                y /= std
                out[name] = y
        return out

    def post(self, names: Sequence[str], results: list[Any]) -> list[Any]:
        if not self.outputs:
            return results
        import numpy as np

        done = list(results)
        for i, name in enumerate(names):
            step = self.outputs.get(name)
            if step is None:
                continue
            classes, threshold, below = step
            r = done[i]
            if classes is not None:
                r = np.take(r, classes, axis=-1)
            if threshold is not None:
                r = np.where(r < threshold, r.dtype.type(below), r)
            done[i] = np.ascontiguousarray(r)
        return done


IDENTITY = _Compiled({}, {})


def compile_processing(
    processing: Processing, inputs: Mapping[str, Any], outputs: Sequence[Any]
) -> _Compiled:
    """``processing`` against the model's tensors (``edged.runtime.tensors.TensorSpec``:
    name, OIP datatype, shape with -1 for any size); ConfigUnfit naming what does not fit."""
    if processing.empty:
        return IDENTITY
    import numpy as np

    problems: list[str] = []
    pre: dict[str, tuple[Any, Any, Any]] = {}
    for name, step in processing.inputs.items():
        spec = inputs.get(name)
        where = f"processing input {name!r}"
        if spec is None:
            problems.append(f"{where}: the model has no such input (it has {sorted(inputs)})")
            continue
        if spec.datatype not in FLOATS:
            problems.append(f"{where}: the input is {spec.datatype}; only a float input is "
                            "normalised")  # fmt: skip
            continue
        rank = len(spec.shape)
        lists = max(len(step.mean), len(step.std))
        shape = [1] * rank
        if lists > 1:
            if not -rank <= step.channel_axis < rank:
                problems.append(f"{where}: channelAxis {step.channel_axis} is not an axis of "
                                f"its {rank} dimensions")  # fmt: skip
                continue
            dim = spec.shape[step.channel_axis]
            for what, values in (("mean", step.mean), ("std", step.std)):
                if len(values) > 1 and dim >= 0 and len(values) != dim:
                    problems.append(f"{where}: {what} has {len(values)} values, the input has "
                                    f"{dim} channels on axis {step.channel_axis}")  # fmt: skip
            if len(step.mean) > 1 and len(step.std) > 1 and len(step.mean) != len(step.std):
                problems.append(f"{where}: mean and std differ in length")
            shape[step.channel_axis] = lists
        dtype = np.dtype(FLOATS[spec.datatype])
        mean, std = (
            np.asarray(v, dtype=dtype).reshape(shape if len(v) > 1 else [1] * rank)
            for v in (step.mean, step.std)
        )
        pre[name] = (dtype.type(step.scale), mean, std)
    by_name = {o.name: o for o in outputs}
    post: dict[str, tuple[Any, float | None, float]] = {}
    for name, out in processing.outputs.items():
        spec = by_name.get(name)
        where = f"processing output {name!r}"
        if spec is None:
            problems.append(f"{where}: the model has no such output (it has {sorted(by_name)})")
            continue
        if spec.datatype not in FLOATS:
            problems.append(f"{where}: the output is {spec.datatype}; only a float output is "
                            "post-processed")  # fmt: skip
            continue
        classes = None
        if out.class_map is not None:
            dim = spec.shape[-1] if spec.shape else 1
            if dim >= 0 and (len(out.class_map) != dim or max(out.class_map) >= dim):
                problems.append(f"{where}: classMap must list {dim} classes of 0 to {dim - 1}, "
                                f"got {len(out.class_map)} up to {max(out.class_map)}")  # fmt: skip
                continue
            classes = np.asarray(out.class_map, dtype=np.intp)
        post[name] = (classes, out.threshold, out.below)
    if problems:
        raise ConfigUnfit("; ".join(problems[:20]))
    return _Compiled(pre, post)


class _Bound:
    """The session with one compiled stage (what a validation run evaluates)."""

    def __init__(self, session: Any, compiled: _Compiled) -> None:
        self._session = session
        self._compiled = compiled

    def run(self, names: Sequence[str] | None, feeds: Mapping[str, Any], *args: Any) -> Any:
        c = self._compiled
        if c is IDENTITY:  # no processing: the session's own call
            return self._session.run(names, feeds, *args)
        if names is None:
            names = [o.name for o in self._session.get_outputs()]
        return c.post(names, self._session.run(list(names), c.pre(feeds), *args))

    def get_inputs(self) -> Any:
        return self._session.get_inputs()

    def get_outputs(self) -> Any:
        return self._session.get_outputs()


class ConfigStage(_Bound):
    """The session as the worker serves it (module doc). ``path``: its ``config.json`` (""
    none); ``inputs``, ``outputs``: the model's TensorSpecs; ``evaluate``: the validation
    set's evaluation of a session-like object (None: this replica does not evaluate)."""

    def __init__(
        self,
        session: Any,
        path: str,
        inputs: Mapping[str, Any],
        outputs: Sequence[Any],
        evaluate: Callable[[Any], dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(session, IDENTITY)
        self._path = path
        self._link = os.path.join(os.path.dirname(path), "..data") if path else ""
        self._inputs = inputs
        self._outputs = outputs
        self._evaluate = evaluate
        self._lock = threading.Lock()
        self._checked = 0.0
        self._version: object = None
        self.digest = ""  # the config in force ("" none)
        self.refused = ""  # the digest of the last config refused, while it is the one on disk
        self.error = ""
        self._validation: tuple[str, dict[str, Any]] | None = None  # re-evaluated: digest, result
        self._validating: threading.Thread | None = None  # while one evaluates (under _vlock)
        self._vlock = threading.Lock()

    # -- the session's interface ---------------------------------------------------------------
    def run(self, names: Sequence[str] | None, feeds: Mapping[str, Any], *args: Any) -> Any:
        if time.monotonic() - self._checked >= CHECK_EVERY_S:
            self.refresh()
        return super().run(names, feeds, *args)

    # -- the config ------------------------------------------------------------------------------
    def start(self) -> None:
        """The config on disk now, in force before the first inference; ConfigUnfit or
        ProcessingInvalid (the worker does not start) when it cannot be."""
        self.refresh(at_start=True)

    def refresh(self, *, at_start: bool = False) -> None:
        """Take the config on disk into force if it changed (module doc); cheap when not."""
        if not self._path or not self._lock.acquire(blocking=False):
            return  # another thread looks at it right now
        try:
            self._checked = time.monotonic()
            version = self._current_version()
            if version == self._version:
                return
            self._version = version
            try:
                digest, compiled = self._load()
            except (OSError, ValueError) as exc:
                if at_start:
                    raise
                self.refused = self._digest_on_disk()
                self.error = str(exc)[:MAX_ERROR]
                print(f"worker: model config refused: {self.error}", flush=True, file=_stderr())
                return
            self._compiled, self.digest, self.refused, self.error = compiled, digest, "", ""
            if self._evaluate is not None and not at_start:
                self._revalidate()
        finally:
            self._lock.release()

    def _current_version(self) -> object:
        try:
            return os.readlink(self._link)
        except OSError:
            try:
                st = os.stat(self._path)
            except OSError:
                return None
            return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)

    def _load(self) -> tuple[str, _Compiled]:
        try:
            with open(self._path, "rb") as f:
                raw = f.read(2 * MAX_MERGED_BYTES + 1)
        except FileNotFoundError:
            return "", IDENTITY  # no config (any more): the model alone
        if len(raw) > 2 * MAX_MERGED_BYTES:
            raise ConfigUnfit("the config file is too large")
        document = json.loads(raw)
        data = document.get("data") if isinstance(document, dict) else None
        if not isinstance(data, dict):
            raise ConfigUnfit("the config file holds no data mapping")
        try:
            compiled = compile_processing(read_processing(data), self._inputs, self._outputs)
        except ProcessingInvalid as exc:
            raise ConfigUnfit(str(exc)) from None
        return "sha256:" + hashlib.sha256(raw).hexdigest(), compiled

    def _digest_on_disk(self) -> str:
        try:
            with open(self._path, "rb") as f:
                return "sha256:" + hashlib.sha256(f.read(2 * MAX_MERGED_BYTES + 1)).hexdigest()
        except OSError:
            return ""

    def _revalidate(self) -> None:
        with self._vlock:
            if self._validating is not None:
                return  # it evaluates again when it ends, the config having changed meanwhile
            # not a daemon: a thread ended inside ONNX Runtime at exit could abort the process
            self._validating = threading.Thread(target=self._validate_loop, name="revalidate")
            self._validating.start()

    def _validate_loop(self) -> None:
        assert self._evaluate is not None
        while True:
            digest, compiled = self.digest, self._compiled
            result = self._evaluate(_Bound(self._session, compiled))
            with self._vlock:
                self._validation = (digest, result)
                if self.digest == digest:  # (a change after this starts a thread of its own)
                    self._validating = None
                    return

    def report(self) -> dict[str, Any]:
        """What PONG and READY carry: the config in force, the one refused and why, and the
        validation set's result with the digest it was measured with (``validationDigest``
        alone: READY's ``validation`` was measured with it)."""
        doc: dict[str, Any] = {"digest": self.digest}
        if self.error:
            doc["refused"] = self.refused
            doc["error"] = self.error
        if self._validation is not None:
            doc["validationDigest"], doc["validation"] = self._validation
        elif self._evaluate is not None:
            doc["validationDigest"] = self.started_with
        return doc

    started_with = ""  # the config in force when the worker started


def attach(model: Any, spec: Any, validation_path: str) -> dict[str, Any] | None:
    """Put a stage in front of ``model``'s session (``model.session``, ``model.stage``), with
    the config on disk in force; the validation set's result with it when ``spec.validate``
    (READY's ``validation``). ConfigUnfit when the config cannot drive the model."""
    evaluate: Callable[[Any], dict[str, Any]] | None = None
    if spec.validate:
        from edged.runtime.validating import evaluate as evaluating

        def evaluate(session: Any) -> dict[str, Any]:
            return evaluating(session, validation_path, spec.validation_sha256)

    path = os.environ.get(CONFIG_ENV, "") if spec.config_dir else ""
    stage = ConfigStage(model.session, path, model.inputs, model.output_specs, evaluate)
    try:
        stage.start()
    except OSError as exc:
        raise ConfigUnfit(f"cannot read the model config: {exc}") from None
    stage.started_with = stage.digest
    model.session = stage
    model.stage = stage
    return evaluate(stage) if evaluate is not None else None


CONFIG_ENV = "EDGEFLEET_MODEL_CONFIG"  # edged.state.modelconfigs.ENV_CONFIG


def _stderr() -> Any:
    import sys

    return sys.stderr
