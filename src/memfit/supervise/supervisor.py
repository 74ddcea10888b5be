"""The parent side of a supervised run: ``memfit run -- python train.py``.

:func:`run` starts the training command (which uses :func:`memfit.session`), samples
its whole process tree with the one probe, and starts it again from its last checkpoint:

- every ``restart_every`` epochs (the child exits by itself with code 75);
- when its anonymous RSS reaches ``max_rss``: it is asked to checkpoint after the
  current step and exit (a ``restart.request`` file, see
  :mod:`memfit.supervise.restart_protocol`);
- when it reaches ``hard_rss``, or does not answer a request within ``grace`` seconds:
  it is killed, and resumes from its last checkpoint;
- after a crash, a SIGKILL or an OOM kill, with exponential backoff.

The same failure at the same checkpoint twice in a row (a bug, a batch that can never
fit) stops the run with that reason instead of restarting forever, as does a child that
reports a configuration error (exit 78), a checkpoint it could not write (exit 74), a
damaged dataset (exit 65) or more than ``max_restarts`` unplanned restarts. Every sample,
exit and restart goes to the shared log (``memfit report WORKDIR`` marks restarts on the
timeline).

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
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memfit import checks, exitcodes
from memfit.env import MAX_RSS_ENV, RESTART_EVERY_ENV, SUPERVISOR_ENV, WORKDIR_ENV
from memfit.memory.classifier import TOO_SHORT
from memfit.memory.log import Event, MemoryLog, check_log, read_log
from memfit.memory.probe import oom_kills
from memfit.memory.process import check_command, exit_code, forward_signals, kill_tree, start, ticks
from memfit.memory.sampler import EvenSamples, TreeSampler
from memfit.memory.warm import WarmChild, WarmParent, WarmStartError
from memfit.memory.watch import OutsideVerdict, judge
from memfit.quiet import quieted
from memfit.sizes import format_size, parse_size
from memfit.supervise import restart_protocol, stops, warm
from memfit.supervise.checkpoint import Checkpoint, CheckpointError, CheckpointStore, where
from memfit.supervise.run_results import Cause, ChildRun, RunResult
from memfit.workdir import Workdir

__all__ = ["run"]

PLANNED = "every"       # reason prefix of restarts asked by --restart-every
COLD = "start cold"     # a warm child's exit 76: start it again as a new interpreter


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


def run(command: Sequence[str], *, workdir: str | os.PathLike = restart_protocol.DEFAULT_WORKDIR,
        restart_every: int | None = None, max_rss: str | int | None = None,
        hard_rss: str | int | None = None, max_restarts: int = 10, grace: float = 60.0,
        interval: float = 0.5, backoff: float = 1.0, max_backoff: float = 30.0,
        stop_grace: float = 30.0, start: str = "auto", out: object = None) -> RunResult:
    """Runs a training command, restarting it from its checkpoints until it finishes.

    The command should use :func:`memfit.session` (it checkpoints, resumes, and answers
    restart requests); any command can be run, but then only crash restarts (from the
    start) are possible. Its output streams through unchanged, but for TensorFlow's
    start-up lines (oneDNN, CUDA drivers, cuInit), left out as ``memfit run`` leaves them
    out; to see them, call it inside ``memfit.quiet.quieted(False)``.

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
        start: how each process starts: ``"warm"``, forked from a parent that imported
            the frameworks once (:mod:`memfit.supervise.warm`; where that is not safe, as
            a new interpreter, and the summary says why); ``"cold"``, always a new
            interpreter; ``"auto"`` (default), warm when restarts are planned
            (``restart_every`` or ``max_rss``), else cold.
        out: where the end summary is printed (``None``: ``sys.stderr``; ``False``: not).

    Returns:
        A :class:`RunResult`; ``print`` it for the summary.

    Raises:
        ValueError: for a bad argument, quoting it.
        CommandStartError: if the command does not exist (127) or cannot be run (126).
        MemfitError: if the workdir cannot be written or its log is not a memfit log.
    """
    command = check_command(command)
    limits = _Limits.checked(restart_every=restart_every, max_rss=max_rss,
                             hard_rss=hard_rss, max_restarts=max_restarts, grace=grace,
                             interval=interval, backoff=backoff, max_backoff=max_backoff,
                             stop_grace=stop_grace, start=start)
    wd = Workdir(workdir).create()
    check_log(wd.log)
    with quieted():     # as `memfit run` does; quieted(False) around the call shows them
        result = _Supervisor(command, wd, limits).run()
    if out is not False:
        print(result, file=sys.stderr if out is None else out)
    return result


@dataclasses.dataclass(frozen=True)
class _Limits:
    """The arguments of :func:`run` that rule the restarts, checked."""

    restart_every: int | None
    max_rss: int | None
    hard_rss: int | None
    max_restarts: int
    grace: float
    interval: float
    backoff: float
    max_backoff: float
    stop_grace: float
    start: str = "auto"

    @classmethod
    def checked(cls, *, restart_every: Any, max_rss: Any, hard_rss: Any, max_restarts: Any,
                grace: Any, interval: Any, backoff: Any, max_backoff: Any,
                stop_grace: Any, start: Any = "auto") -> _Limits:
        """The limits, or a ``ValueError`` quoting the first bad one."""
        if start not in _STARTS:
            raise ValueError(f"start must be one of {', '.join(_STARTS)} (warm: fork each "
                             f"process from a parent that imported the frameworks). "
                             f"Received: start={start!r}")
        max_rss = None if max_rss is None else parse_size(max_rss, name="max_rss", memory=True)
        hard_rss = None if hard_rss is None else parse_size(hard_rss, name="hard_rss", memory=True)
        limits = cls(
            restart_every=checks.count("restart_every", restart_every, optional=True,
                                       example=1, hint="It counts epochs."),
            max_rss=max_rss, hard_rss=hard_rss,
            max_restarts=checks.count("max_restarts", max_restarts, minimum=0, example=10),
            grace=checks.seconds("grace", grace, positive=False, example=60),
            interval=checks.seconds("interval", interval),
            backoff=checks.seconds("backoff", backoff, positive=False, example=1),
            max_backoff=checks.seconds("max_backoff", max_backoff, positive=False,
                                       example=30),
            stop_grace=checks.seconds("stop_grace", stop_grace, positive=False, example=30),
            start=start)
        for name, value in (("max_rss", max_rss), ("hard_rss", hard_rss)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a size above zero (e.g. 6GiB); 0 would "
                                 f"restart at once, every time. Leave it out to restart on "
                                 f"crashes only. Received: {name}={value!r}")
        if max_rss is not None and hard_rss is not None and hard_rss <= max_rss:
            raise ValueError(f"hard_rss must be above max_rss: the graceful restart at "
                             f"max_rss comes first, the kill at hard_rss only if that fails. "
                             f"Received: max_rss={format_size(max_rss)}, "
                             f"hard_rss={format_size(hard_rss)}")
        return limits

    def environment(self, wd: Workdir) -> dict[str, str]:
        """What the child is told (see :mod:`memfit.supervise.restart_protocol`)."""
        env = {WORKDIR_ENV: str(wd.path.resolve()), SUPERVISOR_ENV: str(os.getpid())}
        if self.restart_every:
            env[RESTART_EVERY_ENV] = str(self.restart_every)
        if self.max_rss:
            env[MAX_RSS_ENV] = str(self.max_rss)
        return env


_STARTS = ("auto", "warm", "cold")

_STOPS = {
    Cause.INTERRUPTED: "interrupted",
    Cause.CONFIG: "the command reported a configuration error (exit 78)",
    Cause.CHECKPOINT_FAILED: "the command could not write its checkpoint (exit 74; its message "
                         "above says why)",
    Cause.DATA: "the command met a damaged dataset (exit 65; its message above names the file "
            "and the record): a restart would read the same bytes",
}


class _Supervisor:
    """One :func:`run`: starts a child (:meth:`run_child`), watches it until it exits
    (:meth:`watch`), then stops (:meth:`stop_reason`) or restarts it after a backoff
    (:meth:`restart`), until the training finishes.

    Args:
        command: the checked command.
        wd: the run's workdir (created).
        limits: the checked limits.
    """

    def __init__(self, command: list[str], wd: Workdir, limits: _Limits):
        self.command = command
        self.wd = wd
        self.limits = limits
        self.store = CheckpointStore(wd.checkpoints)
        self.env = limits.environment(wd)
        self.children: list[ChildRun] = []
        self.proc: subprocess.Popen | WarmChild | None = None
        self.warm: WarmParent | None = None
        self.warm_plan: warm.Plan | None = None
        self.started_as = "cold"            # how the current child started
        self.start_note = ""                # how processes started, for the summary
        self.samples = EvenSamples()        # the current child's, for the verdict
        self.unplanned = 0                  # restarts not asked by --restart-every
        self.failures = 0                   # failures in a row without progress
        self.received: list[int] = []       # signals memfit run itself got
        self.log = MemoryLog(wd.log, source="run", command=command,
                             restart_every=limits.restart_every, max_rss=limits.max_rss,
                             hard_rss=limits.hard_rss)

    def run(self) -> RunResult:
        """Runs children until the training finishes or the run stops."""
        since = time.time()
        try:
            with forward_signals(current=lambda: self.proc) as received:
                self.received = received
                self.open_warm()
                stop_reason = self.loop()
        except BaseException:
            if self.proc is not None and self.proc.poll() is None:
                kill_tree(self.proc)
                self.proc.wait()
            self.close_warm()
            self.log.close()
            raise
        self.close_warm()
        return self.result(since, stop_reason)

    def open_warm(self) -> None:
        """Starts the warm parent where the ``start`` mode and the command allow it
        (:mod:`memfit.supervise.warm`); else notes why each process starts cold."""
        mode = self.limits.start
        if mode == "cold":
            self.start_note = "cold (--start cold)"
            return
        if mode == "auto" and not (self.limits.restart_every or self.limits.max_rss):
            self.start_note = ("cold (no --restart-every or --max-rss: restarts only after "
                               "failures; --start warm to fork them from a warm parent)")
            return
        planned = warm.plan(self.command)
        if isinstance(planned, str):
            self.start_note = f"cold ({planned})"
            return
        try:
            self.warm = WarmParent(planned.python, planned.flags, planned.modules,
                                   self.env).open(interrupted=self.received)
            self.warm_plan = planned
        except WarmStartError as e:
            self.start_note = f"cold (the warm parent could not start: {e})"
            return
        ready = self.warm.ready
        self.start_note = (f"warm (forked from a parent that imported "
                           f"{', '.join(ready.get('modules', []))} once, in "
                           f"{ready.get('seconds', 0):.1f} s)")
        self.log.write(Event.WARM, pid=self.warm.proc.pid if self.warm.proc else None,
                       modules=ready.get("modules"), seconds=ready.get("seconds"),
                       threads=ready.get("threads"))

    def close_warm(self, reason: str | None = None) -> None:
        """Ends the warm parent; with ``reason``, every later process starts cold."""
        if self.warm is None:
            return
        self.warm.close()
        self.warm = None
        if reason is not None:
            self.start_note += f", then cold ({reason})"
            print(f"memfit run: starting the training as a new interpreter from now on: "
                  f"{reason}", file=sys.stderr)

    def loop(self) -> str | None:
        """Runs children until one finishes (``None``) or the run stops (the reason)."""
        while True:
            child = self.run_child()
            if child.cause == Cause.FINISHED:
                return None
            stop = self.stop_reason(child)
            if stop is not None:
                return stop
            if self.restart(child):
                return "interrupted"

    def run_child(self) -> ChildRun:
        """Starts one child from the newest checkpoint and watches it until it exits."""
        restart_protocol.clear_request(self.wd.path)
        resumed_at = _position(self.store)
        self.proc = None
        if self.warm is not None:
            try:
                assert self.warm_plan is not None
                self.proc = self.warm.start(self.env, self.warm_plan.argv,
                                            script=self.warm_plan.script)
                self.started_as = "warm"
            except WarmStartError as e:
                self.close_warm(str(e))
        if self.proc is None:
            self.proc = start(self.command, self.env)
            self.started_as = "cold"
        self.samples = EvenSamples()
        child = self.watch(self.proc, resumed_at)
        self.children.append(child)
        peak = child.peak.anon_or_total if child.peak else None
        self.log.write(Event.EXIT, pid=child.pid, code=child.exit_code, cause=child.cause,
                       reason=child.reason, epoch=child.ended_at[0], step=child.ended_at[1],
                       peak_rss=peak, seconds=round(child.ended - child.started, 3),
                       start=child.start)
        if self.warm is not None and not self.warm.alive:
            self.close_warm("the warm parent ended (killed?)")
        elif child.start == "warm" and child.cause == Cause.CRASH:
            self.close_warm(f"process {child.pid}, forked from the warm parent, crashed "
                            f"({child.reason}); a new interpreter rules the fork out as the "
                            f"cause")
        elif child.start == "warm" and child.reason.startswith(COLD):
            self.close_warm("the script changed a variable the frameworks read when "
                            "imported (its message above)")
        return child

    def stop_reason(self, child: ChildRun) -> str | None:
        """Why the run stops after ``child`` instead of restarting, or ``None``."""
        if child.cause in _STOPS:
            return _STOPS[child.cause]
        planned = child.cause == Cause.RESTART and child.reason.startswith((PLANNED, COLD))
        if planned:
            return None
        self.unplanned += 1
        repeated = stops.repeated(self.children) or \
            stops.memory_stall(self.children, self.limits.max_rss)
        if repeated:
            return repeated
        if self.unplanned > self.limits.max_restarts:
            unasked = [c for c in self.children if not (
                c.cause == Cause.RESTART and c.reason.startswith((PLANNED, COLD)))]
            return (f"{self.unplanned} restarts not asked by --restart-every "
                    f"({stops.tally(unasked)}), more than --max-restarts "
                    f"{self.limits.max_restarts}")
        return None

    def restart(self, child: ChildRun) -> bool:
        """Logs and announces the restart and waits its backoff (a failure: doubled for
        each in a row without progress). Returns whether a signal came meanwhile."""
        failed = child.cause != Cause.RESTART
        self.failures = self.failures + 1 if failed and not child.progressed else int(failed)
        delay = min(self.limits.max_backoff, self.limits.backoff * 2 ** (self.failures - 1)) \
            if failed else 0.0
        peak = child.peak.anon_or_total if child.peak else None
        self.log.write(Event.RESTART, reason=child.reason if child.cause == Cause.RESTART
                       else f"{child.cause}: {child.reason}", after=child.pid, delay=delay,
                       epoch=child.ended_at[0], step=child.ended_at[1], peak_rss=peak)
        print(f"memfit run: {_describe(child)}; restarting from {where(*child.ended_at)}"
              + (f" in {delay:.1f} s" if delay else ""), file=sys.stderr)
        return _sleep(delay, self.received)

    def watch(self, proc: subprocess.Popen | WarmChild, resumed_at: tuple[int, int]) -> ChildRun:
        """Samples one child until it exits; asks it for a restart at ``max_rss``, kills
        it at ``hard_rss``, when it does not answer within ``grace``, or when it outlives
        ``stop_grace`` after a signal."""
        lim = self.limits
        started = time.time()
        ooms = oom_kills()
        sampler = TreeSampler(proc.pid, log=self.log, samples=self.samples)
        requested: float | None = None
        killed: str | None = None
        signalled: float | None = None
        for now in ticks(proc, lim.interval):
            if self.received and signalled is None:
                signalled = now
            if signalled is not None and killed is None and now - signalled > lim.stop_grace \
                    and proc.poll() is None:
                killed = self._kill(proc, "stop-grace", grace=lim.stop_grace)
            s = sampler.take()
            if s is not None:
                anon = s.anon_or_total
                if killed is None and lim.hard_rss and anon >= lim.hard_rss:
                    killed = self._kill(proc, "hard-rss", rss=anon, limit=lim.hard_rss)
                elif requested is None and lim.max_rss and anon >= lim.max_rss:
                    requested = now
                    restart_protocol.write_request(self.wd.path, "max-rss", rss=anon)
                    self.log.write(Event.REQUEST, pid=proc.pid, reason="max-rss", rss=anon,
                                   limit=lim.max_rss)
            if requested is not None and killed is None and now - requested > lim.grace \
                    and proc.poll() is None:
                killed = self._kill(proc, "unresponsive", grace=lim.grace)
        ended = time.time()
        ckpt = _latest(self.store)
        after = oom_kills()
        oom = None if ooms is None or after is None or proc.returncode != -signal.SIGKILL \
            else after > ooms
        cause, reason = self._cause(proc, killed, ckpt, started, oom)
        return ChildRun(pid=proc.pid, exit_code=exit_code(proc.returncode), cause=cause,
                        reason=reason, started=started, ended=ended, peak=sampler.peak,
                        resumed_at=resumed_at, ended_at=ckpt.position if ckpt else (0, 0),
                        start=self.started_as,
                        exit_known=not (isinstance(proc, WarmChild) and proc.lost),
                        oom_killed=oom if killed is None else None)

    def _kill(self, proc: subprocess.Popen | WarmChild, reason: str, **fields: Any) -> str:
        self.log.write(Event.KILL, pid=proc.pid, reason=reason, **fields)
        kill_tree(proc)
        return reason

    def _cause(self, proc: subprocess.Popen | WarmChild, killed: str | None,
               ckpt: Checkpoint | None, started: float,
               oom: bool | None = None) -> tuple[Cause, str]:
        """Why a child ended (:attr:`ChildRun.cause`) and the details. The reason of a
        restart is the one its checkpoint, written since it started, records."""
        code = exit_code(proc.returncode)
        fresh = ckpt.contents if ckpt is not None and \
            (ckpt.contents.time or 0) >= started else None
        saved_reason = fresh.reason or "" if fresh is not None else ""
        if self.received:
            reason = exitcodes.signal_name(self.received[0])
            if killed == "stop-grace":
                reason += f", killed: no exit within --stop-grace {self.limits.stop_grace:g} s"
            return Cause.INTERRUPTED, reason
        if killed == "hard-rss":
            return Cause.HARD_RSS, (f"anonymous RSS reached --hard-rss "
                            f"{format_size(self.limits.hard_rss or 0)}")
        if killed == "unresponsive":
            return Cause.UNRESPONSIVE, (f"no checkpoint within --grace "
                                        f"{self.limits.grace:g} s of the request")
        if isinstance(proc, WarmChild) and proc.lost:
            # Its exit status went with the killed warm parent: what it left tells the rest
            # (a stranger's process that checkpointed for a restart was said to be killed).
            if fresh is not None and saved_reason:
                return Cause.RESTART, saved_reason
            return Cause.KILLED, "exit status unknown"
        if code == 0:
            return Cause.FINISHED, ""
        if code == exitcodes.RESTART:
            return Cause.RESTART, saved_reason if fresh is not None else "asked"
        if code == 128 + signal.SIGTERM and saved_reason.startswith("preempted"):
            return Cause.RESTART, saved_reason
        if code == exitcodes.START_COLD and self.started_as == "warm":
            return Cause.RESTART, COLD
        if code == exitcodes.CONFIG:
            return Cause.CONFIG, "exit 78"
        if code == exitcodes.CHECKPOINT_FAILED:
            return Cause.CHECKPOINT_FAILED, "exit 74"
        if code == exitcodes.DATA_ERROR:
            return Cause.DATA, "exit 65"
        if proc.returncode < 0:
            said = {None: " (the OOM killer?)", True: ", by the OOM killer: the kernel "
                    "counted an out-of-memory kill meanwhile", False: ", not by the OOM "
                    "killer: the kernel counted none meanwhile"}[oom]
            return Cause.KILLED, exitcodes.signal_name(-proc.returncode) + (
                said if proc.returncode == -signal.SIGKILL else "")
        return Cause.CRASH, f"exit code {code}"

    def result(self, since: float, stop_reason: str | None) -> RunResult:
        """The run's result (the last child's memory judged, the stop logged); closes
        the log."""
        last = self.children[-1]
        result = RunResult(
            exit_code=last.exit_code, finished=last.cause == Cause.FINISHED,
            stop_reason=stop_reason, children=tuple(self.children),
            epoch=_position(self.store)[0], duration=time.time() - since,
            lost=_lost_time(self.wd.log, since, self.children), log_path=self.wd.log,
            command=tuple(self.command), memory=self._memory(last), start=self.start_note,
            checkpointed=_checkpointed(self.wd.log, since))
        if stop_reason:
            self.log.write(Event.STOP, reason=stop_reason)
        self.log.close()
        return result

    def _memory(self, child: ChildRun) -> OutsideVerdict | None:
        """The last process's memory, judged from outside (and logged), unless it lived
        too short to tell (a process per epoch usually does)."""
        judged = judge(self.samples.items, self.wd.log, child.started,
                       child.ended - child.started, self.command)
        if judged.verdict.kind == TOO_SHORT:
            return None
        self.log.write(Event.VERDICT, pid=child.pid, source="run", **judged.to_record())
        return judged


def _checkpointed(log_path: Path, since: float) -> bool:
    """Whether a process of the run started at ``since`` trained inside a session: it
    began one (even if it ended before its first checkpoint), checkpointed or resumed."""
    return any(r["t"] >= since and r["event"] in (Event.SESSION, Event.CHECKPOINT,
                                                  Event.RESUME)
               for r in read_log(log_path))


def _lost_time(log_path: Path, since: float, children: Sequence[ChildRun]) -> float:
    """Work after each restarted child's last checkpoint, plus each gap from an exit to
    the end of the next child's first step (its ``first_step`` event: the step's trace
    or compile is start-up too), else to its ``resume``."""
    checkpoints: dict[int, list[float]] = collections.defaultdict(list)
    resumes: dict[int, float] = {}
    stepped: dict[int, float] = {}
    for record in read_log(log_path):
        if record["t"] < since:
            continue
        if record["event"] == Event.CHECKPOINT:
            checkpoints[record["pid"]].append(record["t"])
        elif record["event"] == Event.RESUME:
            resumes.setdefault(record["pid"], record["t"])
        elif record["event"] == Event.FIRST_STEP:
            stepped.setdefault(record["pid"], record["t"])
    lost = 0.0
    for child, following in zip(children, children[1:], strict=False):
        last = max((t for t in checkpoints[child.pid] if t <= child.ended),
                   default=resumes.get(child.pid, child.started))
        lost += max(0.0, child.ended - last)
        began = stepped.get(following.pid, resumes.get(following.pid, following.ended))
        lost += max(0.0, began - child.ended)
    return lost


def _describe(child: ChildRun) -> str:
    if child.cause == Cause.RESTART and child.reason == COLD:
        # exit 76 checkpoints nothing (a stranger read "checkpointed and exited" there)
        return f"process {child.pid} exited to be started again as a new interpreter"
    if child.cause == Cause.RESTART:
        return f"process {child.pid} checkpointed and exited for a restart ({child.reason})"
    return f"process {child.pid} ended: {child.cause} ({child.reason})"


def _sleep(seconds: float, interrupted: list[int]) -> bool:
    """Sleeps; returns early (True) if a signal arrived."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if interrupted:
            return True
        time.sleep(min(0.1, end - time.monotonic()))
    return bool(interrupted)
