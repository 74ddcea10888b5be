"""``memfit.MemoryMonitor``: a Keras callback that logs memory and diagnoses its growth."""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from typing import Any

import keras

from memfit import checks, exitcodes
from memfit.memory.allocator import (
    ReleaseProbe,
    malloc_free,
    malloc_in_use,
    malloc_trim,
    require_trim,
)
from memfit.memory.classifier import MIN_VALUES, TOO_SHORT, Verdict, classify, classify_release
from memfit.memory.log import Event, MemoryLog, check_log
from memfit.memory.probe import extended_record
from memfit.sizes import format_size, parse_size
from memfit.supervise.held_lines import hold, say_held
from memfit.workdir import Workdir, default_workdir

__all__ = ["MemoryMonitor"]

_ON_LEAK = ("warn", "stop", "restart")
_DEVICE_LEAK = (
    "The device allocator's bytes in use grew epoch after epoch: the training keeps "
    "references to device arrays (outputs, losses or metrics appended to a list, a "
    "cache that only grows).",
    "Keep no device arrays across steps: keep Python numbers or NumPy copies "
    "(float(loss), np.asarray(x)), and clear what you append to.")
_DEVICE_RETENTION = (
    "The memory the device charges the process grew while the arrays in use did not: "
    "JAX's allocator grows its pool when a step needs more and keeps it. This is "
    "allocator retention on the device, not a leak.",
    "Give the process a cap (memfit share hands JAX XLA_PYTHON_CLIENT_MEM_FRACTION), or "
    "set XLA_PYTHON_CLIENT_ALLOCATOR=platform to allocate and free exactly (slower).")


class MemoryMonitor(keras.callbacks.Callback):
    """Logs memory during training and tells a leak from allocator retention and warm-up.

    Samples this process every ``every_n_batches`` batches and at every epoch end into the
    shared JSON-lines log (``WORKDIR/memory.jsonl``; ``memfit report WORKDIR`` draws it).
    After ``warmup_epochs`` it classifies the epoch-end anonymous RSS (see
    :func:`memfit.memory.classifier.classify`): ``stable``, ``warm-up``, ``leak`` (with
    MiB/epoch and when ``budget`` would be reached) or ``allocator-retention`` (a
    ``malloc_trim(0)`` probe gave most of the growth back); until there are enough epochs
    after the warm-up, ``too-short`` (said at the end of training, never logged as a
    verdict event). When ``fit`` is called in a
    loop and the script frees its data between the calls (``del`` + ``gc.collect()``),
    the monitor also measures what stayed after the collection and what a
    ``malloc_trim(0)`` right after it gives back (:class:`memfit.memory.allocator.
    ReleaseProbe`): memory kept after ``del`` that a trim returns is
    ``allocator-retention`` too, named with both numbers.

    Example:
        >>> import memfit
        >>> monitor = memfit.MemoryMonitor("runs/exp1", budget="8GiB", trim="epoch")
        >>> model.fit(ds, epochs=20, callbacks=[monitor])            # doctest: +SKIP
        >>> print(monitor.verdict)                                   # doctest: +SKIP

    Args:
        workdir: the run's workdir; created if missing (an unwritable one is an error at
            construction, before training starts). Default: ``$MEMFIT_WORKDIR`` (set by
            ``memfit watch``/``run`` for the command they start), else ``memfit-workdir``.
        every_n_batches: also sample every this many batches (0: epoch ends only).
        warmup_epochs: epochs whose growth is expected and excluded from the slope.
        budget: memory the process may use (``"8GiB"``, bytes); a leak gets a projection of
            the epoch at which it is reached.
        trim: ``"epoch"`` calls ``malloc_trim(0)`` at each epoch end (glibc only) and logs
            what it released; ``None`` does not. Either way the monitor trims once after a
            ``gc.collect()`` between two ``fit`` calls, to measure what it gives back.
        on_leak: on a ``leak`` verdict: ``"warn"`` prints it; ``"stop"`` also stops
            training cleanly (``model.stop_training``); ``"restart"``, in a script
            under ``memfit run`` with a :func:`memfit.session`, has the session checkpoint
            everything and exit with ``memfit.exitcodes.RESTART`` (75) to be resumed
            exactly; without a session it exits with 75 all the same, and says that
            the restart will start training over (only a session resumes).
        tensorboard_dir: also write ``memory/rss_anon``, ``memory/rss_file`` (and
            ``memory/gpu_peak`` on a GPU) scalars there.
        python_heap: also log the Python heap from ``tracemalloc`` (started if needed;
            costly).
        report: at the end of training, write ``WORKDIR/report.html`` and ``timeline.png``
            (as ``memfit report WORKDIR`` does).
        verbose: 1 prints the verdict when it changes and at the end of training; 0 silent.
    """

    def __init__(self, workdir: str | os.PathLike | None = None, *,
                 every_n_batches: int = 100, warmup_epochs: int = 1,
                 budget: str | int | None = None, trim: str | None = None,
                 on_leak: str = "warn", tensorboard_dir: str | None = None,
                 python_heap: bool = False, report: bool = False, verbose: int = 1):
        super().__init__()
        if verbose not in (0, 1) or isinstance(verbose, float):
            raise ValueError(f"verbose must be 1 (say the verdict when it changes and at the "
                             f"end of training) or 0 (silent). Received: verbose={verbose!r}")
        every_n_batches = checks.count("every_n_batches", every_n_batches, minimum=0,
                                        example=100, hint="0 samples at epoch ends only.")
        warmup_epochs = checks.count("warmup_epochs", warmup_epochs, minimum=0, example=1)
        if trim not in (None, "epoch"):
            raise ValueError(f"trim must be None or 'epoch'. Received: trim={trim!r}")
        if trim == "epoch":
            require_trim("MemoryMonitor(trim='epoch')")
        checks.choice("on_leak", on_leak, _ON_LEAK)
        if tensorboard_dir is not None:
            import importlib.util

            if importlib.util.find_spec("tensorboard") is None:
                raise ValueError(f"tensorboard_dir needs the tensorboard package: pip install "
                                 f"tensorboard (or memfit[tensorboard]). Received: "
                                 f"tensorboard_dir={tensorboard_dir!r}")
        self.workdir = Workdir(default_workdir() if workdir is None else workdir).create()
        # here, not at the end of fit: a stranger's training ran to its end, then died on
        # "is not a memfit log" in on_train_end, the code after fit never run
        check_log(self.workdir.log)
        self.every_n_batches = every_n_batches
        self.warmup_epochs = warmup_epochs
        self.budget = parse_size(budget, name="budget", memory=True) if budget is not None else None
        self.trim = trim
        self.on_leak = on_leak
        self.python_heap = python_heap
        self.verbose = int(verbose)
        self.report = report
        self.tensorboard_dir = tensorboard_dir
        self.epoch_values: list[int] = []
        self.epoch_free: list[int | None] = []      # glibc's free bytes at each epoch end
        self.epoch_used: list[int | None] = []      # ... and its bytes in use (live)
        self.verdict: Verdict | None = None
        # On a GPU: the device allocator's bytes in use, and what NVML charges the process
        # (in use + what the allocator keeps), at each epoch end.
        self.device_in_use: list[int] = []
        self.device_held: list[int] = []
        self.device_verdict: Verdict | None = None
        self.log: MemoryLog | None = None
        self._writer: Any = None
        self._step = 0
        self._said: str | None = None
        self._release = ReleaseProbe()
        self._releases_logged = 0
        self._log_shown = False
        self._logged: str | None = None        # the headline of the last verdict logged
        self._deferring = False

    @property
    def log_path(self):
        return self.workdir.log

    # -- sampling ------------------------------------------------------------------------
    def _sample(self, event: str, **fields: Any) -> dict:
        record = extended_record(python=self.python_heap)
        assert self.log is not None, "on_train_begin was not called"
        written = self.log.write(event, **record, **fields)
        if self._writer is not None:
            self._scalars(written)
        return written

    def _scalars(self, record: dict) -> None:
        import tensorflow as tf

        with self._writer.as_default(step=self._step):
            for key in ("rss_anon", "rss_file", "rss"):
                if key in record:
                    tf.summary.scalar(f"memory/{key}", record[key])
            for name, info in (record.get("gpu") or {}).items():
                tf.summary.scalar(f"memory/gpu_peak/{name}", info["peak"])
        self._writer.flush()

    # -- what it says ----------------------------------------------------------------------
    def _say(self, text: str) -> None:
        """Prints ``text`` on stderr; inside ``on_epoch_end`` under a progress bar, once
        Keras has printed the epoch's line (:mod:`memfit.supervise.held_lines`)."""
        if self._deferring:
            hold(text)
        else:
            print(text, file=sys.stderr)

    # -- Keras hooks -----------------------------------------------------------------------
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        say_held()

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._release.disarm()
        if self.log is None:
            self.log = MemoryLog(self.workdir.log, source="monitor", argv=sys.argv,
                                 budget=self.budget, warmup_epochs=self.warmup_epochs)
        for r in self._release.releases[self._releases_logged:]:
            self.log.write(Event.COLLECT, **r.to_record())
        if len(self._release.releases) > self._releases_logged:
            self._releases_logged = len(self._release.releases)
            self._update(self._judge(), epoch=None)
        if self.python_heap:
            import tracemalloc

            if not tracemalloc.is_tracing():
                tracemalloc.start()
        if self.tensorboard_dir and self._writer is None:
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(self.tensorboard_dir)
        self._sample("train_begin")

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._step += 1
        if self.every_n_batches and (batch + 1) % self.every_n_batches == 0:
            self._sample("batch", step=self._step, batch=batch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        # Keras's progress bar (verbose 1 or 2) prints the epoch's line after this.
        self._deferring = bool((getattr(self, "params", None) or {}).get("verbose"))
        try:
            self._epoch_end(epoch)
        finally:
            self._deferring = False

    def _epoch_end(self, epoch: int) -> None:
        if self.log is None:
            self.on_train_begin()
        if self.trim == "epoch":
            released = malloc_trim()
            self.log.write(Event.TRIM, released=released, epoch=epoch)
        record = self._sample("epoch_end", epoch=epoch)
        self.epoch_values.append(record.get("rss_anon", record["rss"]))
        self.epoch_free.append(malloc_free())
        self.epoch_used.append(malloc_in_use())
        self._device_epoch(record, epoch)
        if len(self.epoch_values) - self.warmup_epochs < MIN_VALUES and not \
                self._release.releases:
            return
        previous = self.verdict.kind if self.verdict else None
        self._update(self._judge(trim_probe=None if self.trim == "epoch" else malloc_trim),
                     epoch=epoch)
        if self.verdict.kind == "leak":
            self._act(epoch, first=previous != "leak")

    def _device_epoch(self, record: dict, epoch: int) -> None:
        """The device's verdict. The allocator's bytes in use are the buffers the
        training references: growth there is a ``leak`` (or warm-up), judged as the host's
        anonymous RSS is. What NVML charges the process adds what the allocator keeps
        unused; where that grows while the bytes in use do not, it is
        ``allocator-retention`` on the device (JAX's pool grows in doublings and never
        shrinks), not a leak."""
        gpu = record.get("gpu")
        if not gpu:
            return
        self.device_in_use.append(sum(int(v["current"]) for v in gpu.values()))
        if record.get("nvml") is not None:
            self.device_held.append(int(record["nvml"]))
        if len(self.device_in_use) - self.warmup_epochs < MIN_VALUES:
            return
        verdict = classify(self.device_in_use, warmup_epochs=self.warmup_epochs)
        text = dict(verdict.to_record())
        if verdict.kind == "leak":
            text.update(headline=f"leak: the allocator's bytes in use {verdict.headline[6:]}",
                        explanation=_DEVICE_LEAK[0], fix=_DEVICE_LEAK[1])
        elif len(self.device_held) == len(self.device_in_use):
            held = classify(self.device_held, warmup_epochs=self.warmup_epochs)
            if held.kind in ("leak", "warm-up"):
                verdict = dataclasses.replace(held, kind="allocator-retention")
                text = dict(verdict.to_record(), headline=(
                    f"allocator-retention: NVML's memory of the process "
                    f"{format_size(held.growth, signed=True)} after warm-up while the "
                    f"allocator's bytes in use stayed within "
                    f"{format_size(max(self.device_in_use) - min(self.device_in_use))}"),
                    explanation=_DEVICE_RETENTION[0], fix=_DEVICE_RETENTION[1])
        previous = self.device_verdict.kind if self.device_verdict else None
        self.device_verdict = verdict
        if verdict.kind != previous:
            assert self.log is not None
            self.log.write(Event.VERDICT, epoch=epoch, scope="device", **text)
            if self.verbose:
                self._say(f"memfit: device memory: {text['headline']}")

    def _judge(self, trim_probe: Any = None) -> Verdict:
        """The epoch ends' verdict; memory kept after del + gc.collect() that a trim gave
        back makes it ``allocator-retention`` unless the epochs show a leak."""
        verdict = None
        if len(self.epoch_values) - self.warmup_epochs >= MIN_VALUES:
            # After malloc_trim, glibc's free bytes count pages it gave back (not resident):
            # with trim="epoch" they can grow while RSS does not, so they tell nothing.
            free = None if None in self.epoch_free or self.trim == "epoch" else self.epoch_free
            used = None if None in self.epoch_used else self.epoch_used
            verdict = classify(self.epoch_values, warmup_epochs=self.warmup_epochs,
                               budget=self.budget, trim_probe=trim_probe, held=free,
                               in_use=used)
        kept = classify_release(self._release.releases)
        if kept is not None and (verdict is None or verdict.kind != "leak"):
            return kept
        if verdict is None:
            verdict = classify(self.epoch_values, warmup_epochs=self.warmup_epochs,
                               budget=self.budget)
        return verdict

    def _update(self, verdict: Verdict, epoch: int | None) -> None:
        """Keeps ``verdict``; logs it, and says it, when its kind changes."""
        previous = self.verdict.kind if self.verdict else None
        self.verdict = verdict
        if verdict.kind != previous and verdict.kind != TOO_SHORT:
            assert self.log is not None
            self.log.write(Event.VERDICT, epoch=epoch, **verdict.to_record())
            self._logged = verdict.headline
            if self.verbose:
                self._say(f"memfit: {verdict.headline}")
                if verdict.kind == "allocator-retention":
                    self._say(f"  {verdict.explanation}\n  Fix: {verdict.fix}")
                self._said = verdict.kind

    def _act(self, epoch: int, first: bool) -> None:
        if self.on_leak == "warn":
            if self.verbose and first:          # once, not at every epoch of the leak
                warnings.warn(f"memfit: memory is leaking: {self.verdict.headline}. "
                              f"{self.verdict.fix}", stacklevel=2)
            return
        if self.on_leak == "stop":
            self.log.write(Event.STOP, epoch=epoch, reason="leak")
            if self.model is not None:
                self.model.stop_training = True
            if self.verbose:            # a stranger's training just ended, with no word why
                self._say(f"memfit: stopping training after epoch {epoch + 1}: memory is "
                          f"leaking (on_leak='stop'). {self.verdict.fix}")
            return
        from memfit.supervise.session import current

        session = current()
        if session is not None and session.supervised:
            # The session checkpoints everything (optimizer, data position, RNG) after
            # this epoch and exits with RESTART for the supervisor.
            self.log.write(Event.REQUEST, epoch=epoch, reason="leak")
            session.request_restart("leak")
            return
        self.log.write(Event.EXIT, code=exitcodes.RESTART, epoch=epoch, reason="leak")
        self.log.close()
        say_held()
        print(f"memfit: leak found ({format_size(self.verdict.slope)}/epoch); exiting with "
              f"code {exitcodes.RESTART} for a restart. This script has no memfit.session, "
              f"so a restart starts training over: add one to resume where it stopped",
              file=sys.stderr)
        sys.exit(exitcodes.RESTART)

    def on_train_end(self, logs: dict | None = None) -> None:
        say_held()
        if self.log is None:
            return
        self._sample("train_end")
        if self.verdict is None:
            self.verdict = classify(self.epoch_values, warmup_epochs=self.warmup_epochs,
                                    budget=self.budget)
        if self.verdict.kind != TOO_SHORT and self._logged != self.verdict.headline:
            # the verdict at the end, with its figures ("over 20 epochs"): the report reads
            # the log's last verdict, and a stranger's said "over 5 epochs" after 20
            self.log.write(Event.VERDICT, epoch=len(self.epoch_values) - 1,
                           **self.verdict.to_record())
            self._logged = self.verdict.headline
        if self.verbose:
            # fit() in a loop ends training many times: say each verdict once, and the
            # first training's verdict at its end with its final figures.
            said = self._said == self.verdict.kind and self._log_shown
            if not said:
                print(("" if said else f"memfit: {self.verdict.headline}\n")
                      + f"  memory log: {self.workdir.log}", file=sys.stderr)
                self._said = self.verdict.kind
                self._log_shown = True
        self.log.close()
        self.log = None
        self._release.arm()         # what a del + gc.collect() before the next fit leaves
        if self.report:
            from memfit.report import write_report

            written = write_report(self.workdir.path)
            if self.verbose:
                print(f"  report: {written.html}", file=sys.stderr)
