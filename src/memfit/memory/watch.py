"""Watch any command's memory from outside: ``memfit watch -- python train.py``.

:func:`watch` runs the command unchanged (same stdin, stdout, stderr, environment),
samples its whole process tree every ``interval`` seconds with the one probe
(:func:`memfit.memory.sample` with ``tree=True``: data-loader workers and other children
count), writes every sample to the shared log ``WORKDIR/memory.jsonl``, shows a live
status line on a terminal, forwards SIGINT/SIGTERM to the command, and at exit writes
the exit code and a verdict (:func:`memfit.memory.classify`) to the log.

The verdict uses the ``epoch_end`` events of the same log when the command wrote at
least 5 (a training script with ``memfit.MemoryMonitor(WORKDIR)`` does), and then gives
rates per epoch. Otherwise it judges the run's *steady time*: what follows the start-up
and warm-up (until file-backed RSS reaches its level: libraries are loaded and the
first steps have run their code once) and precedes the last 2 s (the exiting interpreter
frees its memory). A run with less than :data:`MIN_STEADY` seconds of it is
``too-short``, with how long it had: a busy machine slows the start-up and warm-up, and
judging what is left of them would call them a leak. A longer one is cut into 10 equal
time slices, the median anonymous RSS of each slice serves as one value, and rates are
per minute; a leak must raise the slices' floors (their least anonymous RSS) as well as
their medians, so that a sawtooth whose high phase lasts longer late in the run (a busy
machine) is not called one, and grow by more than :data:`SWING_SHARE` of the *swing* (the
median over the slices of the spread between a slice's 10th and 90th percentile): a
process that builds and frees hundreds of MiB every epoch wanders by a fraction of that
between slices (glibc's arenas taking the freed buffers, the phase of the sawtooth), which
is not a leak. The threshold does not grow with the run, so a slow leak shows in a longer
watch. From outside
memfit sees the shape only: memory that grows without bound (``leak``) or memory that
rose to a *level* and held it. It cannot trim the command's memory, so it cannot tell a
level of data held in RAM from freed memory the allocator keeps (after ``del`` +
``gc.collect()``), nor rule out that a leak is retention: it says so, and points to
``memfit doctor`` and ``MemoryMonitor``, which probe with ``malloc_trim`` inside the
process.

Example:
    >>> import sys, tempfile
    >>> result = watch([sys.executable, "-c", "b = b'x' * 2**26"],
    ...                workdir=tempfile.mkdtemp())                   # doctest: +SKIP
    >>> result.exit_code, result.peak.rss_anon > 2**26                # doctest: +SKIP
    (0, True)
    >>> print(result)                                                 # doctest: +SKIP
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from memfit import checks
from memfit.env import WORKDIR_ENV
from memfit.memory.classifier import (
    MIN_GROWTH,
    MIN_VALUES,
    TOO_SHORT,
    Verdict,
    classify,
    explained,
    theil_sen,
    too_short,
)
from memfit.memory.log import Event, MemoryLog, check_log, read_log
from memfit.memory.probe import Sample
from memfit.memory.process import (
    check_command,
    exit_code,
    forward_signals,
    start,
    ticks,
)
from memfit.memory.sampler import TreeSampler
from memfit.sizes import format_count, format_size
from memfit.workdir import Workdir

__all__ = ["watch", "judge", "OutsideVerdict", "WatchResult",
           "SLICES", "MIN_STEADY", "SWING_SHARE", "OUTSIDE_NOTE", "SHORT_FIX", "LEVEL_FIX"]

SLICES = 10                  # time slices standing in for epochs when the log has none
MIN_STEADY = 5.0             # seconds of steady time the outside judge needs
#: A leak seen from outside grows by more than this share of the swing (module doc).
SWING_SHARE = 0.5
MIN_EPOCH_EVENTS = MIN_VALUES + 1   # epoch_end events to classify instead of time slices
_STATUS_WINDOW = 30.0        # seconds of recent samples behind the live slope
_STATUS_MAX_SAMPLES = 60     # ... at most this many (Theil-Sen is quadratic)
OUTSIDE_NOTE = ("Retention cannot be ruled out from outside: run with "
                "MemoryMonitor(trim='epoch') in the script to tell a leak from allocator "
                "retention.")
LEVEL_FIX = ("Nothing grows without bound. If this level is more than you expect, "
             "`memfit doctor -- COMMAND` measures what holds it: data held in RAM, or freed "
             "memory the allocator keeps after `del` + `gc.collect()`. Seen from outside "
             "the two look the same; only a malloc_trim probe inside the process (memfit "
             "doctor, or memfit.MemoryMonitor in the script) tells them apart.")
SHORT_FIX = (f"Watch a longer run: from outside, memfit needs at least {MIN_STEADY:.0f} s of "
             f"steady time after the start-up and warm-up (file-backed RSS at its level), "
             f"with samples in at least {MIN_VALUES + 1} of its {SLICES} time slices (lower "
             f"--interval for a short run). Or write epoch_end events with "
             f"memfit.MemoryMonitor(WORKDIR) in the script: epochs are judged instead.")


@dataclasses.dataclass(frozen=True)
class WatchResult:
    """What :func:`watch` saw of one run of a command.

    Attributes:
        exit_code: the command's exit code; a command killed by signal N gives 128 + N,
            as a shell reports it.
        samples: how many samples of the process tree were taken (all are in the log).
        peak: field by field, the largest value sampled (``rss``, ``rss_anon``,
            ``rss_file``, ``rss_shmem``, ``processes``; ``t`` is when anonymous RSS
            peaked); ``None`` if the command ended before the first sample.
        final: the last sample before the command ended, or ``None``.
        growth: anonymous (else total) RSS of the last sample minus the first, in bytes.
        verdict: the classifier's verdict (see :func:`memfit.memory.classify`).
        duration: seconds from start to exit.
        log_path: the log written (``WORKDIR/memory.jsonl``).
        command: the command run.
        basis: what the verdict was computed from: ``"epochs"`` (the log's ``epoch_end``
            events) or ``"time slices"`` (medians of 10 equal slices of the run's steady
            time).
        level: the anonymous RSS held at the end (bytes), or ``None``.
        steady: seconds of steady time judged (time slices only; ``None`` otherwise).
    """

    exit_code: int
    samples: int
    peak: Sample | None
    final: Sample | None
    growth: int
    verdict: Verdict
    duration: float
    log_path: Path
    command: tuple[str, ...] = ()
    basis: str = "time slices"
    level: int | None = None
    steady: float | None = None

    @property
    def headline(self) -> str:
        """The verdict in one line: rates per epoch (epochs) or per minute (time slices)."""
        return _headline(self.verdict, self.basis, self.steady, self.level)

    @property
    def fix(self) -> str:
        """What to do: the verdict's fix (for a run too short to judge, how to watch it)."""
        return _fix(self.verdict, self.basis, self.command)

    @property
    def note(self) -> str | None:
        """A caveat on the verdict, or ``None``: a leak seen from outside may be retention."""
        return OUTSIDE_NOTE if self.verdict.kind == "leak" else None

    def __str__(self) -> str:
        cmd = shlex.join(self.command) if self.command else "the command"
        lines = [f"memfit watch: {cmd!s} exited with code {self.exit_code} after "
                 f"{self.duration:.1f} s ({format_count(self.samples, 'sample')})"]
        for label, s in (("peak", self.peak), ("final", self.final)):
            if s is not None:
                lines.append(f"  {label:<7} anon {format_size(s.rss_anon):>10}   file "
                             f"{format_size(s.rss_file):>10}   total {format_size(s.rss):>10}"
                             f"   ({format_count(s.processes, 'process', 'processes')})")
        lines.append(f"  growth  {format_size(self.growth, signed=True)} anonymous, first "
                     f"sample to last")
        if self.basis == "epochs":
            basis = f"the {self.verdict.epochs} epoch_end events of the log"
        elif self.steady is not None:
            # as precise as the headline's "had 2.5 s" (a stranger read "over 2 s" beside it)
            steady = f"{self.steady:.1f}" if self.steady < 10 else f"{self.steady:.0f}"
            basis = (f"the process tree's memory over {steady} s of steady time, "
                     f"seen from outside")
        else:
            basis = (f"the process tree's memory over {self.duration:.0f} s, seen from "
                     f"outside")
        lines.append(f"  verdict {self.headline} (from {basis})")
        lines.append(f"  Fix: {self.fix}")
        if self.note:
            lines.append(f"  Note: {self.note}")
        lines.append(f"  log: {self.log_path}")
        return "\n".join(lines)


def _headline(verdict: Verdict, basis: str, steady: float | None,
              level: int | None) -> str:
    """The verdict in words: per real epoch from epoch_end events, else per minute of
    the ``steady`` seconds judged; no rate at all beside a level that holds."""
    if basis == "epochs" or verdict.kind in (TOO_SHORT, "allocator-retention"):
        return verdict.headline
    width = (steady or 0.0) / SLICES
    if verdict.kind == "leak":
        rate = verdict.slope / width * 60 if width > 0 else 0.0
        return (f"leak: anonymous RSS grows without bound, {format_size(rate, signed=True)}"
                f"/min ({format_size(verdict.growth, signed=True)} after the warm-up), "
                f"still growing at the end")
    held = f" at {format_size(level)}" if level is not None else ""
    return (f"level: anonymous RSS rose to a level{held} and held it; not growing (no "
            f"trend beyond the {format_size(verdict.noise)} noise threshold)"
            if verdict.kind == "warm-up" else
            f"level: anonymous RSS held{held}; not growing (no trend beyond the "
            f"{format_size(verdict.noise)} noise threshold)")


def _fix(verdict: Verdict, basis: str, command: Sequence[str] = ()) -> str:
    if verdict.kind == TOO_SHORT and basis == "time slices":
        return SHORT_FIX
    if basis == "time slices" and verdict.kind in ("stable", "warm-up"):
        return LEVEL_FIX.replace("COMMAND", shlex.join(command) if command else "COMMAND")
    return verdict.fix


def _slices(times: Sequence[float], values: Sequence[float],
            slices: int = SLICES) -> list[list[float]]:
    """``values`` in each of ``slices`` equal time slices that has samples, in order."""
    if not times:
        return []
    start, width = times[0], (times[-1] - times[0]) / slices
    buckets: list[list[float]] = [[] for _ in range(slices)]
    for t, v in zip(times, values, strict=True):
        index = slices - 1 if width <= 0 else min(int((t - start) / width), slices - 1)
        buckets[index].append(v)
    return [b for b in buckets if b]


SETTLED_FILE_SHARE = 0.98    # warm-up ends when file-backed RSS is within 2 % ...
SETTLED_FILE_SLACK = 4 * 2**20   # ... (and 4 MiB) of its level
TEARDOWN = 2.0               # seconds before exit left out: the interpreter frees its memory


def _swing(buckets: Sequence[Sequence[float]]) -> float:
    """The median over ``buckets`` (with two values or more) of the spread between their
    10th and 90th percentiles: how far the memory swings within a time slice."""
    spreads = []
    for b in buckets:
        if len(b) >= 2:
            deciles = statistics.quantiles(b, n=10)
            spreads.append(deciles[-1] - deciles[0])
    return statistics.median(spreads) if spreads else 0.0


def _before_teardown(samples: Sequence[Sample]) -> int:
    """End index (exclusive) of the samples before the last :data:`TEARDOWN` seconds: at
    exit the interpreter frees what it held, which is not the run's level."""
    if not samples:
        return 0
    return next((i for i, s in enumerate(samples) if s.t > samples[-1].t - TEARDOWN),
                len(samples))


def _settled(samples: Sequence[Sample], end: int) -> int:
    """Index of the first sample after the start-up and warm-up, among ``samples[:end]``.

    Imports map their libraries, and the first steps of a training fault in the code of
    every kernel they run once, so file-backed RSS climbs until both are over (TensorFlow:
    ~0.4 GiB, the last few percent during the first epoch), and anonymous RSS climbs with
    it (traces, caches, pools), which from outside would look like growth. Steady time
    starts when file-backed RSS is within :data:`SETTLED_FILE_SHARE` (and
    :data:`SETTLED_FILE_SLACK`) of its level. On a busy machine the start-up and warm-up
    last longer, and the steady time left is shorter, not misjudged."""
    if end <= 0:
        return 0
    top = max(s.rss_file for s in samples[:end])
    floor = top - max((1 - SETTLED_FILE_SHARE) * top, SETTLED_FILE_SLACK)
    return next(i for i, s in enumerate(samples[:end]) if s.rss_file >= floor)


def _first_epoch_end(log_path: Path, since: float) -> float | None:
    """When the run's first epoch ended (an ``epoch_end``, or a session's checkpoint at an
    epoch's start), from the events written since ``since``; ``None`` before any."""
    for record in read_log(log_path):
        if record["t"] < since:
            continue
        event = record["event"]
        if event == Event.EPOCH_END or (event == Event.CHECKPOINT and not record.get("step")
                                        and record.get("epoch")):
            return float(record["t"])
    return None


def _epoch_values(log_path: Path, since: float) -> list[float]:
    """Anonymous (else total) RSS of the ``epoch_end`` events written since ``since``."""
    values = []
    for record in read_log(log_path):
        if record["event"] == Event.EPOCH_END and record["t"] >= since:
            value = record.get("rss_anon", record.get("rss"))
            if isinstance(value, int | float):
                values.append(float(value))
    return values


class _StatusLine:
    """The live one-line status, redrawn in place with ``\\r``; silent unless a terminal."""

    def __init__(self, stream: TextIO, start: float):
        self.stream = stream
        self.start = start
        self.recent: collections.deque[Sample] = collections.deque(maxlen=_STATUS_MAX_SAMPLES)
        try:
            self.enabled = bool(stream.isatty())
        except (AttributeError, ValueError):
            self.enabled = False
        self.shown = False

    def update(self, now: Sample, peak: Sample) -> None:
        """Redraws the line for a new sample; the slope is over the last
        :data:`_STATUS_WINDOW` seconds."""
        self.recent.append(now)
        if not self.enabled:
            return
        recent = [x for x in self.recent if x.t >= now.t - _STATUS_WINDOW]
        slope = "slope      n/a"
        if len(recent) >= 3:
            step = (recent[-1].t - recent[0].t) / (len(recent) - 1)
            if step > 0:
                per_min = theil_sen([s.anon_or_total for s in recent]) / step * 60
                slope = f"slope {per_min / 2**20:+8.1f} MiB/min"
        line = (f"memfit watch: anon {format_size(now.anon_or_total):>10}   peak "
                f"{format_size(peak.anon_or_total):>10}   {slope}   "
                f"{now.processes} proc   {now.t - self.start:6.0f} s")
        self._write(f"\r{line}\x1b[K")
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self._write("\r\x1b[K")
            self.shown = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):       # a closed or broken terminal: stop drawing
            self.enabled = False


def watch(command: Sequence[str], *, interval: float = 0.5,
          workdir: str | os.PathLike = "memfit-watch",
          status: TextIO | None = None, env: Mapping[str, str] | None = None) -> WatchResult:
    """Runs a command, sampling the memory of its whole process tree from outside.

    The command runs unchanged, with this process's stdin, stdout, stderr and
    environment. Every ``interval`` seconds its process tree is sampled and the sample is
    appended to ``WORKDIR/memory.jsonl`` (a ``start`` event with the command, then
    ``sample`` events with the command's pid; ``memfit report WORKDIR`` draws them).
    SIGINT and SIGTERM sent to this process are forwarded to the command (when called
    from the main thread), and the watch goes on until it exits. At exit an ``exit``
    event (``code``) and a ``verdict`` event are written.

    Example:
        >>> result = memfit.memory.watch.watch(["python", "train.py"],
        ...                                     workdir="runs/exp1")   # doctest: +SKIP
        >>> print(result)                                               # doctest: +SKIP
        memfit watch: python train.py exited with code 0 after 312.4 s (625 samples)
          peak    anon    3.1 GiB   file  412.0 MiB   total    3.5 GiB   (5 processes)
          ...

    Args:
        command: the program and its arguments, e.g. ``["python", "train.py"]``.
        interval: seconds between samples (a positive number).
        workdir: the run's workdir; created if missing. A log already there is appended
            to (a new ``start`` event begins this run).
        status: where the live status line goes (anonymous RSS, peak, slope in MiB/min
            over the last 30 s), redrawn in place; only drawn when it is a terminal.
            ``None``: ``sys.stderr``.
        env: more environment variables for the command (on top of this process's).

    Returns:
        A :class:`WatchResult`; ``print`` it for peak, final, growth and the verdict.

    Raises:
        ValueError: for an empty command or a bad ``interval``, quoting the value.
        MemfitError: if the workdir cannot be written or holds a file that is not a
            memfit log (before the command starts).
        CommandStartError: if the command does not exist (``exit_code`` 127) or cannot
            be executed (126); nothing is written to the log then.
    """
    command = check_command(command)
    interval = checks.seconds("interval", interval)
    wd = _workdir(workdir)
    since = time.time()
    target = _Target()
    # SIGINT/SIGTERM are forwarded from before the command starts: one that came while
    # it started reaches it too, never kills memfit and leaves it running unwatched.
    with forward_signals(current=target) as received:
        proc = target.started(start(command, {**(env or {}), WORKDIR_ENV: str(wd.path)}),
                              received)
        try:
            with MemoryLog(wd.log, source="watch", command=command,
                           interval=interval) as log:
                started = time.time()
                sampler = TreeSampler(proc.pid, log=log)
                _sample_until_exit(proc, sampler, interval, _StatusLine(
                    sys.stderr if status is None else status, started))
                code = _log_exit(log, proc, started)
                duration = time.time() - started
                judged = judge(sampler.samples.items, wd.log, since, duration, command)
                # The verdict is about the command: log it under the command's pid. (The
                # explanation of a leak says that no trim probe could run from outside.)
                log.write(Event.VERDICT, pid=proc.pid, source="watch", **judged.to_record())
        except BaseException:
            # Like subprocess.run, never leave the command running unattended.
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            raise
    samples = sampler.samples
    final, first = samples.last, samples.items[0] if samples.items else None
    growth = final.anon_or_total - first.anon_or_total if final and first else 0
    return WatchResult(exit_code=code, samples=samples.seen, peak=sampler.peak, final=final,
                       growth=growth, verdict=judged.verdict, duration=duration,
                       log_path=wd.log, command=tuple(command), basis=judged.basis,
                       level=judged.level, steady=judged.steady)


def _workdir(workdir: str | os.PathLike) -> Workdir:
    """The workdir, created; a log already there must be a memfit log (checked before the
    command starts, so that nothing is appended to someone else's file)."""
    wd = Workdir(workdir).create()
    check_log(wd.log)                   # LogError (a MemfitError) if it is not a memfit log
    return wd


class _Target:
    """The process :func:`forward_signals` forwards to: none until the command has
    started; the signals that came before are sent to it once it has (each once)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.missed = 0             # signals the handler had no process for

    def __call__(self) -> subprocess.Popen | None:
        # Called by the handler once per signal, after it recorded the signal.
        if self.proc is None:
            self.missed += 1
        return self.proc

    def started(self, proc: subprocess.Popen, received: list[int]) -> subprocess.Popen:
        """Forwards to ``proc`` from now on; sends it the signals that came before."""
        self.proc = proc
        for signum in received[:self.missed]:       # a later one the handler forwards
            if proc.poll() is None:
                proc.send_signal(signum)
        return proc


def _sample_until_exit(proc: subprocess.Popen, sampler: TreeSampler, interval: float,
                       line: _StatusLine) -> None:
    """Samples the command's tree every ``interval`` seconds until it exits, drawing the
    status line."""
    try:
        for _ in ticks(proc, interval):
            s = sampler.take()
            if s is not None:
                line.update(s, sampler.peak)
    finally:
        line.clear()


def _log_exit(log: MemoryLog, proc: subprocess.Popen, started: float) -> int:
    """Writes the command's ``exit`` event; returns its exit code as a shell reports it."""
    code = exit_code(proc.returncode)
    fields = {"code": code, "duration": time.time() - started}
    if proc.returncode < 0:
        fields["signal"] = -proc.returncode
    log.write(Event.EXIT, pid=proc.pid, **fields)
    return code


@dataclasses.dataclass(frozen=True)
class OutsideVerdict:
    """A verdict on a process tree's memory, seen from outside (what :func:`watch` and
    ``memfit run`` print).

    Attributes:
        verdict: the classifier's verdict.
        basis: ``"epochs"`` (the log's ``epoch_end`` events) or ``"time slices"``.
        level: the anonymous RSS it held at the end (bytes), or ``None``.
        headline: the verdict in one line (rates per epoch, or per minute).
        fix: what to do.
        note: a caveat (a leak seen from outside may be retention), or ``None``.
        steady: seconds of steady time judged (time slices only; ``None`` otherwise).
    """

    verdict: Verdict
    basis: str
    level: int | None
    headline: str
    fix: str
    note: str | None
    steady: float | None = None

    @property
    def explanation(self) -> str:
        """The verdict's paragraph, in the words of what was judged: epoch ends, or the
        steady time (a stranger's report read "at the end of each epoch" with 0 epochs)."""
        return explained(self.verdict, "epochs" if self.basis == "epochs" else "time")

    def to_record(self) -> dict:
        """Fields for a ``verdict`` event of the log."""
        return {**self.verdict.to_record(), "explanation": self.explanation,
                "basis": self.basis, "fix": self.fix,
                "headline": self.headline, "steady": self.steady}


def judge(samples: Sequence[Sample], log_path: str | os.PathLike, since: float,
          duration: float, command: Sequence[str] = ()) -> OutsideVerdict:
    """Judges a run from outside: from the log's ``epoch_end`` events written since
    ``since`` when there are enough, else from the samples of its steady time (start-up,
    warm-up and teardown left out) in time slices; ``too-short`` when it has less than
    :data:`MIN_STEADY` seconds of steady time, with how much it had.

    Example:
        >>> v = judge(samples, "runs/exp1/memory.jsonl", since=t0,
        ...           duration=120.0)                                    # doctest: +SKIP
        >>> v.headline                                                   # doctest: +SKIP
        'level: anonymous RSS held at 1.2 GiB; not growing ...'

    Args:
        samples: the process tree's samples, in time order.
        log_path: the run's log (read for ``epoch_end`` events).
        since: Unix time the run started.
        duration: seconds the run lasted (unused: the steady time comes from the
            samples' own times; kept for callers).
        command: the command, quoted in the fix.
    """
    epochs = _epoch_values(Path(log_path), since)
    steady = None
    if len(epochs) >= MIN_EPOCH_EVENTS:
        basis, verdict = "epochs", classify(epochs, warmup_epochs=1)
        level = int(epochs[-1])
    else:
        basis, (verdict, level, steady) = "time slices", _judge_steady(
            samples, _first_epoch_end(Path(log_path), since))
    return OutsideVerdict(verdict=verdict, basis=basis, level=level,
                          headline=_headline(verdict, basis, steady, level),
                          fix=_fix(verdict, basis, command),
                          note=OUTSIDE_NOTE if verdict.kind == "leak" else None,
                          steady=steady)


def _judge_steady(samples: Sequence[Sample],
                  warmed: float | None = None) -> tuple[Verdict, int | None, float]:
    """The verdict on the steady time of a run seen from outside, the level held at its
    end, and the seconds of steady time: ``too-short`` when there is less than
    :data:`MIN_STEADY` seconds of it, or samples in fewer than ``MIN_VALUES + 1`` of its
    time slices. ``warmed``: when its first epoch ended, if the log says; the steady time
    starts no earlier (the first epoch is the warm-up, as when judged by epochs: JAX's
    file-backed memory settles before its first step's compile, and a stranger's run,
    flat for its last 5 s, was called a leak of +548 MiB/min from that compile)."""
    end = _before_teardown(samples)
    first = _settled(samples, end)
    if warmed is not None:
        first = max(first, next((i for i, s in enumerate(samples) if s.t >= warmed),
                                len(samples)))
    steady = samples[first:end]
    had = steady[-1].t - steady[0].t if steady else 0.0
    growth = steady[-1].anon_or_total - steady[0].anon_or_total if steady else 0
    if had < MIN_STEADY:
        return too_short(MIN_STEADY, had, "s", growth=growth, epochs=len(steady)), None, had
    buckets = _slices([s.t for s in steady], [float(s.anon_or_total) for s in steady])
    medians = [statistics.median(b) for b in buckets]
    # data_in_ram (tests/story) swings 260-280 MiB in a slice and its medians wander by up
    # to 0.21 of that between slices with nothing growing; the story's leak grows by 8-10
    # swings (2026-12-07, 6 and 3 runs beside a CPU hog).
    floor = max(MIN_GROWTH, SWING_SHARE * _swing(buckets))
    verdict = classify(medians, warmup_epochs=1, min_growth=floor)
    if verdict.kind == "leak":
        # A leak raises the floor the process returns to between steps, not only the
        # medians: a level with a sawtooth (data built and freed each epoch) moves its
        # slices' medians where the high phase takes a larger share of the later slices
        # (a busy machine slowing the steps that hold the data), while its floor stays.
        # CI saw the seed story called "leak, +765 MiB/min" that way.
        floors = classify([min(b) for b in buckets], warmup_epochs=1, min_growth=floor)
        if floors.kind != "leak":
            verdict = floors
    if verdict.kind == TOO_SHORT:
        return too_short(MIN_VALUES + 1, len(medians), "time slices", growth=growth,
                         epochs=len(medians)), None, had
    return verdict, int(medians[-1]), had
