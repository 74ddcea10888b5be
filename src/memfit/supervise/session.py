"""The child side of a supervised run: checkpoint at every epoch end, resume exactly.

``memfit.session()`` is used inside an ordinary Keras training script. Its ``callback``
restores the newest checkpoint when ``fit`` begins — weights and optimizer state, the
epoch and the step within it, the metric states of a half-done epoch, the RNG states
(Python, NumPy, Keras seed generators), the history so far — and writes a new
checkpoint at every epoch end (and every ``checkpoint_every`` steps). With
``memfit.dataset(..., epoch=s.epoch)`` the data order is a function of ``(seed,
epoch)``, so a resumed run sees exactly the batches an uninterrupted one sees; in a
half-done epoch, the batches already trained on are read and skipped, not trained on
again.

Under ``memfit run`` the session also restarts itself on the supervisor's behalf: after
``--restart-every`` epochs, or when asked to (``--max-rss``, see
:mod:`memfit.supervise.protocol`), it finishes the current step, checkpoints and exits
with ``memfit.exitcodes.RESTART`` (75).

Preemption: while ``fit`` runs, SIGTERM (what Kubernetes, Slurm and spot instances send
before a kill) makes the session finish the current step (or, during validation, the
current validation batch), checkpoint and exit with 143 (128 + SIGTERM), with or
without ``memfit run``; the next start resumes with no step redone. A checkpoint that
cannot be written (disk full, file-size limit) keeps the previous one and stops the
run with exit code ``memfit.exitcodes.CHECKPOINT_FAILED`` (74) and a message saying
what failed, where.

Example:
    >>> import keras, memfit
    >>> with memfit.session(seed=42) as s:                              # doctest: +SKIP
    ...     model = build_model()                                       # compiled
    ...     train = s.dataset("data/train", 128, features=("x", "y"))
    ...     model.fit(train, epochs=10, callbacks=[s.callback])
    >>> s.history["loss"]                       # all 10 epochs, across restarts
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import keras
import numpy as np

from memfit import exitcodes
from memfit.env import MAX_RSS_ENV, RESTART_EVERY_ENV, SUPERVISOR_ENV
from memfit.errors import MemfitError
from memfit.memory.log import MemoryLog
from memfit.memory.probe import sample
from memfit.sizes import format_size
from memfit.supervise import protocol, rng
from memfit.supervise.checkpoint import (
    ARRAYS_NAME,
    WEIGHTS_NAME,
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    CheckpointWriteError,
    where,
)
from memfit.workdir import Workdir, default_workdir

__all__ = ["Session", "SessionCallback", "SessionConfigError", "session", "current"]

_current: Session | None = None

_MAX_SEED = 2**31 - 1


class SessionConfigError(MemfitError):
    """The run cannot go on as configured; a supervisor stops instead of restarting."""


def _positive_int(name: str, value: Any, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer{' or None' if allow_none else ''}"
                         f". Received: {name}={value!r}")
    return value


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise SessionConfigError(f"${name} must be an integer, as memfit run sets it. "
                                 f"Received: {name}={raw!r}") from None


def fingerprint(model: keras.Model) -> dict:
    """What must match between a checkpoint and the model it is loaded into."""
    return {"weights": [[list(v.shape), str(v.dtype)] for v in model.weights],
            "names": [v.path for v in model.weights],
            "optimizer": type(model.optimizer).__name__ if model.optimizer else None,
            "optimizer_variables": len(model.optimizer.variables) if model.optimizer else 0}


def _mismatch(saved: dict, now: dict) -> str | None:
    """The first difference between two fingerprints, in words, or ``None``."""
    if len(saved["weights"]) != len(now["weights"]):
        return (f"the checkpoint has {len(saved['weights'])} weight tensors, this model "
                f"{len(now['weights'])}")
    for i, (a, b) in enumerate(zip(saved["weights"], now["weights"], strict=True)):
        if a != b:
            return (f"weight {i} ({now['names'][i]!r}) is {tuple(a[0])} {a[1]} in the "
                    f"checkpoint and {tuple(b[0])} {b[1]} in this model")
    if saved["optimizer"] != now["optimizer"]:
        return (f"the checkpoint's optimizer is {saved['optimizer']}, this model's "
                f"{now['optimizer']}")
    if saved["optimizer_variables"] != now["optimizer_variables"]:
        return (f"the checkpoint's optimizer has {saved['optimizer_variables']} variables, "
                f"this model's {now['optimizer_variables']}")
    return None


def _extra_variables(model: keras.Model) -> list:
    """Model variables that ``save_weights`` leaves out (seed generator states)."""
    saved = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in saved]


def _replicas(variable: Any) -> tuple | None:
    """The per-replica copies of a variable that has one per replica (a metric's state
    under a ``tf.distribute`` strategy is a sync-on-read variable), else ``None``."""
    parts = getattr(getattr(variable, "value", variable), "values", None)
    return tuple(parts) if isinstance(parts, tuple | list) and len(parts) > 1 else None


def _read_state(variable: Any) -> np.ndarray:
    """A metric variable's state: its value, or its per-replica copies stacked on a new
    first axis. The copies, not their sum: assigning a sum splits it evenly across the
    replicas, and the next step's rounding would differ from an uninterrupted run's."""
    parts = _replicas(variable)
    if parts is None:
        return np.asarray(variable.numpy())
    return np.stack([np.asarray(part.numpy()) for part in parts])


def _write_state(variable: Any, value: np.ndarray) -> None:
    """Puts back what :func:`_read_state` read."""
    parts = _replicas(variable)
    if parts is None:
        variable.assign(value)
        return
    for part, part_value in zip(parts, value, strict=True):
        part.assign(part_value)


def _scalar_logs(logs: dict | None) -> dict[str, float]:
    out = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(np.asarray(value))
        except (TypeError, ValueError):
            continue
    return out


class Session:
    """One training run's resumable state; made by :func:`session`.

    Attributes:
        workdir: the run's :class:`memfit.workdir.Workdir`.
        seed: the run's seed (the given one, else the checkpoint's, else a new random one
            kept in the checkpoints so that every resume uses it).
        epoch: the epoch training resumes at (0 for a fresh start).
        step: steps of ``epoch`` already trained (0 at an epoch boundary).
        resumed: whether a checkpoint was found.
        history: per-epoch logs of all epochs so far, across restarts (like
            ``History.history``); ``fit``'s returned History holds the same at its end.
        checkpoint: the checkpoint resumed from, or ``None``.
        device: what :func:`memfit.configure_device` did with the GPU cap or growth that
            ``memfit share`` handed down (``None`` when none was).
    """

    def __init__(self, workdir: str | os.PathLike | None = None, *, seed: int | None = None,
                 checkpoint_every: int | None = None, deterministic: bool = False,
                 verbose: int = 1):
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or not 0 <= seed <= _MAX_SEED):
            raise ValueError(f"seed must be an integer from 0 to {_MAX_SEED}, or None. "
                             f"Received: seed={seed!r}")
        self.checkpoint_every = _positive_int("checkpoint_every", checkpoint_every)
        self.verbose = verbose
        self.workdir = Workdir(default_workdir(protocol.DEFAULT_WORKDIR) if workdir is None
                               else workdir).create()
        self.store = CheckpointStore(self.workdir.checkpoints)
        self.store.clean()
        self.checkpoint: Checkpoint | None = self.store.recover()
        self.supervised = bool(os.environ.get(SUPERVISOR_ENV))
        self.restart_every = _env_int(RESTART_EVERY_ENV) if self.supervised else None
        self.max_rss = _env_int(MAX_RSS_ENV) if self.supervised else None
        saved_seed = self.checkpoint.state.get("seed") if self.checkpoint else None
        if seed is not None and saved_seed is not None and seed != saved_seed:
            raise CheckpointError(
                f"The checkpoints in {str(self.store.directory)!r} belong to a run with "
                f"seed={saved_seed}, not seed={seed}; nothing was changed. Use a new workdir "
                f"for a new run, or pass seed={saved_seed} to resume that one.")
        if seed is None:
            seed = saved_seed if saved_seed is not None else \
                int(np.random.SeedSequence().generate_state(1)[0]) & _MAX_SEED
        self.seed: int = seed
        self.epoch, self.step = self.checkpoint.position if self.checkpoint else (0, 0)
        self.resumed = self.checkpoint is not None
        self.history: dict[str, list[float]] = {
            k: list(v) for k, v in (self.checkpoint.state.get("history", {})
                                    if self.checkpoint else {}).items()}
        # Under memfit share the GPU cap is handed down; it must be set before
        # TensorFlow touches the GPU, which seeding below may do.
        self.device = None
        from memfit.device import configure_device
        from memfit.env import GPU_MEMORY_GROWTH_ENV, GPU_MEMORY_LIMIT_ENV

        if os.environ.get(GPU_MEMORY_LIMIT_ENV) or os.environ.get(GPU_MEMORY_GROWTH_ENV):
            self.device = configure_device()
        if deterministic:
            import tensorflow as tf

            tf.config.experimental.enable_op_determinism()
        rng.seed_everything(self.seed)
        log = self.workdir.log
        self.log = MemoryLog(log, source="session",
                             header=not (log.exists() and log.stat().st_size > 0))
        self._restart_reason: str | None = None
        self.preempted: int | None = None     # the signal that asked the run to stop
        self.callback = SessionCallback(self)
        global _current
        _current = self

    def dataset(self, path: str | os.PathLike, batch_size: int, **kwargs: Any) -> Any:
        """``memfit.dataset(path, batch_size, seed=self.seed, epoch=self.epoch, ...)``:
        the stream positioned where this run resumes.

        Example:
            >>> train = s.dataset("data/train", 128, features=("x", "y"))  # doctest: +SKIP

        Args:
            path: the packed dataset.
            batch_size: samples per batch.
            **kwargs: any other :func:`memfit.dataset` argument (not ``seed``/``epoch``).
        """
        from memfit.data.stream import dataset

        for name in ("seed", "epoch"):
            if name in kwargs:
                raise ValueError(f"Session.dataset sets {name} itself (the run's {name} "
                                 f"is {getattr(self, name)}); call memfit.dataset to choose "
                                 f"it. Received: {name}={kwargs[name]!r}")
        return dataset(path, batch_size, seed=self.seed, epoch=self.epoch, **kwargs)

    def request_restart(self, reason: str) -> None:
        """Checkpoints after the current step and exits with code 75 for a restart
        (only under a supervisor; otherwise it is ignored with a warning)."""
        if not self.supervised:
            print(f"memfit: restart asked ({reason}) but no supervisor runs this process "
                  f"(start it with `memfit run -- ...`); going on.", file=sys.stderr)
            return
        self._restart_reason = reason

    def preempt(self, signum: int = signal.SIGTERM) -> None:
        """Checkpoints after the current step and exits with ``128 + signum`` (what the
        session's SIGTERM handler calls while ``fit`` runs; supervised or not)."""
        if not self.preempted and self.verbose:
            print(f"\nmemfit: {_signal_name(signum)} received: finishing the current step, "
                  f"then checkpointing and exiting", file=sys.stderr)
        self.preempted = signum
        self._restart_reason = f"preempted ({_signal_name(signum)})"

    def pending_restart(self) -> str | None:
        """Why the session should exit for a restart now, or ``None``."""
        if self._restart_reason is None and self.supervised:
            request = protocol.read_request(self.workdir.path)
            if request is not None:
                self._restart_reason = str(request["reason"])
        return self._restart_reason

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: object) -> bool:
        self.callback.release()
        if isinstance(error, CheckpointError | SessionConfigError) and self.supervised:
            _refuse(error, self.log)
        self.log.close()
        return False


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _refuse(error: Exception, log: MemoryLog | None) -> None:
    """Under a supervisor, a run that cannot work must not be restarted: say why and exit
    with ``memfit.exitcodes.CONFIG`` (78)."""
    print(f"memfit: error: {error}", file=sys.stderr)
    if log is not None:
        log.write("stop", reason="config", message=str(error))
        log.close()
    raise SystemExit(exitcodes.CONFIG) from None


class SessionCallback(keras.callbacks.Callback):
    """The Keras callback of a :class:`Session` (``s.callback``): restores at the start
    of ``fit``, checkpoints at epoch ends, exits for a restart when asked.

    Keep one per session; pass it to every ``fit`` call of the run.
    """

    def __init__(self, session: Session):
        super().__init__()
        self.session = session
        self._position = (session.epoch, session.step)
        self._epochs_here = 0
        self._skip = 0
        self._skip_logs: dict[str, float] = {}
        self._original_train_function: Any = None
        self._restore_metrics: dict[str, np.ndarray] | None = None
        self._restored = False
        self._epoch_done = False
        self._in_fit = False
        self._train_metrics: list[np.ndarray] | None = None
        self._previous_handler: Any = None

    # Restoring ----------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        self._in_fit = True
        self._handle_sigterm()
        if self._restored:              # a later fit() of the same process goes on
            return
        self._restored = True
        s = self.session
        ckpt = s.store.recover()
        if ckpt is not None:
            self._restore(ckpt)
        self._check_baseline()
        epoch, step = self._position
        if epoch:
            self.model._initial_epoch = epoch   # as keras.callbacks.BackupAndRestore does
        if step:
            self._skip_steps(step)
        s.log.write("resume", epoch=epoch, step=step, fresh=ckpt is None, seed=s.seed,
                    **sample().as_record())
        if s.verbose and ckpt is not None:
            print(f"memfit: resuming from {ckpt.path.name} at {where(epoch, step)} "
                  f"(seed {s.seed})", file=sys.stderr)
        if s.preempted:                 # nothing trained since that checkpoint
            self._exit(s.pending_restart() or "preempted")

    def _handle_sigterm(self) -> None:
        """While ``fit`` runs, SIGTERM asks for a checkpoint after the current step and an
        exit (a handler the script set itself is left alone)."""
        if threading.current_thread() is not threading.main_thread() \
                or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        session = self.session

        def preempt(signum: int, frame: Any) -> None:
            if not self._in_fit or not self._fitting(frame):
                # fit ended by an exception (no on_train_end): the signal's default effect
                self._release_sigterm()
                os.kill(os.getpid(), signum)
                return
            session.preempt(signum)

        self._previous_handler = signal.signal(signal.SIGTERM, preempt)

    def _fitting(self, frame: Any) -> bool:
        """Whether this model's ``fit`` is on the interrupted stack."""
        while frame is not None:
            if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is self.model:
                return True
            frame = frame.f_back
        return False

    def release(self) -> None:
        """Gives SIGTERM back its previous handler (the session's end does this; so does
        ``fit``'s)."""
        self._in_fit = False
        self._release_sigterm()

    def _release_sigterm(self) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _restore(self, ckpt: Checkpoint) -> None:
        model = self.model
        optimizer = model.optimizer
        if optimizer is not None and not optimizer.built:
            # Its slots (Adam's moments...) are made at the first step; the checkpoint's
            # values need them now.
            optimizer.build(model.trainable_variables)
        saved = ckpt.state.get("fingerprint")
        problem = _mismatch(saved, fingerprint(model)) if saved else None
        if problem:
            raise CheckpointError(
                f"The workdir {str(self.session.workdir.path)!r} holds checkpoints of another "
                f"model: {problem}. Nothing was overwritten. Use a new --workdir for this "
                f"model, or remove {str(ckpt.path.parent)!r} to start over.")
        model.load_weights(ckpt.weights)
        with np.load(ckpt.arrays) as arrays:
            extra = _extra_variables(model)
            for i, variable in enumerate(extra):
                key = f"variable_{i}"
                if key in arrays.files and tuple(arrays[key].shape) == tuple(variable.shape):
                    variable.assign(arrays[key])
            self._restore_metrics = {k: arrays[k] for k in arrays.files
                                     if k.startswith("metric_")} or None
        rng.restore(ckpt.state["rng"])
        self._position = ckpt.position
        self._skip_logs = {k: float(v) for k, v in ckpt.state.get("logs", {}).items()}

    def _skip_steps(self, step: int) -> None:
        """Makes the first ``step`` training steps of the resumed epoch read their batch
        and not train on it: those batches were trained on before the restart."""
        model = self.model
        per_call = int(getattr(model, "steps_per_execution", 1) or 1)
        self._skip = math.ceil(step / per_call)
        self._original_train_function = model.train_function
        logs = self._skip_logs

        def skipping(data: Any) -> dict:
            if self._skip > 0:
                self._skip -= 1
                # TensorFlow's train function pulls its batches from the iterator it is
                # given (other backends get them pulled already, in a list).
                batches = data if isinstance(data, list | tuple) else []
                if not isinstance(data, list | tuple):
                    for _ in range(per_call):
                        try:
                            batches.append(next(data))
                        except StopIteration:
                            break
                if self._restore_metrics is not None and batches:
                    self._continue_metrics(batches[0])
                return dict(logs)
            self._unwrap()
            return model.train_function(data)

        model.train_function = skipping

    def _unwrap(self) -> None:
        if self._original_train_function is not None:
            self.model.train_function = self._original_train_function
            self._original_train_function = None

    def _check_baseline(self) -> None:
        limit = self.session.max_rss
        if not limit:
            return
        now = sample().anon_or_total
        if now >= limit:
            raise SessionConfigError(
                f"--max-rss {format_size(limit)} is below this training process's memory "
                f"after start-up and model build ({format_size(now)}): every restart would "
                f"hit it again. Give a --max-rss above {format_size(now)} plus what a "
                f"training step needs (try {format_size(2 * now)}).")

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self._epoch_done:
            self._maybe_restart()
        self._position = (epoch, self._position[1] if epoch == self._position[0] else 0)

    def _continue_metrics(self, batch: Any) -> None:
        """At the first skipped step of a resumed, half-done epoch (after Keras reset the
        metrics for it): put back the metric states the checkpoint holds, so that the
        epoch's logged means cover all its steps, even when every step is skipped.

        Keras builds its compiled metrics when it first traces a training step; a resume
        whose every step is skipped never traces one, so they are built here from the
        shapes of a real batch (as Keras itself does under a distribution strategy).
        The next trained step then adds to the saved sums and counts exactly as the
        uninterrupted run added to its own.
        """
        saved, self._restore_metrics = self._restore_metrics, None
        model = self.model
        if len(self._metric_variables()) != len(saved):
            try:
                model._symbolic_build(data_batch=batch)     # as fit() does under a strategy
            except Exception as e:  # noqa: BLE001 - reported, training goes on
                print(f"memfit: could not build the metrics to restore them ({e})",
                      file=sys.stderr)
        variables = self._metric_variables()
        shapes = [tuple(saved.get(f"metric_{i}", np.empty(())).shape)
                  for i in range(len(variables))]
        if len(saved) != len(variables) or \
                shapes != [_read_state(v).shape for v in variables]:
            print("memfit: the metrics differ from the checkpoint's; this epoch's logged "
                  "metrics cover only the steps since the resume", file=sys.stderr)
            return
        for i, variable in enumerate(variables):
            _write_state(variable, saved[f"metric_{i}"])

    def _metric_variables(self) -> list:
        return [v for m in self.model.metrics for v in m.variables]

    # Checkpointing ------------------------------------------------------------------------
    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._skip > 0 or self._original_train_function is not None:
            return          # a skipped step: nothing new to save
        epoch = self._position[0]
        self._position = (epoch, batch + 1)
        s = self.session
        reason = s.pending_restart()
        if reason is not None:
            self._save(reason)
            self._exit(reason)
        if s.checkpoint_every and (batch + 1) % s.checkpoint_every == 0:
            self._save("steps")

    def on_test_begin(self, logs: dict | None = None) -> None:
        # Validation inside fit: Keras resets the metrics for it right after this call,
        # so their training states are kept aside for a checkpoint taken during it.
        if self._in_fit:
            self._train_metrics = [_read_state(v) for v in self._metric_variables()]

    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None:
        s = self.session
        if s.preempted and self._in_fit and self._train_metrics is not None:
            # Preempted while validating: every step of the epoch is trained; the resume
            # skips them all and validates again.
            reason = s.pending_restart() or "preempted"
            self._save(reason, metrics=self._train_metrics)
            self._exit(reason)

    def on_test_end(self, logs: dict | None = None) -> None:
        self._train_metrics = None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        s = self.session
        for key, value in _scalar_logs(logs).items():
            s.history.setdefault(key, []).append(value)
        self._position = (epoch + 1, 0)
        self._epochs_here += 1
        self._save("epoch")
        # A restart waits for the next epoch's start: the other callbacks are done with
        # this epoch then (the progress bar has printed it, ReduceLROnPlateau has set
        # the rate, which the restart checkpoint then holds too).
        self._epoch_done = True

    def _maybe_restart(self) -> None:
        self._epoch_done = False
        s = self.session
        every = s.restart_every
        reason = s.pending_restart()
        if reason is None and every and self._epochs_here >= every:
            reason = f"every {every} epoch{'s' if every != 1 else ''}"
        if reason is not None:
            self._save(reason)
            self._exit(reason)

    def _save(self, reason: str, metrics: list[np.ndarray] | None = None) -> Checkpoint:
        """Writes a checkpoint at the current position (``metrics``: the metric states to
        save, when the model's now hold something else, as during validation)."""
        s = self.session
        model = self.model
        epoch, step = self._position
        started = time.perf_counter()
        current = metrics is None          # the model's metrics hold the states to save
        if step and metrics is None:
            metrics = [_read_state(v) for v in self._metric_variables()]

        def fill(directory: Path) -> None:
            model.save_weights(directory / WEIGHTS_NAME)
            arrays = {f"variable_{i}": np.asarray(v.numpy())
                      for i, v in enumerate(_extra_variables(model))}
            if step:
                arrays.update({f"metric_{i}": value for i, value in enumerate(metrics)})
            with open(directory / ARRAYS_NAME, "wb") as f:
                np.savez(f, **arrays)

        # The running means of a half-done epoch, shown for its skipped steps on resume.
        logs = {}
        if step:
            logs = _scalar_logs(model.get_metrics_result() if current else
                                self._metrics_result(metrics))
        state = {"epoch": epoch, "step": step, "seed": s.seed, "reason": reason,
                 "history": s.history, "logs": logs,
                 "rng": rng.capture(), "fingerprint": fingerprint(model)}
        try:
            ckpt = s.store.write(state, fill)
        except CheckpointWriteError as e:
            self._stop_unwritable(e)
        s.log.write("checkpoint", epoch=epoch, step=step, reason=reason, name=ckpt.path.name,
                    seconds=round(time.perf_counter() - started, 4), **sample().as_record())
        return ckpt

    def _metrics_result(self, values: list[np.ndarray]) -> dict:
        """``model.get_metrics_result()`` for the given metric states."""
        variables = self._metric_variables()
        if len(variables) != len(values):
            return {}
        now = [_read_state(v) for v in variables]
        for variable, value in zip(variables, values, strict=True):
            _write_state(variable, value)
        try:
            return self.model.get_metrics_result()
        finally:
            for variable, value in zip(variables, now, strict=True):
                _write_state(variable, value)

    def _stop_unwritable(self, error: CheckpointWriteError) -> None:
        """A checkpoint could not be written: say so and stop; restarting would not help."""
        s = self.session
        print(f"memfit: error: {error}", file=sys.stderr)
        s.log.write("stop", reason="checkpoint-write", message=str(error))
        s.log.close()
        self._release_sigterm()
        raise SystemExit(exitcodes.CHECKPOINT_FAILED)

    def _exit(self, reason: str) -> None:
        epoch, step = self._position
        code = exitcodes.RESTART
        if self.session.preempted:
            code = 128 + self.session.preempted
        if self.session.verbose:
            why = "after the signal" if self.session.preempted else "for a restart"
            print(f"\nmemfit: checkpointed at {where(epoch, step)}; exiting with code "
                  f"{code} {why} ({reason})", file=sys.stderr)
        self.session.log.close()
        # The checkpoint is on disk: leave at once. A normal exit would unwind the
        # script and tear TensorFlow down (1-2 s here, every restart); the script's
        # remaining code, `finally` blocks and atexit handlers are skipped, as they
        # would be after the step if the process were killed.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._epoch_done = False            # the last epoch: nothing to restart for
        self._in_fit = False
        self._release_sigterm()
        self._unwrap()
        self.model._initial_epoch = None
        history = getattr(self.model, "history", None)
        if isinstance(history, keras.callbacks.History):
            # fit() returns this object: make it hold every epoch of the run.
            history.history = {k: list(v) for k, v in self.session.history.items()}
            length = max((len(v) for v in history.history.values()), default=0)
            history.epoch = list(range(length))


def current() -> Session | None:
    """The session this process made last (``MemoryMonitor(on_leak="restart")`` asks it
    to checkpoint and restart), or ``None``."""
    return _current


def session(workdir: str | os.PathLike | None = None, *, seed: int | None = None,
            checkpoint_every: int | None = None, deterministic: bool = False,
            verbose: int = 1) -> Session:
    """Makes a training script resumable: exact restarts, crash recovery, memory restarts.

    Use it as a context manager around the training, pass ``s.callback`` to ``fit`` and
    position the data with ``epoch=s.epoch`` (or ``s.dataset(...)``). Run the script
    under ``memfit run`` to restart it every N epochs, at a memory threshold, or after a
    crash; run alone, it resumes from its last checkpoint when started again.

    Example:
        >>> with memfit.session(seed=42) as s:                          # doctest: +SKIP
        ...     model = build_model()              # an ordinary compiled Keras model
        ...     train = s.dataset("data/train", 128, features=("x", "y"))
        ...     model.fit(train, epochs=10, callbacks=[s.callback])

    Args:
        workdir: the run's workdir (checkpoints in ``WORKDIR/checkpoints``); default
            ``$MEMFIT_WORKDIR`` (set by ``memfit run``), else ``memfit-run``.
        seed: seeds Python, NumPy, TensorFlow and Keras at the start, and is the data
            order's seed for ``s.dataset``. ``None``: the checkpoint's seed, else a new
            random one (kept in the checkpoints). A seed different from the checkpoint's
            is an error: it would be another run.
        checkpoint_every: also checkpoint every this many steps (``None``: at epoch ends
            only, and when a restart is asked).
        deterministic: turn on TensorFlow's op determinism, for bit-identical resumes
            (``tf.config.experimental.enable_op_determinism``; some ops then refuse to
            run or run slower).
        verbose: 0 for silence; 1 prints a line when resuming and when exiting to be
            restarted.

    Returns:
        A :class:`Session`.

    Raises:
        CheckpointError: the workdir's checkpoints are unreadable or belong to another
            run (another seed here; another model when ``fit`` begins). Nothing is
            overwritten.
    """
    try:
        return Session(workdir, seed=seed, checkpoint_every=checkpoint_every,
                       deterministic=deterministic, verbose=verbose)
    except CheckpointError as e:
        if os.environ.get(SUPERVISOR_ENV):
            _refuse(e, None)
        raise
