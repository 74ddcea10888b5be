"""The in-process probe of ``memfit doctor``: what the training process measures of itself.

Attached by :mod:`memfit.doctor.hook` when the command imports Keras, it replaces
``keras.Model.fit`` with a wrapper that

1. reads the call's arguments: the NumPy arrays given (:func:`memfit.doctor.arrays.fit_arrays`),
   the ``tf.data`` pipeline given (:func:`memfit.doctor.pipeline.inspect_dataset`), the
   batch size and the number of steps the call would train;
2. adds a callback that samples this process with the one probe
   (:func:`memfit.memory.sample`) after every training step and at every epoch end, and
   writes the samples to the shared log (``$MEMFIT_WORKDIR/memory.jsonl``, events
   ``batch`` and ``epoch_end``);
3. after ``$MEMFIT_DOCTOR_STEPS`` steps over all ``fit`` calls of the process (or when
   the ``$MEMFIT_DOCTOR_SECONDS`` deadline has passed) ends training at once, measures
   the rest (:func:`finish`) and exits with code 0. After ``$MEMFIT_DOCTOR_EPOCHS``
   epoch ends it does the same; when that epoch is the last of its ``fit`` call (a
   script that calls ``fit(epochs=1)`` in a loop), the call returns and the process
   stops at the next ``fit``, so that what the script does between epochs is seen;
4. between ``fit`` calls, measures what a ``del`` + ``gc.collect()`` leaves and what a
   ``malloc_trim(0)`` right after gives back
   (:class:`memfit.memory.allocator.ReleaseProbe`).

:func:`finish` adds what needs the end of the run: the arrays alive
(:func:`memfit.doctor.arrays.resident_arrays`), the classifier's verdict on the per-step
memory (with a ``malloc_trim`` probe, possible only in-process), live Keras models and
retraced ``tf.function`` objects, the estimator's breakdown of the model's training step
(:func:`memfit.estimate`), and the GPU settings (:func:`memfit.doctor.gpu.gpu_state`). It
writes everything to ``$MEMFIT_DOCTOR_DIR/probe-RUN-PID.json`` for the parent. A script
that ends before the step limit is measured at exit the same way.

Example:
    >>> # in a process started by `memfit doctor` (the hook calls this):
    >>> import keras
    >>> attach(keras)                                 # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import inspect
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from memfit.atomic import write_text_atomic
from memfit.data.pipeline import is_dataset
from memfit.doctor.arrays import fit_arrays, memfit_buffers, resident_arrays
from memfit.doctor.facts import PROBE_FORMAT, ProbeResults
from memfit.doctor.pipeline import inspect_dataset
from memfit.env import (
    DOCTOR_DIR_ENV,
    DOCTOR_EPOCHS_ENV,
    DOCTOR_RUN_ENV,
    DOCTOR_SECONDS_ENV,
    DOCTOR_STEPS_ENV,
    WORKDIR_ENV,
    env_int,
)
from memfit.memory.allocator import ReleaseProbe, malloc_free, malloc_in_use
from memfit.memory.log import Event, MemoryLog
from memfit.memory.probe import sample

__all__ = ["attach", "finish", "deadline_passed", "results_path", "SLICES", "FORMAT"]

FORMAT = PROBE_FORMAT           # the results file's ``format`` (see ProbeResults)
SLICES = 10                     # per-step samples are cut into this many "epochs" to classify
WARMUP_SLICES = 2               # ... the first ones are warm-up (traces, allocator pools)
MIN_EPOCH_VALUES = 5            # epoch ends (over all fits) to classify instead of slices
MAX_STEP_VALUES = 20000         # per-step values kept in the results
MAX_ARRAYS = 20                 # arrays listed in the results
SAVE_MODEL_ACTIVATIONS = 32 * 2**20   # save the model for `memfit estimate` above this
DEFAULT_BATCH = 32              # Keras's batch size for arrays when none is given


class _Stop(BaseException):
    """Raised from the callback to end ``fit`` at once (a ``BaseException``, so that no
    ``except Exception`` in Keras or the script swallows it)."""


@dataclasses.dataclass
class _State:
    pid: int
    started: float
    steps_limit: int | None
    seconds_limit: float | None
    epochs_limit: int | None
    results_dir: Path | None
    run_id: str
    steps: int = 0
    epochs: int = 0
    fits: int = 0
    step_rss: list = dataclasses.field(default_factory=list)
    step_t: list = dataclasses.field(default_factory=list)
    epoch_rss: list = dataclasses.field(default_factory=list)
    step_free: list = dataclasses.field(default_factory=list)     # glibc's free bytes, beside
    epoch_free: list = dataclasses.field(default_factory=list)    # ... step_rss and epoch_rss
    step_used: list = dataclasses.field(default_factory=list)     # glibc's bytes in use, too
    epoch_used: list = dataclasses.field(default_factory=list)
    rss_before_fit: int | None = None
    rss_first_step: int | None = None
    fit_started: float | None = None
    fit: dict | None = None
    fit_arguments: dict | None = None
    model: Any = None
    stop_reason: str | None = None
    deadline: bool = False
    in_fit: bool = False
    finished: bool = False
    log: MemoryLog | None = None
    callback: Any = None
    release: ReleaseProbe = dataclasses.field(default_factory=ReleaseProbe)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


_STATE: _State | None = None


def _state(started: float | None = None) -> _State:
    global _STATE
    if _STATE is None or _STATE.pid != os.getpid():     # a forked child starts afresh
        seconds = os.environ.get(DOCTOR_SECONDS_ENV)
        results = os.environ.get(DOCTOR_DIR_ENV)
        _STATE = _State(pid=os.getpid(), started=started or time.time(),
                        steps_limit=env_int(DOCTOR_STEPS_ENV),
                        seconds_limit=float(seconds) if seconds else None,
                        epochs_limit=env_int(DOCTOR_EPOCHS_ENV),
                        results_dir=Path(results) if results else None,
                        run_id=os.environ.get(DOCTOR_RUN_ENV, "run"))
    return _STATE


def results_path(results_dir: str | os.PathLike, run_id: str, pid: int) -> Path:
    """Where the probe of process ``pid`` writes its results."""
    return Path(results_dir) / f"probe-{run_id}-{pid}.json"


def _anon(s: Any) -> int:
    return s.anon_or_total


def _log(st: _State) -> MemoryLog | None:
    if st.log is None:
        workdir = os.environ.get(WORKDIR_ENV)
        if not workdir:
            return None
        try:
            st.log = MemoryLog(Path(workdir) / "memory.jsonl", source="doctor-probe",
                               argv=sys.argv)
        except OSError:
            return None
    return st.log


# -- reading fit's arguments -------------------------------------------------------------

def _length(value: Any) -> int | None:
    try:
        return len(value)
    except TypeError:
        return None


def _first_array(value: Any) -> Any:
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple) and value:
        return _first_array(value[0])
    return None


def _keras_backend() -> str | None:
    """The backend Keras runs on in this process (``None``: Keras not imported)."""
    backend = getattr(getattr(sys.modules.get("keras"), "backend", None), "backend", None)
    return backend() if callable(backend) else None


def _describe_fit(arguments: dict) -> dict:
    """What this ``fit`` call trains on: arrays, pipeline, batch size, steps."""
    x = arguments.get("x")
    out: dict[str, Any] = {"arrays": [a.to_json() for a in fit_arrays(arguments)],
                           "input": type(x).__name__, "pipeline": None, "batch_size": None,
                           "steps_per_epoch": arguments.get("steps_per_epoch"),
                           "epochs": arguments.get("epochs", 1),
                           "initial_epoch": arguments.get("initial_epoch", 0),
                           "input_shape": None, "backend": _keras_backend()}
    first = _first_array(x)
    if first is not None:
        out["batch_size"] = arguments.get("batch_size") or DEFAULT_BATCH
        out["input_shape"] = list(first.shape[1:])
        n = _length(first)
        if n and out["steps_per_epoch"] is None:
            out["steps_per_epoch"] = math.ceil(n / out["batch_size"])
    elif is_dataset(x):
        try:
            info = inspect_dataset(x)
            out["pipeline"] = info.to_json()
            out["batch_size"] = info.batch_size
        except Exception as e:      # noqa: BLE001 - an exotic pipeline: say so, go on
            out["pipeline_error"] = f"{type(e).__name__}: {e}"
        try:
            import tensorflow as tf

            spec = tf.nest.flatten(x.element_spec)[0]
            dims = spec.shape.as_list()
            if out["batch_size"] is None and dims and dims[0]:
                out["batch_size"] = dims[0]
            if all(d is not None for d in dims[1:]):
                out["input_shape"] = dims[1:]
            card = int(x.cardinality())
            if card >= 0 and out["steps_per_epoch"] is None:
                out["steps_per_epoch"] = card
        except Exception:           # noqa: BLE001
            pass
    elif x is not None and hasattr(x, "__getitem__") and hasattr(x, "__len__"):
        out["steps_per_epoch"] = out["steps_per_epoch"] or _length(x)   # a PyDataset
        out["batch_size"] = getattr(x, "batch_size", None)
    return out


def _data_bytes(fit: dict | None) -> int:
    if not fit:
        return 0
    arrays = sum(a["nbytes"] for a in fit["arrays"] if not a["mapped"])
    pipeline = fit.get("pipeline") or {}
    return arrays + int(pipeline.get("tensors_bytes", 0))


# -- the callback ------------------------------------------------------------------------

def _callback_class(keras: Any) -> type:
    class DoctorCallback(keras.callbacks.Callback):
        """Samples memory after every step; ends training when the doctor's limit is reached."""

        def on_train_begin(self, logs: dict | None = None) -> None:
            st = _state()
            log = _log(st)
            if log is not None:
                log.write(Event.TRAIN_BEGIN, fit=st.fits, **sample().as_record())

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            st = _state()
            s = sample()
            st.steps += 1
            st.step_rss.append(_anon(s))
            st.step_free.append(malloc_free())
            st.step_used.append(malloc_in_use())
            st.step_t.append(s.t)
            if st.rss_first_step is None:
                st.rss_first_step = _anon(s)
            log = _log(st)
            if log is not None:
                log.write(Event.BATCH, step=st.steps, batch=batch, **s.as_record())
            if st.steps_limit is not None and st.steps >= st.steps_limit:
                st.stop_reason = "steps"
                raise _Stop()
            if st.deadline:
                st.stop_reason = "seconds"
                raise _Stop()

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            st = _state()
            s = sample()
            st.epoch_rss.append(_anon(s))
            st.epoch_free.append(malloc_free())
            st.epoch_used.append(malloc_in_use())
            st.epochs += 1
            log = _log(st)
            if log is not None:
                log.write(Event.EPOCH_END, epoch=epoch, **s.as_record())
            if st.epochs_limit is not None and st.epochs >= st.epochs_limit:
                st.stop_reason = "epochs"
                last = epoch + 1 >= int((self.params or {}).get("epochs") or epoch + 1)
                if not last:
                    raise _Stop()       # else fit returns; the next fit call stops

    return DoctorCallback


def _with_callback(callbacks: Any, callback: Any) -> Any:
    if callbacks is None:
        return [callback]
    if isinstance(callbacks, list | tuple):
        return [*callbacks, callback]
    if hasattr(callbacks, "append"):            # a keras CallbackList
        if callback not in getattr(callbacks, "callbacks", ()):
            callbacks.append(callback)
        return callbacks
    return callbacks


def _fit(original: Any, signature: inspect.Signature, keras: Any, model: Any,
         args: tuple, kwargs: dict) -> Any:
    st = _state()
    st.release.disarm()
    if st.stop_reason is not None:              # stopped already; the script went on
        finish()
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(0)
    try:
        bound = signature.bind(model, *args, **kwargs)
    except TypeError:
        return original(model, *args, **kwargs)     # Keras says what is wrong
    arguments = dict(bound.arguments)
    try:
        described = _describe_fit(arguments)
        if st.fit is None or _data_bytes(described) > _data_bytes(st.fit):
            st.fit = described
    except Exception as e:          # noqa: BLE001 - the probe must not break training
        sys.stderr.write(f"memfit doctor: could not read fit's arguments "
                         f"({type(e).__name__}: {e})\n")
    st.fits += 1
    st.model = model
    if st.callback is None:
        st.callback = _callback_class(keras)()
    bound.arguments["callbacks"] = _with_callback(arguments.get("callbacks"), st.callback)
    if st.rss_before_fit is None:
        st.rss_before_fit = _anon(sample())
        st.fit_started = time.time()
    st.in_fit = True
    try:
        returned = original(*bound.args, **bound.kwargs)
        st.release.arm()                # a del + gc.collect() before the next fit
        return returned
    except _Stop:
        pass
    finally:
        st.in_fit = False
    finish()
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(0)


def attach(keras: Any, *, started: float | None = None) -> None:
    """Patches ``keras.Model.fit`` (once) and measures at exit.

    Args:
        keras: the ``keras`` module.
        started: when the process started (for the deadline); default now.
    """
    st = _state(started)
    model_class = keras.Model
    original = model_class.fit
    if getattr(original, "_memfit_doctor", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _fit(original, signature, keras, self, args, kwargs)

    fit._memfit_doctor = True           # type: ignore[attr-defined]
    model_class.fit = fit
    atexit.register(finish)
    del st


def deadline_passed() -> None:
    """Called by the hook's timer: stop at the next step, or now when not training."""
    st = _state()
    st.deadline = True
    if st.in_fit:
        return                          # the callback ends fit at the next step
    if st.stop_reason is None:
        st.stop_reason = "seconds"
    finish()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)                         # from the timer thread: end the whole process


# -- the end of the run ------------------------------------------------------------------

def _verdict(st: _State) -> dict | None:
    from memfit.memory.allocator import malloc_trim, trim_available
    from memfit.memory.classifier import classify, explained
    from memfit.sizes import format_size

    warmup = 1
    if len(st.epoch_rss) >= MIN_EPOCH_VALUES:
        values, basis = list(st.epoch_rss), "epochs"
        free: list | None = list(st.epoch_free)
        used: list | None = list(st.epoch_used)
        unit = st.steps / len(st.epoch_rss)
    elif len(st.step_rss) >= 2 * SLICES:
        n = len(st.step_rss)
        bounds = list(zip((round(i * n / SLICES) for i in range(SLICES)),
                          (round(i * n / SLICES) for i in range(1, SLICES + 1)), strict=True))
        values = [statistics.median(st.step_rss[a:b]) for a, b in bounds]
        free = [statistics.median(st.step_free[a:b]) for a, b in bounds] \
            if None not in st.step_free else None
        used = [statistics.median(st.step_used[a:b]) for a, b in bounds] \
            if None not in st.step_used else None
        basis, unit, warmup = "steps", n / SLICES, WARMUP_SLICES
    else:
        return None
    verdict = classify(values, warmup_epochs=warmup,
                       trim_probe=malloc_trim if trim_available() else None,
                       held=None if free is None or None in free else free,
                       in_use=None if used is None or None in used else used)
    record = {**verdict.to_record(), "basis": basis, "steps_per_value": unit,
              "per_step": verdict.slope / unit if unit else None, "values": values}
    if basis == "steps":
        # said in steps, as the doctor says it: `memfit report` of a doctor's workdir read
        # "+8.0 MiB/epoch over 10 epochs" of 40 steps in one epoch
        per_epochs = (f"{format_size(verdict.slope, signed=True)}/epoch over "
                      f"{verdict.epochs} epochs")
        in_steps = (f"{format_size(verdict.slope / unit, signed=True)}/step over "
                    f"{len(st.step_rss)} training steps")
        record.update(headline=verdict.headline.replace(per_epochs, in_steps),
                      explanation=explained(verdict, "steps"))
    return record


def _kept(st: _State) -> dict | None:
    """Allocator retention seen after del + gc.collect() between fit calls, or None."""
    from memfit.memory.classifier import classify_release

    verdict = classify_release(st.release.releases)
    return None if verdict is None else verdict.to_record()


def _causes() -> dict:
    """Live Keras models and ``tf.function`` objects traced many times."""
    import gc

    out: dict[str, Any] = {"models_alive": None, "retraced": []}
    keras = sys.modules.get("keras")
    tf = sys.modules.get("tensorflow")
    model_class = getattr(keras, "Model", None)
    function_class = None
    if tf is not None:
        function_class = getattr(getattr(tf, "types", None), "experimental", None)
        function_class = getattr(function_class, "PolymorphicFunction", None) or \
            getattr(function_class, "GenericFunction", None)
    models, inner, retraced = [], set(), []
    for obj in gc.get_objects():
        if model_class is not None and isinstance(obj, model_class):
            models.append(id(obj))
            functional = getattr(obj, "_functional", None)   # a Sequential's inner model
            if functional is not None:
                inner.add(id(functional))
        elif function_class is not None and isinstance(obj, function_class):
            try:
                count = obj.experimental_get_tracing_count()
            except Exception:       # noqa: BLE001
                continue
            if count >= 5:
                retraced.append({"name": getattr(obj, "__name__", "?"), "traces": count})
    out["models_alive"] = (len([m for m in models if m not in inner])
                           if model_class is not None else None)
    out["retraced"] = sorted(retraced, key=lambda r: r["traces"], reverse=True)[:5]
    return out


def _estimate(st: _State, device: str) -> dict | None:
    fit = st.fit or {}
    batch = fit.get("batch_size")
    if st.model is None or not batch:
        return None
    from memfit.estimate.estimator import estimator_for
    from memfit.estimate.model import EstimateError

    try:
        try:
            est = estimator_for(st.model, device=device)
        except EstimateError:
            shape = fit.get("input_shape")
            if not shape:
                raise
            est = estimator_for(st.model, device=device, input_shape=tuple(shape))
        e = est.at(int(batch))
    except Exception as exc:        # noqa: BLE001 - the estimate is a bonus; say why not
        return {"error": f"{type(exc).__name__}: {exc}", "batch_size": batch}
    out = e.to_json()
    heavy = sorted(e.layers, key=lambda r: r.kept_bytes, reverse=True)
    kept = sum(r.kept_bytes for r in e.layers) or 1
    out["layers"] = [{"name": r.name, "type": r.type, "kept": r.kept_bytes * e.batch_size,
                      "share": r.kept_bytes / kept} for r in heavy[:5] if r.kept_bytes]
    out["smaller"] = [{"batch_size": b, "total": est.total(b),
                       "activations": est.at(b).activations}
                      for b in (e.batch_size // 2, e.batch_size // 4) if b >= 1]
    # What grows with the batch at the step's peak: activations, their gradients, kernel
    # buffers (the tensors at the peak, less what they come to at one sample: weight
    # gradients and other fixed parts).
    one = est.at(1)
    out["batch_memory"] = max(0, e.activations + e.gradients
                              - one.activations - one.gradients)
    return out


def _save_model(st: _State, path: Path) -> str | None:
    try:
        tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
        st.model.save(tmp)
        os.replace(tmp, path)
        return str(path)
    except Exception:       # noqa: BLE001 - subclassed models may not save: no command then
        return None


def _model_and_device(st: _State) -> dict[str, Any]:
    """The GPU settings, the estimate of the model's step and, for a model whose step
    needs much memory, the model saved for ``memfit estimate``."""
    from memfit.doctor.gpu import gpu_state

    try:
        gpu = gpu_state()
    except Exception:               # noqa: BLE001
        gpu = None
    out: dict[str, Any] = {"gpu": gpu, "model_file": None, "estimate": None}
    # The estimator traces TensorFlow graphs: on another Keras backend (JAX) it would
    # import TensorFlow into the training it measures, and not describe its memory.
    if _keras_backend() == "tensorflow":
        e = out["estimate"] = _estimate(st, "gpu:0" if gpu else "cpu")
        if (e and "error" not in e and e["batch_memory"] >= SAVE_MODEL_ACTIVATIONS
                and st.results_dir is not None):
            out["model_file"] = _save_model(st, st.results_dir.parent / "doctor-model.keras")
    return out


def _write_results(st: _State, results: ProbeResults) -> None:
    """Writes the results where the parent reads them (a failure is said, not raised)."""
    if st.results_dir is None:                  # outside memfit doctor
        return
    try:
        st.results_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(results_path(st.results_dir, st.run_id, st.pid),
                          json.dumps(results.to_json(), default=str))
    except OSError as e:
        sys.stderr.write(f"memfit doctor: could not write the probe's results to "
                         f"{str(st.results_dir)!r} ({e.strerror})\n")


def finish() -> ProbeResults | None:
    """Measures the end of the run and writes the results for the parent (once).

    Returns:
        The results written, or ``None`` when already written, in another process (a
        fork), or outside ``memfit doctor``.
    """
    st = _state()
    with st.lock:
        if st.finished or os.getpid() != st.pid:
            return None
        st.finished = True
    st.release.close()
    final = sample()
    arrays = resident_arrays()
    own_count, own_bytes = memfit_buffers()
    measured: dict[str, Any] = {
        "format": FORMAT, "pid": st.pid, "argv": list(sys.argv), "run": st.run_id,
        "steps": st.steps, "fits": st.fits, "stopped": st.stop_reason,
        "steps_limit": st.steps_limit, "seconds_limit": st.seconds_limit,
        "duration": time.time() - st.started,
        "train_seconds": None if st.fit_started is None else time.time() - st.fit_started,
        "rss_before_fit": st.rss_before_fit, "rss_first_step": st.rss_first_step,
        "rss_final": _anon(final),
        "rss_peak_steps": max(st.step_rss) if st.step_rss else None,
        "step_rss": st.step_rss[-MAX_STEP_VALUES:], "epoch_rss": st.epoch_rss,
        "fit": st.fit,
        "arrays": {"total": sum(a.nbytes for a in arrays if not a.mapped),
                   "mapped": sum(a.nbytes for a in arrays if a.mapped),
                   "largest": [a.to_json() for a in arrays[:MAX_ARRAYS]],
                   "memfit": {"count": own_count, "bytes": own_bytes}},
        "epochs": st.epochs, "epochs_limit": st.epochs_limit,
        "releases": [r.to_record() for r in st.release.releases],
    }
    for key, compute in (("verdict", lambda: _verdict(st)), ("causes", _causes),
                         ("kept", lambda: _kept(st))):
        try:
            measured[key] = compute()
        except Exception as e:      # noqa: BLE001
            measured[key] = {"error": f"{type(e).__name__}: {e}"}
    measured.update(_model_and_device(st))
    results = ProbeResults.from_json(measured)
    _write_results(st, results)
    log = _log(st) if st.steps else st.log
    if log is not None:
        log.write(Event.DOCTOR, steps=st.steps, stopped=st.stop_reason, **final.as_record())
        log.close()
        st.log = None
    return results
