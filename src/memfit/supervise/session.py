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

This module is the :class:`Session` object (the run's seed, position, history and
restart requests); the callback that does the work is :mod:`memfit.supervise.callback`.

Under ``memfit run`` the session also restarts itself on the supervisor's behalf: after
``--restart-every`` epochs, or when asked to (``--max-rss``, see
:mod:`memfit.supervise.restart_protocol`), it finishes the current step, checkpoints and exits
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
    >>> len(s.history["loss"])        # every epoch, across restarts    # doctest: +SKIP
    10
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import numpy as np

from memfit import checks, exitcodes
from memfit.device import configure_device
from memfit.env import (
    GPU_MEMORY_GROWTH_ENV,
    GPU_MEMORY_LIMIT_ENV,
    MAX_RSS_ENV,
    RESTART_EVERY_ENV,
    SUPERVISOR_ENV,
    EnvError,
    env_int,
)
from memfit.errors import CorruptShardError
from memfit.memory import warm
from memfit.memory.log import Event, MemoryLog
from memfit.memory.probe import sample
from memfit.sizes import format_size
from memfit.supervise import exactness, restart_protocol, rng
from memfit.supervise.callback import SessionCallback
from memfit.supervise.checkpoint import Checkpoint, CheckpointError, CheckpointStore
from memfit.supervise.restart_protocol import SessionConfigError
from memfit.workdir import Workdir, default_workdir

__all__ = ["Session", "SessionConfigError", "session", "current"]

_current: Session | None = None

_MAX_SEED = 2**31 - 1


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
        changed = warm.changed_environment()
        if changed is not None:         # memfit run starts it again as a new interpreter
            print(f"memfit: {os.path.basename(sys.argv[0])} set {changed}; memfit run starts "
                  f"it again as a new interpreter (set it before memfit run to keep warm "
                  f"starts)", file=sys.stderr)
            raise SystemExit(exitcodes.START_COLD)
        seed = checks.count("seed", seed, minimum=0, optional=True, example=42,
                            hint=f"It must be at most {_MAX_SEED}.")
        if seed is not None and seed > _MAX_SEED:
            raise ValueError(f"seed must be at most {_MAX_SEED} (2**31 - 1). "
                             f"Received: seed={seed!r}")
        self.checkpoint_every = checks.count("checkpoint_every", checkpoint_every,
                                             optional=True, example=100)
        self.verbose = verbose
        self.workdir = Workdir(default_workdir(restart_protocol.DEFAULT_WORKDIR) if workdir is None
                               else workdir).create()
        self.store = CheckpointStore(self.workdir.checkpoints)
        self.store.clean()
        self.checkpoint: Checkpoint | None = self.store.recover()
        self.supervised = bool(os.environ.get(SUPERVISOR_ENV))
        try:
            self.restart_every = env_int(RESTART_EVERY_ENV) if self.supervised else None
            self.max_rss = env_int(MAX_RSS_ENV) if self.supervised else None
        except EnvError as e:               # memfit run stops: a restart reads the same
            raise SessionConfigError(str(e)) from None
        saved = self.checkpoint.contents if self.checkpoint else None
        saved_seed = saved.seed if saved else None
        if seed is not None and saved_seed is not None and seed != saved_seed:
            raise CheckpointError(
                f"The checkpoints in {str(self.store.directory)!r} belong to a run with "
                f"seed={saved_seed}, not seed={seed}; nothing was changed. Use a new workdir "
                f"for a new run, or pass seed={saved_seed} to resume that one.")
        if seed is None:
            seed = saved_seed if saved_seed is not None else \
                int(np.random.SeedSequence().generate_state(1)[0]) & _MAX_SEED
        self.seed: int = seed
        self.epoch, self.step = saved.position if saved else (0, 0)
        self.resumed = saved is not None
        self.history: dict[str, list[float]] = {
            k: list(v) for k, v in (saved.history if saved else {}).items()}
        # Under memfit share the GPU cap is handed down; it must be set before
        # TensorFlow touches the GPU, which seeding below may do.
        self.device = None
        if os.environ.get(GPU_MEMORY_LIMIT_ENV) or os.environ.get(GPU_MEMORY_GROWTH_ENV):
            self.device = configure_device()
        if deterministic:
            import keras

            problem = exactness.enable_determinism(keras.backend.backend())
            if problem is not None:
                raise SessionConfigError(problem)
        rng.seed_everything(self.seed)
        log = self.workdir.log
        self.log = MemoryLog(log, source="session",
                             header=not (log.exists() and log.stat().st_size > 0))
        # Before anything can fail: a process that ends before its first checkpoint
        # (bad input, a damaged shard) is still known to train inside a session.
        self.log.write(Event.SESSION, seed=self.seed, epoch=self.epoch, step=self.step)
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
        from memfit.data.read.dispatch import dataset

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
            print(f"\nmemfit: {exitcodes.signal_name(signum)} received: finishing the current "
                  f"step, then checkpointing and exiting", file=sys.stderr)
        self.preempted = signum
        self._restart_reason = f"preempted ({exitcodes.signal_name(signum)})"

    def pending_restart(self) -> str | None:
        """Why the session should exit for a restart now, or ``None``."""
        if self._restart_reason is None and self.supervised:
            request = restart_protocol.read_request(self.workdir.path)
            if request is not None:
                self._restart_reason = request.reason
        return self._restart_reason

    def check_baseline(self) -> None:
        """Refuses a ``--max-rss`` below this process's memory now (after start-up and
        model build): every restart would hit it again.

        Raises:
            SessionConfigError: saying what to give instead.
        """
        limit = self.max_rss
        if not limit:
            return
        now = sample().anon_or_total
        if now >= limit:
            raise SessionConfigError(
                f"--max-rss {format_size(limit)} is below this training process's memory "
                f"after start-up and model build ({format_size(now)}): every restart would "
                f"hit it again. Give a --max-rss above {format_size(now)} plus what a "
                f"training step needs (try {format_size(2 * now)}).")

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: object) -> bool:
        self.callback.release()
        if isinstance(error, CheckpointError | SessionConfigError) and self.supervised:
            _refuse(error, self.log)
        if isinstance(error, CorruptShardError) and self.supervised:
            _refuse(error, self.log, exitcodes.DATA_ERROR)
        self.log.close()
        return False


def _refuse(error: Exception, log: MemoryLog | None, code: int = exitcodes.CONFIG) -> None:
    """Under a supervisor, a run that cannot work must not be restarted: say why and exit
    with ``memfit.exitcodes.CONFIG`` (78), or ``DATA_ERROR`` (65) for a damaged shard."""
    text = str(error)
    print(text if text.startswith("memfit: ") else f"memfit: error: {text}", file=sys.stderr)
    if log is not None:
        log.write(Event.STOP, reason="data" if code == exitcodes.DATA_ERROR else "config",
                  message=text)
        log.close()
    raise SystemExit(code) from None


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
        deterministic: make the backend deterministic, for bit-identical resumes: on
            TensorFlow its op determinism (``tf.config.experimental.
            enable_op_determinism``; some ops then refuse to run or run slower), on JAX
            ``XLA_FLAGS=--xla_gpu_deterministic_ops=true`` (the session must then come
            before JAX's first computation; on the CPU XLA is deterministic already).
            See :mod:`memfit.supervise.exactness`.
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
    except (CheckpointError, SessionConfigError) as e:
        if os.environ.get(SUPERVISOR_ENV):
            _refuse(e, None)
        raise
