"""``memfit.share()``: run several jobs on one device, within one memory budget.

The jobs of a :class:`~memfit.share.planner.Plan` are packed onto the budget first-fit
decreasing (the largest charge that fits the room left goes first); the others queue and
start as running jobs end. Every ``interval`` seconds each running job's whole process
tree is sampled with the one probe, and each job is held to its share (its charge):

- on the CPU, the tree's anonymous RSS (memory-mapped files and the page cache do not
  count); a job above its share is killed (SIGKILL to the whole tree) while the others
  keep running. A supervised job (``restart``) runs under ``memfit run``, which asks
  it to checkpoint at 90 % of its share and kills and restarts it at its share (less
  :data:`~memfit.share.planner.SUPERVISOR_RSS` for ``memfit run`` itself); should the tree
  still pass its share between two samples, its training process is killed here, and
  ``memfit run`` restarts it;
- on a GPU, the job's ``configure_device()`` caps TensorFlow at its need
  (``$MEMFIT_GPU_MEMORY_LIMIT``), and NVML's figure for the tree is watched: a job above
  its share is killed (a supervised job's training process only: ``memfit run``
  restarts it).

Everything goes to one log, ``WORKDIR/memory.jsonl``: a ``start`` event (budget, device,
overhead, jobs), per job a ``job_start`` (its command and share), its ``sample`` events
(under the job's pid, with ``job``, ``share`` and ``tick``: the samples of one sweep
share a tick), ``kill`` and ``exit``; and per sweep a ``share`` event (``charged``: the
shares of the running jobs; ``in_use``: their sampled memory; ``running``). ``memfit
report WORKDIR`` draws every job on one timeline. Each job's output goes to
``WORKDIR/jobs/NAME/stdout.log`` and ``stderr.log``, and what it measured to
``WORKDIR/jobs/NAME/job.json`` (the next run learns a missing need from it).

Example:
    >>> result = memfit.share("jobs.toml", budget="12GiB")      # doctest: +SKIP
    >>> print(result)                                           # doctest: +SKIP
    >>> result.makespan < result.serial                         # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from memfit.atomic import temporary_name
from memfit.device import device_env
from memfit.env import SHARE_ENV, SHARE_JOB_ENV, WORKDIR_ENV
from memfit.memory.log import LogError, MemoryLog, read_log
from memfit.memory.probe import Sample, nvml_memory, sample
from memfit.memory.process import exit_code, forward_signals, kill_tree, start
from memfit.share.jobs import JobsSpec
from memfit.share.planner import (
    DEFAULT_WORKDIR,
    RECORD_NAME,
    SUPERVISOR_RSS,
    Plan,
    PlannedJob,
    job_dir,
    pick,
    plan,
)
from memfit.share.status import Row, Status
from memfit.sizes import format_size
from memfit.workdir import Workdir

__all__ = ["share", "ShareResult", "JobResult", "STOP_GRACE"]

STOP_GRACE = 10.0                   # seconds between SIGTERM and SIGKILL on Ctrl-C
REQUEST_AT = 0.9                    # a supervised job is asked to checkpoint at 90 % of share


@dataclasses.dataclass(frozen=True)
class JobResult:
    """What one job did.

    Attributes:
        name: the job.
        state: ``"finished"`` (exit 0), ``"failed"`` (another exit code),
            ``"stopped"`` (killed for going over its share), ``"interrupted"``
            (Ctrl-C/SIGTERM), or ``"not started"``.
        exit_code: as a shell reports it (128 + N when killed by signal N); ``None`` if
            it never started.
        reason: why it ended, in words (empty when it finished).
        peak: the largest memory sampled for its tree (CPU: anonymous RSS; GPU: NVML).
        host_peak: the largest anonymous RSS of its tree (the same as ``peak`` on the CPU).
        share: its charge on the budget (the most it may hold).
        need: its need above the overhead (``None``: it ran alone to learn it).
        need_source: ``"given"``, ``"auto"``, ``"learned"`` or ``"unknown"``.
        pid: the process started (for a supervised job, ``memfit run``).
        started / ended: Unix times (``None`` if it never started).
        restarts: restarts by ``memfit run`` (supervised jobs).
        directory: ``WORKDIR/jobs/NAME``: its ``stdout.log``, ``stderr.log``, ``job.json``.
    """

    name: str
    state: str
    exit_code: int | None
    reason: str
    peak: int | None
    host_peak: int | None
    share: int
    need: int | None
    need_source: str
    pid: int | None
    started: float | None
    ended: float | None
    restarts: int
    directory: Path

    @property
    def duration(self) -> float | None:
        """Seconds from its start to its end."""
        if self.started is None or self.ended is None:
            return None
        return self.ended - self.started


@dataclasses.dataclass(frozen=True)
class ShareResult:
    """What :func:`share` did; ``print`` it for the summary.

    Attributes:
        jobs: one :class:`JobResult` per job, in file order.
        plan: the plan that was run (budget, device, overhead, charges).
        started / ended: Unix times of the share.
        interrupted: Ctrl-C or SIGTERM stopped it.
        max_in_use: the most memory the running jobs held together at one sweep.
        max_charged: the most that was charged at once (never above the budget).
        log_path: the shared log.
    """

    jobs: tuple[JobResult, ...]
    plan: Plan
    started: float
    ended: float
    interrupted: bool
    max_in_use: int
    max_charged: int
    log_path: Path

    @property
    def makespan(self) -> float:
        """Seconds from the first job's start to the last one's end."""
        starts = [j.started for j in self.jobs if j.started is not None]
        ends = [j.ended for j in self.jobs if j.ended is not None]
        return max(ends) - min(starts) if starts and ends else 0.0

    @property
    def serial(self) -> float:
        """The sum of the jobs' durations: the time running them one after another."""
        return sum(j.duration or 0.0 for j in self.jobs)

    @property
    def ok(self) -> bool:
        """Every job finished with exit code 0."""
        return all(j.state == "finished" for j in self.jobs)

    @property
    def exit_code(self) -> int:
        """0 when every job finished, 130 when interrupted, else 1."""
        return 0 if self.ok else 130 if self.interrupted else 1

    def __getitem__(self, name: str) -> JobResult:
        for job in self.jobs:
            if job.name == name:
                return job
        raise KeyError(f"No job named {name!r}. Jobs: {', '.join(j.name for j in self.jobs)}")

    def __str__(self) -> str:
        p = self.plan
        states: dict[str, int] = {}
        for j in self.jobs:
            states[j.state] = states.get(j.state, 0) + 1
        counts = ", ".join(f"{n} {s}" for s, n in states.items())
        faster = f", {self.serial / self.makespan:.1f}× faster" if self.makespan > 0 else ""
        lines = [f"memfit share: {len(self.jobs)} jobs on {p.device}, budget "
                 f"{format_size(p.budget)}: {counts}; makespan {self.makespan:.1f} s "
                 f"(one after another: {self.serial:.1f} s{faster})"]
        width = max([3] + [len(j.name) for j in self.jobs])
        lines.append(f"  {'job':<{width}}  {'state':<11} {'exit':>4}  {'peak':>9}  "
                     f"{'share':>9}  {'start':>6}  {'took':>6}  need (from)")
        t0 = min((j.started for j in self.jobs if j.started is not None), default=self.started)
        for j in self.jobs:
            need = "alone" if j.need is None else format_size(j.need)
            peak = "-" if j.peak is None else format_size(j.peak)
            code = "-" if j.exit_code is None else str(j.exit_code)
            at = "-" if j.started is None else f"{j.started - t0:5.1f}s"
            took = "-" if j.duration is None else f"{j.duration:5.1f}s"
            extra = f"; {j.restarts} restart{'s' if j.restarts != 1 else ''}" \
                if j.restarts else ""
            why = f"  {j.reason}" if j.reason else ""
            lines.append(f"  {j.name:<{width}}  {j.state:<11} {code:>4}  {peak:>9}  "
                         f"{format_size(j.share):>9}  {at:>6}  {took:>6}  {need} "
                         f"({j.need_source}{extra}){why}")
        what = "GPU memory (NVML)" if p.device.startswith("gpu") else "anonymous RSS"
        lines.append(f"  most in use at once: {format_size(self.max_in_use)} {what}; most "
                     f"charged: {format_size(self.max_charged)} of {format_size(p.budget)} "
                     f"(each job: need + {format_size(p.overhead)} overhead, "
                     f"{p.overhead_source})")
        lines.append(f"  job output: {p.workdir / 'jobs'}/NAME/stdout.log, stderr.log; "
                     f"log: {self.log_path} (memfit report {p.workdir})")
        return "\n".join(lines)


@dataclasses.dataclass
class _Active:
    """A running job (mutable, inside the loop)."""

    job: PlannedJob
    proc: subprocess.Popen
    started: float
    directory: Path
    now: int | None = None
    peak: int | None = None
    host_peak: int | None = None
    stopped: str | None = None
    reason: str = ""


def _start_logged(command: list[str], env: Mapping[str, str], stdout: Path,
                  stderr: Path) -> subprocess.Popen:
    """:func:`memfit.memory.process.start` with the job's stdout and stderr going to files."""
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        return start(command, env, stdout=out, stderr=err)


def _write_record(path: Path, record: dict) -> None:
    """Writes ``job.json`` under a temporary name, then renames it: a reader never sees
    half of it. No fsync: the loop that enforces the shares must not wait on the disk
    (a record lost to a power cut only means the need is learned again)."""
    tmp = temporary_name(path)
    tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def _command(job: PlannedJob, p: Plan, directory: Path, interval: float) -> list[str]:
    """The job's command; a supervised job runs under ``python -m memfit run``."""
    if not job.restart:
        return list(job.command)
    command = [sys.executable, "-m", "memfit", "run", "--workdir", str(directory),
               "--interval", f"{interval:g}"]
    if p.device == "cpu":
        limit = job.charge - SUPERVISOR_RSS      # the training process's own tree
        command += ["--max-rss", str(int(limit * REQUEST_AT)), "--hard-rss", str(limit)]
    return command + ["--", *job.command]


def _environment(job: PlannedJob, p: Plan, directory: Path) -> dict[str, str]:
    env = {WORKDIR_ENV: str(directory.resolve()), SHARE_JOB_ENV: job.name,
           SHARE_ENV: str(job.charge)}
    if p.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = "-1"       # the budget is host memory: keep off GPUs
    else:
        env["CUDA_VISIBLE_DEVICES"] = p.device.split(":", 1)[1]
        # A job of known need is capped at it; one run alone to learn it grows as needed
        # (so that its peak means something).
        env.update(device_env(memory_limit=job.need) if job.need is not None
                   else device_env(growth=True))
    env.update(job.env)
    return env


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return f"signal {code - 128}"


def _supervisor_events(a: _Active) -> tuple[list[dict], str]:
    """A supervised job's restarts (from ``memfit run``'s log in its directory) and the
    reason it stopped, if it did."""
    log = Workdir(a.directory).log
    restarts, stop = [], ""
    try:
        for record in read_log(log):
            if record["t"] < a.started - 1:
                continue
            if record["event"] == "restart":
                restarts.append(record)
            elif record["event"] == "stop":
                stop = str(record.get("reason") or "")
    except (LogError, OSError):
        pass
    return restarts, stop


def _resolve(jobs: Any, budget: Any, device: Any, overhead: Any, workdir: Any,
             restart: bool) -> Plan:
    if isinstance(jobs, Plan):
        return jobs
    return plan(jobs, budget=budget, device=device, overhead=overhead, workdir=workdir,
                restart=restart)


def share(jobs: str | os.PathLike | Sequence[Mapping[str, Any]] | JobsSpec | Plan, *,
          budget: str | int | None = None, device: str | None = None,
          workdir: str | os.PathLike = DEFAULT_WORKDIR, restart: bool = False,
          overhead: str | int | None = None, interval: float = 0.5,
          out: TextIO | None | bool = None) -> ShareResult:
    """Runs several jobs on one device, never charging more than the budget at once.

    Each job is charged its need plus the per-process overhead of the device (see
    :mod:`memfit.share.planner`); jobs are started largest first while they fit, the rest
    queue and start as others end. A job whose memory goes above its share is stopped
    (or, supervised, restarted by ``memfit run``) while the others keep running. The jobs
    file is checked completely before anything starts.

    Example:
        >>> import memfit
        >>> result = memfit.share("examples/jobs.toml", budget="1GiB",
        ...                       overhead="16MiB", workdir="runs/share")  # doctest: +SKIP
        >>> print(result)                                                 # doctest: +SKIP
        >>> result["small"].peak, result.makespan, result.serial          # doctest: +SKIP

    Args:
        jobs: a jobs file (TOML, see :mod:`memfit.share.jobs`), a list of job dicts
            (``{"name": "a", "command": ["python", "train.py"], "need": "1GiB"}``), or a
            :class:`~memfit.share.planner.Plan` from :func:`memfit.share.plan`.
        budget: bytes all running jobs may hold together (``"12GiB"``); default: the
            file's ``budget``, else the memory available now (CPU) or the GPU's free
            memory.
        device: ``"cpu"`` or ``"gpu:N"``; default: the file's, else ``gpu:0`` when a GPU
            is visible, else ``cpu``.
        workdir: the shared log and, in ``jobs/NAME/``, each job's output.
        restart: supervise every job with ``memfit run`` (a job's ``restart`` key wins):
            a job over its share is restarted from its checkpoints instead of stopped.
        overhead: the per-process overhead charged to each job; default: the file's,
            else the calibrated framework baseline (``memfit calibrate``).
        interval: seconds between two samples of every job (enforcement acts this fast).
        out: where the status and the summary go (``None``: stderr, a live table when
            it is a terminal; ``False``: nowhere).

    Returns:
        A :class:`ShareResult`; ``print`` it for the summary.

    Raises:
        JobsFileError: for a bad jobs file, listing every problem (nothing started).
        ValueError: for a bad ``interval``.
        MemfitError: if the workdir cannot be written or its log is not memfit's.
    """
    if isinstance(interval, bool) or not isinstance(interval, int | float) \
            or not interval > 0 or interval != interval:
        raise ValueError(f"interval must be a positive number of seconds. "
                         f"Received: interval={interval!r}")
    p = _resolve(jobs, budget, device, overhead, workdir, restart)
    wd = Workdir(p.workdir).create()
    stream = sys.stderr if out is None else None if out is False else out
    status = Status(stream)  # type: ignore[arg-type]
    if stream is not None:
        print(p, file=stream)           # the plan: needs, charges, what starts together
    on_gpu = p.device.startswith("gpu")
    log = MemoryLog(wd.log, source="share", budget=p.budget, device=p.device,
                    overhead=p.overhead, overhead_source=p.overhead_source,
                    jobs_file=p.source, interval=interval,
                    jobs=[{"name": j.name, "command": list(j.command), "need": j.need,
                           "need_source": j.need_source, "share": j.charge,
                           "restart": j.restart} for j in p.jobs])
    since = time.time()
    queue: list[PlannedJob] = list(p.jobs)
    active: list[_Active] = []
    results: dict[str, JobResult] = {}
    max_in_use = max_charged = 0
    stopping_at: float | None = None
    tick = 0

    def launch(job: PlannedJob) -> None:
        directory = job_dir(wd.path, job.name)
        directory.mkdir(parents=True, exist_ok=True)
        command = _command(job, p, directory, interval)
        try:
            proc = _start_logged(command, _environment(job, p, directory),
                                 directory / "stdout.log", directory / "stderr.log")
        except Exception as e:          # noqa: BLE001 - a job that cannot start fails alone
            code = getattr(e, "exit_code", 126)
            now = time.time()
            results[job.name] = JobResult(job.name, "failed", code, str(e), None, None,
                                          job.charge, job.need, job.need_source, None, now,
                                          now, 0, directory)
            log.write("exit", job=job.name, code=code, reason=str(e))
            status.event(f"{job.name} could not start: {e}")
            return
        a = _Active(job, proc, time.time(), directory)
        active.append(a)
        log.write("job_start", pid=proc.pid, job=job.name, command=list(job.command),
                  share=job.charge, need=job.need, need_source=job.need_source,
                  supervised=job.restart)
        status.event(f"started {job.name} (pid {proc.pid}; share {format_size(job.charge)}"
                     + (" = need " + format_size(job.need) + " + overhead "
                        + format_size(p.overhead) if job.need is not None else ", alone")
                     + ")")

    def finish(a: _Active) -> None:
        ended = time.time()
        code = exit_code(a.proc.returncode)
        restarts: list[dict] = []
        stop = ""
        if a.job.restart:
            restarts, stop = _supervisor_events(a)
            for r in restarts:
                log.write("restart", pid=a.proc.pid, t=r["t"], job=a.job.name,
                          reason=r.get("reason"))
        if a.stopped == "over-share":
            state, reason = "stopped", a.reason
        elif a.stopped == "interrupted":
            state, reason = "interrupted", a.reason or "interrupted"
        elif code == 0:
            state, reason = "finished", ""
        else:
            state = "failed"
            reason = stop or (f"killed by {_signal_name(code)}" if code > 128
                              else f"exit code {code}")
        result = JobResult(a.job.name, state, code, reason, a.peak, a.host_peak, a.job.charge,
                           a.job.need, a.job.need_source, a.proc.pid, a.started, ended,
                           len(restarts), a.directory)
        results[a.job.name] = result
        log.write("exit", pid=a.proc.pid, job=a.job.name, code=code, state=state,
                  reason=reason or state, peak=a.peak, duration=ended - a.started)
        record = {"name": a.job.name, "command": list(a.job.command), "device": p.device,
                  "exit_code": code, "state": state, "peak": a.peak, "host_peak": a.host_peak,
                  "share": a.job.charge, "need": a.job.need, "need_source": a.job.need_source,
                  "duration": ended - a.started, "restarts": len(restarts), "t": ended}
        _write_record(a.directory / RECORD_NAME, record)
        peak = "-" if a.peak is None else format_size(a.peak)
        status.event(f"{a.job.name} {state}" + (f" ({reason})" if reason else "")
                     + f" after {ended - a.started:.1f} s, peak {peak}")

    def stop_over_share(a: _Active, value: int, s: Sample | None) -> None:
        what = "NVML" if on_gpu else "anonymous RSS"
        log.write("kill", pid=a.proc.pid, job=a.job.name, reason="over-share", value=value,
                  share=a.job.charge)
        if a.job.restart:
            kill_tree(a.proc, include_self=False)   # memfit run restarts the training process
            status.event(f"{a.job.name}: {what} {format_size(value)} above its share "
                         f"{format_size(a.job.charge)}: its training process was killed "
                         f"for memfit run to restart")
            return
        kill_tree(a.proc)
        a.stopped = "over-share"
        a.reason = (f"{what} {format_size(value)} went above its share "
                    f"{format_size(a.job.charge)}")
        if on_gpu:
            a.reason += (" (is the job capped? it must call memfit.configure_device() before "
                         "TensorFlow starts)")
        with contextlib.suppress(subprocess.TimeoutExpired):
            a.proc.wait(timeout=10)         # its memory is free before another starts

    try:
        with forward_signals(current=lambda: None) as received:
            next_at = time.monotonic()
            while queue or active:
                tick += 1
                if received and stopping_at is None:         # Ctrl-C / SIGTERM: stop all
                    stopping_at = time.monotonic() + STOP_GRACE
                    status.event(f"{signal.Signals(received[0]).name}: stopping "
                                 f"{len(active)} running job(s); {len(queue)} not started")
                    for a in active:
                        a.stopped, a.reason = "interrupted", signal.Signals(received[0]).name
                        kill_tree(a.proc, signal.SIGTERM)
                    for job in queue:
                        results[job.name] = JobResult(
                            job.name, "not started", None, "interrupted", None, None,
                            job.charge, job.need, job.need_source, None, None, None, 0,
                            job_dir(wd.path, job.name))
                    queue.clear()
                if stopping_at is not None and time.monotonic() > stopping_at:
                    for a in active:
                        kill_tree(a.proc)
                in_use = 0
                for a in active:
                    try:
                        s: Sample | None = sample(a.proc.pid, tree=True)
                    except ProcessLookupError:
                        s = None
                    gpu = nvml_memory(a.proc.pid, tree=True) if on_gpu and s is not None else None
                    if s is None:
                        continue
                    host = s.anon_or_total
                    value = gpu if on_gpu else host
                    a.host_peak = host if a.host_peak is None else max(a.host_peak, host)
                    if value is not None:
                        a.now = value
                        a.peak = value if a.peak is None else max(a.peak, value)
                        in_use += value
                    log.write("sample", scope="tree", job=a.job.name, share=a.job.charge,
                              tick=tick, nvml=gpu, **s.as_record())
                    if value is not None and value > a.job.charge and a.stopped is None:
                        stop_over_share(a, value, s)
                for a in list(active):
                    if a.proc.poll() is not None:
                        active.remove(a)
                        finish(a)
                if stopping_at is None:
                    free = p.budget - sum(a.job.charge for a in active)
                    for job in pick(queue, free):
                        queue.remove(job)
                        launch(job)
                charged = sum(a.job.charge for a in active)
                max_in_use, max_charged = max(max_in_use, in_use), max(max_charged, charged)
                log.write("share", tick=tick, charged=charged, in_use=in_use,
                          budget=p.budget, running=[a.job.name for a in active],
                          queued=len(queue))
                status.update(_rows(p, active, results, queue), _header(
                    p, active, queue, results, charged, in_use, since))
                if not (queue or active):
                    break
                next_at = max(next_at + interval, time.monotonic())
                _wait(active, next_at)
    except BaseException:
        for a in active:
            kill_tree(a.proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                a.proc.wait(timeout=10)
        log.write("stop", reason="memfit share itself was interrupted or failed")
        log.close()
        status.close()
        raise
    interrupted = stopping_at is not None
    if interrupted:
        log.write("stop", reason="interrupted")
    log.close()
    status.close()
    ordered = sorted(p.jobs, key=lambda j: j.index)
    result = ShareResult(jobs=tuple(results[j.name] for j in ordered), plan=p, started=since,
                         ended=time.time(), interrupted=interrupted, max_in_use=max_in_use,
                         max_charged=max_charged, log_path=wd.log)
    if stream is not None:
        print(result, file=stream)
    return result


def _wait(active: list[_Active], until: float) -> None:
    """Sleeps until ``until`` (monotonic), waking early when a job ends."""
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return
        if any(a.proc.poll() is not None for a in active):
            return
        time.sleep(min(left, 0.05))


def _rows(p: Plan, active: list[_Active], results: Mapping[str, JobResult],
          queue: list[PlannedJob]) -> list[Row]:
    running = {a.job.name: a for a in active}
    now = time.time()
    rows: list[Row] = []
    for job in sorted(p.jobs, key=lambda j: j.index):
        if job.name in running:
            a = running[job.name]
            rows.append((job.name, "running", a.now, a.peak, job.charge, now - a.started))
        elif job.name in results:
            r = results[job.name]
            rows.append((job.name, r.state, None, r.peak, job.charge, r.duration))
        else:
            rows.append((job.name, "queued", None, None, job.charge, None))
    return rows


def _header(p: Plan, active: list[_Active], queue: list[PlannedJob],
            results: Mapping[str, JobResult], charged: int, in_use: int, since: float) -> str:
    return (f"memfit share: {len(active)} running, {len(queue)} queued, {len(results)} done"
            f" · budget {format_size(p.budget)} · charged {format_size(charged)} · in use "
            f"{format_size(in_use)} · {time.time() - since:.1f} s  ({shlex.quote(p.source)})")
