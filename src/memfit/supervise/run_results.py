"""What ``memfit run`` did: one :class:`ChildRun` per process, and the :class:`RunResult`.

``print`` a :class:`RunResult` for the summary table: each process, the checkpoints it
started from and ended at, its peak, why it ended; the time lost to restarts; the last
process's memory judged from outside.

Example:
    >>> child = ChildRun(pid=42, exit_code=75, cause=Cause.RESTART, reason="every 1 epoch",
    ...                  started=0.0, ended=9.5, peak=None, resumed_at=(0, 0),
    ...                  ended_at=(1, 0))
    >>> child.progressed
    True
    >>> RunResult(exit_code=75, finished=False, stop_reason="interrupted",
    ...           children=(child, child), epoch=1, duration=20.0, lost=1.0,
    ...           log_path=Path("memory.jsonl")).restarts
    {'every 1 epoch': 1}
"""

from __future__ import annotations

import collections
import dataclasses
import shlex
from enum import StrEnum
from pathlib import Path

from memfit.memory.probe import Sample
from memfit.memory.watch import OutsideVerdict
from memfit.sizes import format_count, format_size

__all__ = ["Cause", "ChildRun", "RunResult"]


class Cause(StrEnum):
    """Why one process of a supervised run ended (:attr:`ChildRun.cause`; the ``cause``
    of its ``exit`` event in the log)."""

    FINISHED = "finished"                   # exit 0
    RESTART = "restart"                     # exit 75, or checkpointed after a SIGTERM to it
    CONFIG = "config"                       # exit 78: a configuration error
    CHECKPOINT_FAILED = "checkpoint-failed"     # exit 74
    DATA = "data"                           # exit 65: a damaged shard
    CRASH = "crash"                         # another exit code
    KILLED = "killed"                       # a signal memfit did not send (the OOM killer?)
    HARD_RSS = "hard-rss"                   # memfit run killed it at --hard-rss
    UNRESPONSIVE = "unresponsive"           # no checkpoint within --grace of a request
    INTERRUPTED = "interrupted"             # memfit run itself got SIGINT/SIGTERM


@dataclasses.dataclass(frozen=True)
class ChildRun:
    """One process of a supervised run.

    Attributes:
        pid: its process id.
        exit_code: as a shell reports it (128 + N when killed by signal N).
        cause: why it ended: ``"finished"``, ``"restart"`` (it exited with 75, or
            checkpointed and exited after a SIGTERM sent to it alone), ``"config"`` (78),
            ``"checkpoint-failed"`` (74), ``"data"`` (65: a damaged shard), ``"crash"``
            (another code), ``"killed"`` (a signal not sent by memfit, e.g. the OOM
            killer), ``"hard-rss"``, ``"unresponsive"``, ``"interrupted"`` (memfit run
            itself got SIGINT/SIGTERM).
        reason: the details: the restart's reason (``"every 1 epoch"``, ``"max-rss"``),
            the signal's name, the exit code.
        started, ended: Unix times.
        peak: the largest sample of its process tree (``None`` if it ended first).
        resumed_at, ended_at: the ``(epoch, step)`` of the checkpoint it started from and
            of the newest checkpoint when it ended.
        start: ``"warm"`` (forked from the warm parent) or ``"cold"`` (a new interpreter).
        exit_known: ``False`` when its exit status was lost with a warm parent that was
            killed (``exit_code`` is then 128 + SIGKILL, a stand-in, shown as ``?``).
        oom_killed: for a process killed by SIGKILL, whether the kernel counted an OOM
            kill while it ran (:func:`memfit.memory.probe.oom_kills`); ``None`` where
            the kernel does not say, or for another end.
    """

    pid: int
    exit_code: int
    cause: Cause
    reason: str
    started: float
    ended: float
    peak: Sample | None
    resumed_at: tuple[int, int]
    ended_at: tuple[int, int]
    start: str = "cold"
    exit_known: bool = True
    oom_killed: bool | None = None

    @property
    def progressed(self) -> bool:
        return self.ended_at > self.resumed_at


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What :func:`run` did.

    Attributes:
        exit_code: 0 when the training finished; else the last process's exit code.
        finished: whether the command ended with exit code 0.
        stop_reason: why the run stopped without finishing, or ``None``.
        children: every process started, in order.
        epoch: epochs completed (from the newest checkpoint).
        duration: seconds from the first start to the end.
        lost: seconds lost to restarts: work done after a process's last checkpoint,
            plus the time from each exit to the end of the next process's first step.
        log_path: the shared log.
        command: the command run.
        memory: the last process's memory, judged from outside as ``memfit watch``
            judges it (a level, a leak...), or ``None`` when it lived too short to tell.
        start: how the processes started (``"warm (forked from a parent that imported
            keras, tensorflow once, in 3.8 s)"``, ``"cold (why)"``).
        checkpointed: whether any process of the run began a ``memfit.session()``,
            checkpointed or resumed (a script without a session does none of these:
            nothing to restart it from).
    """

    exit_code: int
    finished: bool
    stop_reason: str | None
    children: tuple[ChildRun, ...]
    epoch: int
    duration: float
    lost: float
    log_path: Path
    command: tuple[str, ...] = ()
    memory: OutsideVerdict | None = None
    start: str = ""
    checkpointed: bool = True

    @property
    def restarts(self) -> dict[str, int]:
        """Restarts by reason (``{"every 1 epoch": 5, "max-rss": 1, "crash": 1}``)."""
        counts: collections.Counter[str] = collections.Counter()
        for child in self.children[:-1]:
            counts[child.reason if child.cause == Cause.RESTART else str(child.cause)] += 1
        return dict(counts)

    def __str__(self) -> str:
        cmd = shlex.join(self.command) if self.command else "the command"
        restarts = len(self.children) - 1
        by = ", ".join(f"{n} {r}" for r, n in self.restarts.items())
        state = "finished" if self.finished else f"stopped ({self.stop_reason})"
        done = f" after {format_count(self.epoch, 'epoch')}" \
            if self.checkpointed else ""
        lines = [f"memfit run: {cmd} {state}{done} in {self.duration:.1f} s, "
                 f"{format_count(restarts, 'restart')}" + (f" ({by})" if by else "")]
        if not self.checkpointed and not self.finished and self.children and all(
                c.cause == Cause.CRASH for c in self.children):
            # every process crashed before it checkpointed: whether the script trains in
            # memfit.session() is not known (a stranger's crashed at `import keras`)
            lines.append("  Note: no process wrote a checkpoint: each crashed first (its "
                         "output is above), so memfit run restarted it from the start.")
        elif not self.checkpointed:
            # a stranger's --restart-every 1 on a plain script: 40 epochs in one process,
            # and "finished after 0 epochs"
            lines.append("  Note: the command wrote no checkpoint (it does not train inside "
                         "memfit.session()), so memfit run cannot restart it where it was "
                         "(--restart-every does nothing to it; after --max-rss or a crash it "
                         "starts over) and does not count its epochs. docs/supervise.md "
                         "shows the two lines to add.")
        lines.append(f"  {'#':>2}  {'pid':>7}  {'exit':>4}  {'from':>9}  {'to':>9}  "
                     f"{'peak anon':>10}  {'lived':>7}  ended by      (from/to: epochs+steps "
                     f"done)")
        for i, c in enumerate(self.children, start=1):
            peak = format_size(c.peak.anon_or_total) if c.peak else "-"
            ended_by = c.cause if c.reason in ("", c.cause) else f"{c.cause}: {c.reason}"
            code = c.exit_code if c.exit_known else "?"
            if not c.exit_known:
                ended_by += " (its exit status was lost with the warm parent)"
            lines.append(f"  {i:>2}  {c.pid:>7}  {code:>4}  {_at(c.resumed_at):>9}  "
                         f"{_at(c.ended_at):>9}  {peak:>10}  {c.ended - c.started:6.1f}s  "
                         f"{ended_by}")
        lines.append(f"  time lost to restarts: {self.lost:.1f} s (start-up, model load, "
                     f"first step's compile and work after the last checkpoint)")
        if self.start and restarts:
            lines.append(f"  processes started {self.start}")
        if self.memory is not None:
            lines.append(f"  memory of the last process (from outside): "
                         f"{self.memory.headline}")
            lines.append(f"  Fix: {self.memory.fix}")
            if self.memory.note:
                lines.append(f"  Note: {self.memory.note}")
        lines.append(f"  log: {self.log_path}")
        return "\n".join(lines)


def _at(position: tuple[int, int]) -> str:
    """Training done, for the table: ``(2, 17)`` is ``2+17`` (2 epochs and 17 steps)."""
    return f"{position[0]}" + (f"+{position[1]}" if position[1] else "")
