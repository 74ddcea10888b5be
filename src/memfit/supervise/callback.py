"""The Keras callback of a session (``s.callback``): restore, checkpoint, exit for a restart.

When ``fit`` begins it restores the newest checkpoint (:mod:`memfit.supervise.snapshot`:
weights, optimizer, seed generators; :mod:`memfit.supervise.rng`; the position) and,
in a half-done epoch, makes the steps already trained read their batch and not train
on it, putting the epoch's metric states back at the first of them
(:mod:`memfit.supervise.metrics`). It checkpoints at every epoch end (and every
``checkpoint_every`` steps); when a restart is asked (``--restart-every``,
``--max-rss``, a SIGTERM caught by :mod:`memfit.supervise.preempt`) it checkpoints
after the current step and leaves the process at once with the exit code that says
why (:mod:`memfit.exitcodes`). A checkpoint that cannot be written stops the run with
``memfit.exitcodes.CHECKPOINT_FAILED`` (74).

Example:
    >>> with memfit.session(seed=42) as s:                              # doctest: +SKIP
    ...     model.fit(train, epochs=10, callbacks=[s.callback])
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, Protocol

import keras
import numpy as np

from memfit import exitcodes
from memfit.memory.log import Event, MemoryLog
from memfit.memory.probe import sample
from memfit.supervise import rng
from memfit.supervise.checkpoint import (
    Checkpoint,
    CheckpointStore,
    CheckpointWriteError,
    where,
)
from memfit.supervise.metrics import (
    metrics_result,
    read_metrics,
    restore_metrics,
    scalar_logs,
)
from memfit.supervise.preempt import SigtermGuard
from memfit.supervise.snapshot import fingerprint, load_model, save_model
from memfit.supervise.state import CheckpointState
from memfit.workdir import Workdir

__all__ = ["SessionCallback"]


class _Session(Protocol):
    """What the callback needs of its session (a :class:`memfit.supervise.session.Session`)."""

    epoch: int
    step: int
    seed: int
    history: dict[str, list[float]]
    workdir: Workdir
    store: CheckpointStore
    log: MemoryLog
    verbose: int
    preempted: int | None
    checkpoint_every: int | None
    restart_every: int | None

    def pending_restart(self) -> str | None: ...

    def preempt(self, signum: int) -> None: ...

    def check_baseline(self) -> None: ...


class SessionCallback(keras.callbacks.Callback):
    """The Keras callback of a :class:`~memfit.supervise.session.Session`
    (``s.callback``): restores at the start of ``fit``, checkpoints at epoch ends, exits
    for a restart when asked.

    Keep one per session; pass it to every ``fit`` call of the run.

    Args:
        session: its session.
    """

    def __init__(self, session: _Session):
        super().__init__()
        self.session = session
        self._position = (session.epoch, session.step)
        self._epochs_here = 0
        self._skip = 0
        self._skip_logs: dict[str, float] = {}
        self._original_train_function: Any = None
        self._restore_metrics: list[np.ndarray] | None = None
        self._restored = False
        self._epoch_done = False
        self._in_fit = False
        self._train_metrics: list[np.ndarray] | None = None
        self._sigterm = SigtermGuard(session.preempt)

    # Restoring ----------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        self._in_fit = True
        self._sigterm.install(self.model)
        if self._restored:              # a later fit() of the same process goes on
            return
        self._restored = True
        s = self.session
        ckpt = s.store.recover()
        if ckpt is not None:
            self._restore(ckpt)
        s.check_baseline()
        epoch, step = self._position
        if epoch:
            self.model._initial_epoch = epoch   # as keras.callbacks.BackupAndRestore does
        if step:
            self._skip_steps(step)
        s.log.write(Event.RESUME, epoch=epoch, step=step, fresh=ckpt is None, seed=s.seed,
                    **sample().as_record())
        if s.verbose and ckpt is not None:
            print(f"memfit: resuming from {ckpt.path.name} at {where(epoch, step)} "
                  f"(seed {s.seed})", file=sys.stderr)
        if s.preempted:                 # nothing trained since that checkpoint
            self._exit(s.pending_restart() or "preempted")

    def release(self) -> None:
        """Gives SIGTERM back its previous handler (the session's end does this; so does
        ``fit``'s)."""
        self._in_fit = False
        self._sigterm.release()

    def _restore(self, ckpt: Checkpoint) -> None:
        self._restore_metrics = load_model(ckpt, self.model, self.session.workdir.path)
        if ckpt.contents.rng is not None:
            rng.restore(dict(ckpt.contents.rng))
        self._position = ckpt.position
        self._skip_logs = dict(ckpt.contents.logs)

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
                    saved, self._restore_metrics = self._restore_metrics, None
                    restore_metrics(model, saved, batches[0])
                return dict(logs)
            self._unwrap()
            return model.train_function(data)

        model.train_function = skipping

    def _unwrap(self) -> None:
        if self._original_train_function is not None:
            self.model.train_function = self._original_train_function
            self._original_train_function = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self._epoch_done:
            self._maybe_restart()
        self._position = (epoch, self._position[1] if epoch == self._position[0] else 0)

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
            self._train_metrics = read_metrics(self.model)

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
        for key, value in scalar_logs(logs).items():
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
            metrics = read_metrics(model)
        # The running means of a half-done epoch, shown for its skipped steps on resume.
        logs = {}
        if step:
            logs = scalar_logs(model.get_metrics_result() if current else
                               metrics_result(model, metrics or []))
        state = CheckpointState(epoch=epoch, step=step, seed=s.seed, reason=reason,
                                history=s.history, logs=logs, rng=rng.capture(),
                                fingerprint=fingerprint(model))
        try:
            ckpt = s.store.write(state, lambda d: save_model(d, model,
                                                             metrics if step else None))
        except CheckpointWriteError as e:
            self._stop_unwritable(e)
        s.log.write(Event.CHECKPOINT, epoch=epoch, step=step, reason=reason,
                    name=ckpt.path.name, seconds=round(time.perf_counter() - started, 4),
                    **sample().as_record())
        return ckpt

    def _stop_unwritable(self, error: CheckpointWriteError) -> None:
        """A checkpoint could not be written: say so and stop; restarting would not help."""
        s = self.session
        print(f"memfit: error: {error}", file=sys.stderr)
        s.log.write(Event.STOP, reason="checkpoint-write", message=str(error))
        s.log.close()
        self._sigterm.release()
        raise SystemExit(exitcodes.CHECKPOINT_FAILED)

    def _exit(self, reason: str) -> None:
        epoch, step = self._position
        s = self.session
        code = 128 + s.preempted if s.preempted else exitcodes.RESTART
        if s.verbose:
            why = "after the signal" if s.preempted else "for a restart"
            print(f"\nmemfit: checkpointed at {where(epoch, step)}; exiting with code "
                  f"{code} {why} ({reason})", file=sys.stderr)
        s.log.close()
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
        self.release()
        self._unwrap()
        self.model._initial_epoch = None
        history = getattr(self.model, "history", None)
        if isinstance(history, keras.callbacks.History):
            # fit() returns this object: make it hold every epoch of the run.
            history.history = {k: list(v) for k, v in self.session.history.items()}
            length = max((len(v) for v in history.history.values()), default=0)
            history.epoch = list(range(length))
