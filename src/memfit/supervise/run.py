"""The parent side of a supervised run: ``memfit run -- python train.py``.

:func:`run` starts the training command (which uses :func:`memfit.session`), samples
its whole process tree with the one probe, and starts it again from its last checkpoint:

- every ``restart_every`` epochs (the child exits by itself with code 75);
- when its anonymous RSS reaches ``max_rss``: it is asked to checkpoint after the
  current step and exit (a ``restart.request`` file, see
  :mod:`memfit.supervise.protocol`);
- when it reaches ``hard_rss``, or does not answer a request within ``grace`` seconds:
  it is killed, and resumes from its last checkpoint;
- after a crash, a SIGKILL or an OOM kill, with exponential backoff.

The same failure at the same checkpoint twice in a row (a bug, a batch that can never
fit) stops the run with that reason instead of restarting forever, as does a child that
reports a configuration error (exit 78), a checkpoint it could not write (exit 74) or
more than ``max_restarts`` unplanned restarts. Every sample, exit and restart goes to the
shared log (``memfit report WORKDIR`` marks restarts on the timeline).

SIGTERM (a preemption: Kubernetes, Slurm, a spot instance) is passed on to the training
process, whose session finishes its current step, checkpoints and exits; the run then
stops, and the next ``memfit run`` resumes with no step redone. A process still running
``stop_grace`` seconds after the signal is killed. SIGINT (Ctrl-C) stops both at once.

Example:
    >>> result = memfit.run(["python", "train.py"], restart_every=1)  # doctest: +SKIP
    >>> print(result)                                                 # doctest: +SKIP
    memfit run: python train.py finished after 6 epochs in 74.2 s, 5 restarts
      ...
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from memfit import exitcodes
from memfit.env import MAX_RSS_ENV, RESTART_EVERY_ENV, SUPERVISOR_ENV, WORKDIR_ENV
from memfit.memory.log import MemoryLog, read_log
from memfit.memory.probe import Sample
from memfit.memory.process import check_command, exit_code, forward_signals, kill_tree, start, ticks
from memfit.memory.sampler import EvenSamples, TreeSampler
from memfit.memory.watch import OutsideVerdict, judge
from memfit.sizes import format_size, parse_size
from memfit.supervise import protocol
from memfit.supervise.checkpoint import Checkpoint, CheckpointError, CheckpointStore, where
from memfit.workdir import Workdir

__all__ = ["run", "RunResult", "ChildRun"]

PLANNED = "every"       # reason prefix of restarts asked by --restart-every


@dataclasses.dataclass(frozen=True)
class ChildRun:
    """One process of a supervised run.

    Attributes:
        pid: its process id.
        exit_code: as a shell reports it (128 + N when killed by signal N).
        cause: why it ended: ``"finished"``, ``"restart"`` (it exited with 75, or
            checkpointed and exited after a SIGTERM sent to it alone), ``"config"`` (78),
            ``"checkpoint-failed"`` (74), ``"crash"`` (another code), ``"killed"`` (a
            signal not sent by memfit, e.g. the OOM killer), ``"hard-rss"``,
            ``"unresponsive"``, ``"interrupted"`` (memfit run itself got SIGINT/SIGTERM).
        reason: the details: the restart's reason (``"every 1 epoch"``, ``"max-rss"``),
            the signal's name, the exit code.
        started, ended: Unix times.
        peak: the largest sample of its process tree (``None`` if it ended first).
        resumed_at, ended_at: the ``(epoch, step)`` of the checkpoint it started from and
            of the newest checkpoint when it ended.
    """

    pid: int
    exit_code: int
    cause: str
    reason: str
    started: float
    ended: float
    peak: Sample | None
    resumed_at: tuple[int, int]
    ended_at: tuple[int, int]

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
            plus the time from each exit to the next process resuming training.
        log_path: the shared log.
        command: the command run.
        memory: the last process's memory, judged from outside as ``memfit watch``
            judges it (a level, a leak...), or ``None`` when it lived too short to tell.
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

    @property
    def restarts(self) -> dict[str, int]:
        """Restarts by reason (``{"every 1 epoch": 5, "max-rss": 1, "crash": 1}``)."""
        counts: collections.Counter[str] = collections.Counter()
        for child in self.children[:-1]:
            counts[child.reason if child.cause == "restart" else child.cause] += 1
        return dict(counts)

    def __str__(self) -> str:
        cmd = shlex.join(self.command) if self.command else "the command"
        restarts = len(self.children) - 1
        by = ", ".join(f"{n} {r}" for r, n in self.restarts.items())
        state = "finished" if self.finished else f"stopped ({self.stop_reason})"
        lines = [f"memfit run: {cmd} {state} after {self.epoch} epoch"
                 f"{'s' if self.epoch != 1 else ''} in {self.duration:.1f} s, {restarts} "
                 f"restart{'s' if restarts != 1 else ''}" + (f" ({by})" if by else "")]
        lines.append(f"  {'#':>2}  {'pid':>7}  {'exit':>4}  {'from':>9}  {'to':>9}  "
                     f"{'peak anon':>10}  {'lived':>7}  ended by      (from/to: epochs+steps "
                     f"done)")
        for i, c in enumerate(self.children, start=1):
            peak = format_size(c.peak.anon_or_total) if c.peak else "-"
            ended_by = c.cause if c.reason in ("", c.cause) else f"{c.cause}: {c.reason}"
            lines.append(f"  {i:>2}  {c.pid:>7}  {c.exit_code:>4}  {_at(c.resumed_at):>9}  "
                         f"{_at(c.ended_at):>9}  {peak:>10}  {c.ended - c.started:6.1f}s  "
                         f"{ended_by}")
        lines.append(f"  time lost to restarts: {self.lost:.1f} s (start-up, model load and "
                     f"work after the last checkpoint)")
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


def _latest(store: CheckpointStore) -> Checkpoint | None:
    """The newest good checkpoint, for the table (the session sets damaged ones aside
    and says so; here a store it cannot use reads as none)."""
    try:
        return store.latest()
    except CheckpointError:
        return None


def _position(store: CheckpointStore) -> tuple[int, int]:
    ckpt = _latest(store)
    return ckpt.position if ckpt else (0, 0)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _check(restart_every: int | None, max_rss: int | None, hard_rss: int | None,
           max_restarts: int, grace: float, interval: float, backoff: float,
           stop_grace: float) -> None:
    if restart_every is not None and (isinstance(restart_every, bool)
                                      or not isinstance(restart_every, int)
                                      or restart_every < 1):
        raise ValueError(f"restart_every must be a positive number of epochs, or None. "
                         f"Received: restart_every={restart_every!r}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a non-negative integer. "
                         f"Received: max_restarts={max_restarts!r}")
    for name, value in (("max_rss", max_rss), ("hard_rss", hard_rss)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be a size above zero (e.g. 6GiB); 0 would restart "
                             f"at once, every time. Leave it out to restart on crashes only. "
                             f"Received: {name}={value!r}")
    for name, value in (("grace", grace), ("interval", interval), ("backoff", backoff),
                        ("stop_grace", stop_grace)):
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or value < 0 or (name == "interval" and value == 0):
            kind = "positive" if name == "interval" else "non-negative"
            raise ValueError(f"{name} must be a {kind} number of seconds. "
                             f"Received: {name}={value!r}")
    if max_rss is not None and hard_rss is not None and hard_rss <= max_rss:
        raise ValueError(f"hard_rss must be above max_rss: the graceful restart at max_rss "
                         f"comes first, the kill at hard_rss only if that fails. Received: "
                         f"max_rss={format_size(max_rss)}, hard_rss={format_size(hard_rss)}")


def _lost_time(log_path: Path, since: float, children: Sequence[ChildRun]) -> float:
    """Work after each restarted child's last checkpoint, plus each gap from an exit to
    the next child resuming training (its ``resume`` event)."""
    checkpoints: dict[int, list[float]] = collections.defaultdict(list)
    resumes: dict[int, float] = {}
    for record in read_log(log_path):
        if record["t"] < since:
            continue
        if record["event"] == "checkpoint":
            checkpoints[record["pid"]].append(record["t"])
        elif record["event"] == "resume":
            resumes.setdefault(record["pid"], record["t"])
    lost = 0.0
    for child, following in zip(children, children[1:], strict=False):
        last = max((t for t in checkpoints[child.pid] if t <= child.ended),
                   default=resumes.get(child.pid, child.started))
        lost += max(0.0, child.ended - last)
        lost += max(0.0, resumes.get(following.pid, following.ended) - child.ended)
    return lost


def run(command: Sequence[str], *, workdir: str | os.PathLike = protocol.DEFAULT_WORKDIR,
        restart_every: int | None = None, max_rss: str | int | None = None,
        hard_rss: str | int | None = None, max_restarts: int = 10, grace: float = 60.0,
        interval: float = 0.5, backoff: float = 1.0, max_backoff: float = 30.0,
        stop_grace: float = 30.0, out: object = None) -> RunResult:
    """Runs a training command, restarting it from its checkpoints until it finishes.

    The command should use :func:`memfit.session` (it checkpoints, resumes, and answers
    restart requests); any command can be run, but then only crash restarts (from the
    start) are possible. Its output streams through unchanged.

    Example:
        >>> result = memfit.run(["python", "train.py"], workdir="runs/exp1",
        ...                     restart_every=1, max_rss="6GiB")        # doctest: +SKIP
        >>> result.finished, result.restarts                            # doctest: +SKIP
        (True, {'every 1 epoch': 9})

    Args:
        command: the program and its arguments, e.g. ``["python", "train.py"]``.
        workdir: the run's workdir (log, checkpoints); handed to the command in
            ``$MEMFIT_WORKDIR``.
        restart_every: start a new process every this many epochs (``None``: never).
        max_rss: anonymous RSS of the process tree (``"6GiB"``, bytes) at which the
            command is asked to checkpoint after its current step and exit for a
            restart. File-backed pages (memory-mapped data) do not count.
        hard_rss: anonymous RSS at which the command is killed and resumed from its last
            checkpoint (must be above ``max_rss``).
        max_restarts: restarts not asked by ``restart_every`` (memory, crashes) allowed
            before the run stops.
        grace: seconds the command has to answer a restart request before it is killed.
        interval: seconds between memory samples.
        backoff: seconds before the first restart after a failure; doubled for each
            further failure in a row, up to ``max_backoff``.
        max_backoff: the longest wait between restarts.
        stop_grace: seconds the command has, after memfit run is sent SIGTERM (and passes
            it on), to checkpoint and exit before it is killed.
        out: where the end summary is printed (``None``: ``sys.stderr``; ``False``: not).

    Returns:
        A :class:`RunResult`; ``print`` it for the summary.

    Raises:
        ValueError: for a bad argument, quoting it.
        CommandStartError: if the command does not exist (127) or cannot be run (126).
        MemfitError: if the workdir cannot be written or its log is not a memfit log.
    """
    command = check_command(command)
    max_rss = None if max_rss is None else parse_size(max_rss, name="max_rss")
    hard_rss = None if hard_rss is None else parse_size(hard_rss, name="hard_rss")
    _check(restart_every, max_rss, hard_rss, max_restarts, grace, interval, backoff,
           stop_grace)
    wd = Workdir(workdir).create()
    if wd.log.exists() and wd.log.stat().st_size > 0:
        for _ in read_log(wd.log):          # LogError if it is not a memfit log
            pass
    store = CheckpointStore(wd.checkpoints)
    env = {WORKDIR_ENV: str(wd.path.resolve()), SUPERVISOR_ENV: str(os.getpid())}
    if restart_every:
        env[RESTART_EVERY_ENV] = str(restart_every)
    if max_rss:
        env[MAX_RSS_ENV] = str(max_rss)

    since = time.time()
    log = MemoryLog(wd.log, source="run", command=command, restart_every=restart_every,
                    max_rss=max_rss, hard_rss=hard_rss)
    children: list[ChildRun] = []
    proc: subprocess.Popen | None = None
    unplanned = 0
    failures = 0
    stop_reason: str | None = None
    try:
        with forward_signals(current=lambda: proc) as received:
            while True:
                protocol.clear_request(wd.path)
                resumed_at = _position(store)
                proc = start(command, env)
                samples = EvenSamples()
                child = _supervise(proc, log, wd, store, resumed_at, max_rss, hard_rss,
                                   grace, interval, stop_grace, interrupted=received,
                                   samples=samples)
                children.append(child)
                peak = child.peak.anon_or_total if child.peak else None
                log.write("exit", pid=child.pid, code=child.exit_code, cause=child.cause,
                          reason=child.reason, epoch=child.ended_at[0], step=child.ended_at[1],
                          peak_rss=peak, seconds=round(child.ended - child.started, 3))
                if child.cause == "finished":
                    break
                if child.cause in _STOPS:
                    stop_reason = _STOPS[child.cause]
                    break
                planned = child.cause == "restart" and child.reason.startswith(PLANNED)
                if not planned:
                    unplanned += 1
                    repeated = _repeated(children)
                    if repeated:
                        stop_reason = repeated
                        break
                    if unplanned > max_restarts:
                        stop_reason = (f"{unplanned} restarts not asked by --restart-every, "
                                       f"more than --max-restarts {max_restarts}")
                        break
                failed = child.cause not in ("restart",)
                failures = failures + 1 if failed and not child.progressed else int(failed)
                delay = min(max_backoff, backoff * 2 ** (failures - 1)) if failed else 0.0
                log.write("restart", reason=child.reason if child.cause == "restart"
                          else f"{child.cause}: {child.reason}", after=child.pid, delay=delay,
                          epoch=child.ended_at[0], step=child.ended_at[1], peak_rss=peak)
                print(f"memfit run: {_describe(child)}; restarting from "
                      f"{where(*child.ended_at)}" + (f" in {delay:.1f} s" if delay else ""),
                      file=sys.stderr)
                if _sleep(delay, received):
                    stop_reason = "interrupted"
                    break
    except BaseException:
        if proc is not None and proc.poll() is None:
            kill_tree(proc)
            proc.wait()
        log.close()
        raise
    last = children[-1]
    result = RunResult(
        exit_code=last.exit_code, finished=last.cause == "finished",
        stop_reason=stop_reason, children=tuple(children), epoch=_position(store)[0],
        duration=time.time() - since, lost=_lost_time(wd.log, since, children),
        log_path=wd.log, command=tuple(command), memory=_memory(last, samples, wd, command,
                                                                 log))
    if stop_reason:
        log.write("stop", reason=stop_reason)
    log.close()
    if out is not False:
        print(result, file=sys.stderr if out is None else out)
    return result


_STOPS = {
    "interrupted": "interrupted",
    "config": "the command reported a configuration error (exit 78)",
    "checkpoint-failed": "the command could not write its checkpoint (exit 74; its message "
                         "above says why)",
}


def _memory(child: ChildRun, samples: EvenSamples, wd: Workdir, command: Sequence[str],
            log: MemoryLog) -> OutsideVerdict | None:
    """The last process's memory, judged from outside (and logged), unless it lived too
    short to tell (a process per epoch usually does)."""
    judged = judge(samples.items, wd.log, child.started, child.ended - child.started,
                   command)
    if judged.verdict.kind == "unknown":
        return None
    log.write("verdict", pid=child.pid, source="run", **judged.to_record())
    return judged


def _describe(child: ChildRun) -> str:
    if child.cause == "restart":
        return f"process {child.pid} checkpointed and exited for a restart ({child.reason})"
    return f"process {child.pid} ended: {child.cause} ({child.reason})"


def _repeated(children: Sequence[ChildRun]) -> str | None:
    """A stop reason when the last two processes failed the same way at the same place."""
    if len(children) < 2:
        return None
    a, b = children[-2], children[-1]
    same = (a.cause, a.exit_code, a.ended_at) == (b.cause, b.exit_code, b.ended_at)
    if not same or b.progressed:
        return None
    if b.cause == "restart" and b.reason == "max-rss":
        return (f"two restarts for --max-rss in a row made no progress past "
                f"{where(*b.ended_at)}: the training needs more memory than --max-rss to take "
                f"a step; raise --max-rss or lower the batch size")
    return (f"{b.cause} ({b.reason}) twice in a row at {where(*b.ended_at)}, with no progress "
            f"in between: it will not go away by restarting")


def _sleep(seconds: float, interrupted: list[int]) -> bool:
    """Sleeps; returns early (True) if a signal arrived."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if interrupted:
            return True
        time.sleep(min(0.1, end - time.monotonic()))
    return bool(interrupted)


def _supervise(proc: subprocess.Popen, log: MemoryLog, wd: Workdir, store: CheckpointStore,
               resumed_at: tuple[int, int], max_rss: int | None, hard_rss: int | None,
               grace: float, interval: float, stop_grace: float,
               interrupted: list[int], samples: EvenSamples) -> ChildRun:
    """Samples one child until it exits (into ``samples``); asks for a restart or kills
    it on memory."""
    started = time.time()
    sampler = TreeSampler(proc.pid, log=log, samples=samples)
    requested: float | None = None
    killed: str | None = None
    signalled: float | None = None
    for now in ticks(proc, interval):
        if interrupted and signalled is None:
            signalled = now
        if signalled is not None and killed is None and now - signalled > stop_grace \
                and proc.poll() is None:
            killed = "stop-grace"
            log.write("kill", pid=proc.pid, reason="stop-grace", grace=stop_grace)
            kill_tree(proc)
        s = sampler.take()
        if s is not None:
            anon = s.anon_or_total
            if killed is None and hard_rss and anon >= hard_rss:
                killed = "hard-rss"
                log.write("kill", pid=proc.pid, reason="hard-rss", rss=anon, limit=hard_rss)
                kill_tree(proc)
            elif requested is None and max_rss and anon >= max_rss:
                requested = now
                protocol.write_request(wd.path, "max-rss", rss=anon)
                log.write("request", pid=proc.pid, reason="max-rss", rss=anon, limit=max_rss)
        if requested is not None and killed is None and now - requested > grace \
                and proc.poll() is None:
            killed = "unresponsive"
            log.write("kill", pid=proc.pid, reason="unresponsive", grace=grace)
            kill_tree(proc)
    ended = time.time()
    code = exit_code(proc.returncode)
    ckpt = _latest(store)
    ended_at = ckpt.position if ckpt else (0, 0)
    fresh = ckpt is not None and ckpt.state.get("time", 0) >= started
    if interrupted:
        cause, reason = "interrupted", _signal_name(interrupted[0])
        if killed == "stop-grace":
            reason += f", killed: no exit within --stop-grace {stop_grace:g} s"
    elif killed == "hard-rss":
        cause, reason = killed, f"anonymous RSS reached --hard-rss {format_size(hard_rss)}"
    elif killed == "unresponsive":
        cause, reason = killed, f"no checkpoint within --grace {grace:g} s of the request"
    elif code == 0:
        cause, reason = "finished", ""
    elif code == exitcodes.RESTART:
        cause, reason = "restart", str(ckpt.state.get("reason", "")) if fresh else "asked"
    elif code == 128 + signal.SIGTERM and fresh and \
            str(ckpt.state.get("reason", "")).startswith("preempted"):
        cause, reason = "restart", str(ckpt.state["reason"])
    elif code == exitcodes.CONFIG:
        cause, reason = "config", "exit 78"
    elif code == exitcodes.CHECKPOINT_FAILED:
        cause, reason = "checkpoint-failed", "exit 74"
    elif proc.returncode < 0:
        name = _signal_name(-proc.returncode)
        cause = "killed"
        reason = name + (" (the OOM killer?)" if proc.returncode == -signal.SIGKILL else "")
    else:
        cause, reason = "crash", f"exit code {code}"
    return ChildRun(pid=proc.pid, exit_code=code, cause=cause, reason=reason, started=started,
                    ended=ended, peak=sampler.peak, resumed_at=resumed_at, ended_at=ended_at)
