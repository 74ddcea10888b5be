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

The other callbacks of ``fit`` are part of the training: their state goes into every
checkpoint and back on resume (:mod:`memfit.supervise.callback_state`). So that it is
all of them, the checkpoint is taken after every callback has run for that step or
epoch, the state is put back after every callback's own ``on_train_begin``, and a
resumed epoch's repeated start and skipped steps are not shown to the callbacks whose
state already holds them (:mod:`memfit.supervise.fit_hooks`). A training that had
stopped (``EarlyStopping``) trains no further when resumed. ``BackupAndRestore``
beside a session is refused: both would restore the model.

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
from memfit.data.pipeline import is_dataset, reshuffles
from memfit.memory.log import Event, MemoryLog
from memfit.memory.probe import sample
from memfit.sizes import format_count
from memfit.supervise import callback_state, exactness, fit_hooks, rng
from memfit.supervise.checkpoint import (
    Checkpoint,
    CheckpointStore,
    CheckpointWriteError,
    where,
)
from memfit.supervise.held_lines import say_held
from memfit.supervise.metrics import (
    metrics_result,
    read_metrics,
    restore_metrics,
    restore_metrics_in_state,
    scalar_logs,
)
from memfit.supervise.preempt import SigtermGuard
from memfit.supervise.restart_protocol import SessionConfigError
from memfit.supervise.snapshot import fingerprint, load_arrays, load_model, save_model
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
        self._in_fit = False
        self._stepped = False           # this process's first step logged (first_step)
        self._train_metrics: list[np.ndarray] | None = None
        self._sigterm = SigtermGuard(session.preempt)
        # fit's callback list (fit_hooks), the checkpoint this fit resumes from, the
        # other callbacks' state to save while validating, and what was warned about.
        self._list: Any = None
        self._hooked: set[int] = set()
        self._ckpt: Checkpoint | None = None
        self._csv_undo: list = []
        self._replay_epoch_begin = False
        self._test_callbacks: tuple | None = None
        self._watcher: callback_state.Watcher | None = None
        self._warned: set[str] = set()
        self._epoch_logs: dict | None = None
        # The RNG states when the current epoch began, and a mid-epoch checkpoint's
        # states to put back after its skipped steps.
        self._epoch_rng: dict | None = None
        self._pending_rng: dict | None = None
        # A checkpoint taken inside an epoch after a callback stopped the training.
        self._stop_after_skip = False
        self._csv_started = False       # csvlogger-start.json removed (after a checkpoint)

    # Seeing the other callbacks ------------------------------------------------------------
    def set_model(self, model: Any) -> None:
        super().set_model(model)
        found = fit_hooks.find_list(self)
        if found is not None and fit_hooks.install(found, self):
            self._hooked.add(id(found))

    def _others(self) -> list:
        return list(self._list.callbacks) if self._list is not None else []

    def before_train_begin(self, callbacks: Any) -> None:
        """Before any callback's ``on_train_begin`` (:mod:`memfit.supervise.fit_hooks`)."""
        self._list = callbacks
        for cb in callbacks.callbacks:
            if isinstance(cb, keras.callbacks.BackupAndRestore):
                raise SessionConfigError(
                    "keras.callbacks.BackupAndRestore cannot run beside memfit.session(): "
                    "both restore the model when fit begins, and its backup would be "
                    "loaded over the session's checkpoint. Remove it from fit's callbacks; "
                    "the session's checkpoints hold what it saves (weights, optimizer, "
                    "epoch) and the step, RNGs, data position and callback states too.")
        if self._restored:
            return
        self._ckpt = self.session.store.recover()
        saved = self._ckpt.contents if self._ckpt is not None else None
        at = saved.epoch if saved is not None else 0
        given = _fit_argument("initial_epoch")
        if isinstance(given, int) and given not in (0, at):
            # a stranger's fit(initial_epoch=2) trained data epoch 0 at fit's epoch 2, and
            # after a restart data epoch 5 at fit's epoch 5: another order
            raise SessionConfigError(
                f"fit(initial_epoch={given}) beside memfit.session(): the session starts fit "
                f"where its checkpoint left off (epoch {at + 1} here) and orders s.dataset "
                f"by that epoch, so another start would resume on another order. Leave "
                f"initial_epoch out, or pass initial_epoch=s.epoch.")
        if saved is not None and saved.callbacks is not None:
            self._csv_undo = callback_state.prepare_csv_loggers(callbacks.callbacks,
                                                                saved.callbacks)
        elif saved is None:
            callback_state.start_csv_loggers(callbacks.callbacks, self._csv_start())
        if saved is not None:
            self._warned.update(saved.inexact)

    def after_train_begin(self, callbacks: Any) -> None:
        """After every callback's ``on_train_begin``: their saved state goes back."""
        for cb, append in self._csv_undo:
            cb.append = append
        self._csv_undo = []
        ckpt, self._ckpt = self._ckpt, None
        self._watcher = callback_state.Watcher(callbacks.callbacks)
        if ckpt is None:
            return
        saved = ckpt.contents
        if saved.callbacks is not None:
            arrays = load_arrays(ckpt, callback_state.ARRAY_PREFIX)
            for problem in callback_state.restore(callbacks.callbacks, saved.callbacks,
                                                  arrays):
                print(f"memfit: warning: {problem}; the resume is inexact for it.",
                      file=sys.stderr)
        self._replay_epoch_begin = saved.step > 0
        if saved.stopped and saved.step:
            # Stopped inside the epoch (TerminateOnNaN, a callback's stop_training at a
            # step that was also checkpointed): the epoch still ends as it did, with its
            # validation and every callback's on_epoch_end; fit stops after its skipped
            # steps, where it stopped before.
            self._stop_after_skip = True
        elif saved.stopped:
            # fit reads the first epoch after on_train_begin: run none.
            self.model._initial_epoch = max(saved.epoch, int(self.params.get("epochs", 0)))

    def _csv_start(self) -> Any:
        return self.session.store.directory / callback_state.CSV_START

    def replaying(self, hook: str) -> bool:
        """Whether ``hook`` (``"epoch_begin"``, ``"batch_begin"``, ``"batch_end"``) now
        replays what the checkpoint already holds (a resumed epoch's start, a skipped
        step)."""
        if hook == "epoch_begin":
            replay, self._replay_epoch_begin = self._replay_epoch_begin, False
            return replay
        if hook == "batch_begin":
            return self._skip > 0
        return self._original_train_function is not None

    def hidden(self, callback: Any) -> bool:
        """Whether ``callback`` is left out of replayed hooks: its state was restored."""
        return callback_state.handled(callback)

    def _callback_state(self) -> tuple[dict | None, dict[str, np.ndarray], tuple[str, ...]]:
        """The other callbacks' state to save, the arrays it refers to, and every callback
        warned about so far (warning here about those not seen before)."""
        if self._list is None:
            return None, {}, tuple(sorted(self._warned))
        if self._test_callbacks is not None:        # validating: the state before it
            state, arrays, failed = self._test_callbacks
        else:
            state, arrays, failed = callback_state.capture(self._others())
        changed = self._watcher.changed() if self._watcher is not None else []
        for line in failed:
            name = line.split(":", 1)[0]
            if name not in self._warned:
                self._warned.add(name)
                print(f"memfit: warning: the state of callback {line} cannot be saved; a "
                      f"restart starts it from scratch, so the resume is inexact for it.",
                      file=sys.stderr)
        for name, attributes in changed:
            if name not in self._warned:
                self._warned.add(name)
                print(f"memfit: warning: callback {name} keeps state memfit cannot save "
                      f"(changed during training: {', '.join(attributes)}); a restart "
                      f"starts it from scratch, so the resume is inexact for it. Give "
                      f"{name} get_state() and set_state(state) to make it exact.",
                      file=sys.stderr)
        return state, arrays, tuple(sorted(self._warned))

    # Restoring ----------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        self._in_fit = True
        self._sigterm.install(self.model)
        if self._restored:              # a later fit() of the same process goes on
            return
        self._restored = True
        s = self.session
        problem = exactness.refusal(keras.backend.backend())
        if problem is not None:
            raise SessionConfigError(problem)
        if self._list is None:          # fit_hooks did not find fit's callback list
            print(f"memfit: warning: the session cannot see fit's other callbacks in this "
                  f"Keras ({keras.__version__}); their state is not saved, so a resume is "
                  f"inexact for any that keeps one.", file=sys.stderr)
            self._warned.add("*")
        ckpt = self._ckpt if self._ckpt is not None else s.store.recover()
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
            print(self._resuming(ckpt, epoch, step), file=sys.stderr)
        self._check_data()
        if s.preempted:                 # nothing trained since that checkpoint
            self._exit(s.pending_restart() or "preempted")

    def _resuming(self, ckpt: Checkpoint, epoch: int, step: int) -> str:
        """The line a resume prints; where nothing is left to train, that instead (a
        stranger's second ``memfit watch`` of a script "resumed" its finished run and
        trained nothing, in silence)."""
        epochs = int(self.params.get("epochs") or 0) if self.params else 0
        stopped = ckpt.contents.stopped and not step
        if not stopped and not (epochs and epoch >= epochs and not step):
            return f"memfit: resuming from {ckpt.path.name} at {where(epoch, step)} " \
                   f"(seed {self.session.seed})"
        done = (f"was stopped by a callback after epoch {epoch}" if stopped
                else f"already finished its {epoch} epochs")
        return (f"memfit: the run in {self.session.workdir.path} {done} ({ckpt.path.name}): "
                f"nothing is left to train. To train again from the start, give another "
                f"workdir (--workdir, or memfit.session(workdir=...)) or delete "
                f"{self.session.store.directory}.")

    def _check_data(self) -> None:
        """Warns, once, where fit reads a ``tf.data`` pipeline of the user's that
        reshuffles each epoch: its order is not in the checkpoint, so a restart reads its
        first epoch's order again (a stranger's run trained 20 epochs where the same run
        without a restart was stopped after 16, with nothing said)."""
        name = "fit's data (a tf.data .shuffle)"
        if name in self._warned:
            return
        x = _fit_argument("x")
        if x is None or not is_dataset(x) or not reshuffles(x):
            return
        self._warned.add(name)
        print("memfit: warning: fit reads a tf.data pipeline whose .shuffle() reshuffles "
              "each epoch; its order is not in the checkpoint, so after a restart it reads "
              "its first epoch's order again, and the resume is inexact from there. Read "
              "the data with s.dataset(...) (memfit.dataset at epoch=s.epoch), or shuffle "
              "with reshuffle_each_iteration=False, for an exact resume.", file=sys.stderr)

    def release(self) -> None:
        """Gives SIGTERM back its previous handler (the session's end does this; so does
        ``fit``'s)."""
        self._in_fit = False
        self._sigterm.release()

    def _restore(self, ckpt: Checkpoint) -> None:
        self._restore_metrics = load_model(ckpt, self.model, self.session.workdir.path)
        saved = ckpt.contents
        was = (saved.fingerprint or {}).get("backend")
        now = keras.backend.backend()
        if was is not None and was != now and "backend" not in self._warned:
            # a stranger's JAX run resumed on TensorFlow without a word, and ended on
            # weights that matched neither backend's uninterrupted run
            self._warned.add("backend")
            print(f"memfit: warning: {ckpt.path.name} was written on Keras's {was} backend "
                  f"and this process runs on {now}: the weights and the position go back, "
                  f"but the kernels, random generators and data feed are {now}'s, so the "
                  f"resume is inexact. Set KERAS_BACKEND={was} to resume exactly.",
                  file=sys.stderr)
        if saved.rng is not None:
            if saved.step and saved.epoch_rng is not None:
                # Inside an epoch: the RNGs as the epoch began, so that it draws its data
                # order again as it did (fit on NumPy arrays with shuffle=True draws it
                # from NumPy's generator); the checkpoint's states go back after the
                # skipped steps.
                rng.restore(dict(saved.epoch_rng))
                self._pending_rng = dict(saved.rng)
            else:
                rng.restore(dict(saved.rng))
        self._position = ckpt.position
        self._skip_logs = dict(saved.logs)

    def _skip_steps(self, step: int) -> None:
        """Makes the first ``step`` training steps of the resumed epoch read their batch
        and not train on it: those batches were trained on before the restart."""
        model = self.model
        per_call = int(getattr(model, "steps_per_execution", 1) or 1)
        self._skip = math.ceil(step / per_call)
        self._original_train_function = model.train_function
        logs = self._skip_logs
        jax_state = keras.backend.backend() == "jax"

        def skipping(*call: Any) -> Any:
            # TensorFlow: train_function(iterator) -> logs; JAX: train_function(state,
            # iterator) -> (logs, state), the model's variables held in ``state``;
            # PyTorch: train_function(batches) -> logs.
            data = call[-1]
            state = call[0] if jax_state and len(call) == 2 else None
            if self._skip > 0:
                self._skip -= 1
                # TensorFlow's and JAX's train functions pull their batches from the
                # iterator they are given (PyTorch gets them pulled already, in a list).
                batches = data if isinstance(data, list | tuple) else []
                if not isinstance(data, list | tuple):
                    for _ in range(per_call):
                        try:
                            batches.append(next(data))
                        except StopIteration:
                            break
                if self._restore_metrics is not None and batches:
                    saved, self._restore_metrics = self._restore_metrics, None
                    if state is not None:
                        state = restore_metrics_in_state(model, saved, state)
                    else:
                        restore_metrics(model, saved, batches[0])
                if self._skip == 0 and self._pending_rng is not None:
                    rng.restore(self._pending_rng)      # where the checkpoint left them
                    self._pending_rng = None
                if self._skip == 0 and self._stop_after_skip:
                    model.stop_training = True          # where the training stopped
                    self._stop_after_skip = False
                return (dict(logs), state) if state is not None else dict(logs)
            # Not self.model here: on JAX that syncs the step state into the variables,
            # and the train function is about to donate (free) that state.
            self._unwrap(model)
            return model.train_function(*call)

        model.train_function = skipping

    def _unwrap(self, model: Any = None) -> None:
        if self._original_train_function is not None:
            (model if model is not None else self.model).train_function = \
                self._original_train_function
            self._original_train_function = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._position = (epoch, self._position[1] if epoch == self._position[0] else 0)
        self._epoch_rng = rng.capture()

    # Checkpointing ------------------------------------------------------------------------
    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._skip > 0 or self._original_train_function is not None:
            return          # a skipped step: nothing new to save
        epoch = self._position[0]
        self._position = (epoch, batch + 1)
        if not self._stepped:
            # the end of the start-up a restart pays: the step's trace and compile too
            # (JAX recompiles 3-4 s in each new process, after the resume event)
            self._stepped = True
            self.session.log.write(Event.FIRST_STEP, epoch=epoch, step=batch + 1)
        if id(self._list) not in self._hooked:
            self.after_train_batch_end(batch)

    def after_train_batch_end(self, batch: int) -> None:
        """After every callback's ``on_train_batch_end``: checkpoint if due, exit if a
        restart is asked."""
        if self._skip > 0 or self._original_train_function is not None:
            return
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
            if self._list is not None:
                self._test_callbacks = callback_state.capture(self._others())

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
        self._test_callbacks = None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        # The list hands every callback this one dict; callbacks after this one add to
        # it (ReduceLROnPlateau its learning_rate), so it is read once all have run.
        self._epoch_logs = logs
        self._position = (epoch + 1, 0)
        self._epochs_here += 1
        if id(self._list) not in self._hooked:
            self.after_epoch_end(epoch)

    def after_epoch_end(self, epoch: int) -> None:
        """After every callback's ``on_epoch_end`` (the progress bar has printed the
        epoch, ``ReduceLROnPlateau`` has set the rate, ``EarlyStopping`` has decided):
        the epoch's checkpoint, and the exit when a restart is due."""
        s = self.session
        for key, value in scalar_logs(self._epoch_logs).items():
            s.history.setdefault(key, []).append(value)
        self._epoch_logs = None
        reason = s.pending_restart()
        every = s.restart_every
        if reason is None and every and self._epochs_here >= every:
            reason = f"every {format_count(every, 'epoch')}"
        last = self.model.stop_training or epoch + 1 >= int(self.params.get("epochs", 0))
        if reason is not None and last:
            reason = None               # fit ends now: nothing to restart for
        self._save(reason or "epoch")
        if reason is not None:
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
        callbacks, arrays, inexact = self._callback_state()
        state = CheckpointState(epoch=epoch, step=step, seed=s.seed, reason=reason,
                                history=s.history, logs=logs, rng=rng.capture(),
                                epoch_rng=self._epoch_rng if step else None,
                                fingerprint=fingerprint(model), callbacks=callbacks,
                                stopped=bool(model.stop_training), inexact=inexact)
        try:
            ckpt = s.store.write(state, lambda d: save_model(d, model,
                                                             metrics if step else None,
                                                             arrays))
        except CheckpointWriteError as e:
            self._stop_unwritable(e)
        if not self._csv_started:           # the checkpoint holds the CSV sizes now
            self._csv_started = True
            self._csv_start().unlink(missing_ok=True)
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
        say_held()              # the monitor's verdict on the epoch, before the exit line
        if s.verbose:
            why = "after the signal" if s.preempted else "for a restart"
            # A new line ends Keras's progress bar, where there is one (verbose=1).
            bar = "\n" if getattr(self, "params", None) and self.params.get("verbose") == 1 \
                else ""
            print(f"{bar}memfit: checkpointed at {where(epoch, step)}; exiting with code "
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
        self.release()
        self._unwrap()
        self.model._initial_epoch = None
        history = getattr(self.model, "history", None)
        if isinstance(history, keras.callbacks.History):
            # fit() returns this object: make it hold every epoch of the run.
            history.history = {k: list(v) for k, v in self.session.history.items()}
            length = max((len(v) for v in history.history.values()), default=0)
            history.epoch = list(range(length))


def _fit_argument(name: str) -> Any:
    """An argument of the ``fit`` call this callback runs in (Keras hands a callback the
    model, not the data): read from the frame of Keras's ``fit`` up the stack, or
    ``None``."""
    frame = sys._getframe(1)
    for _ in range(40):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name == "fit" and "keras" in code.co_filename \
                and "trainer" in code.co_filename:
            return frame.f_locals.get(name)
        frame = frame.f_back
    return None
