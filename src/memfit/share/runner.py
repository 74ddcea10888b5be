"""``memfit.share_jobs()``: run several jobs on one device, within one memory budget.

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
    >>> result = memfit.share_jobs("jobs.toml", budget="12GiB")      # doctest: +SKIP
    >>> print(result)                                           # doctest: +SKIP
    >>> result.makespan < result.serial                         # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from memfit import checks
from memfit.errors import MemfitError
from memfit.exitcodes import signal_name
from memfit.memory.log import Event, MemoryLog
from memfit.memory.process import exit_code, forward_signals, kill_tree
from memfit.memory.sampler import TreeSampler
from memfit.share.jobs import JobsSpec
from memfit.share.launch import start_job
from memfit.share.layout import DEFAULT_WORKDIR, JobFiles
from memfit.share.outcome import finish, measured, over_share_reason, stop_over_share
from memfit.share.planner import Plan, PlannedJob, gpu_memory, pick, plan
from memfit.share.share_results import JobResult, ShareResult
from memfit.share.states import JobState, Stop
from memfit.share.status import Row, Status
from memfit.sizes import format_size
from memfit.workdir import Workdir

__all__ = ["share", "STOP_GRACE"]

STOP_GRACE = 10.0                   # seconds between SIGTERM and SIGKILL on Ctrl-C


def share(jobs: str | os.PathLike | Sequence[Mapping[str, Any]] | JobsSpec | Plan, *,
          budget: str | int | None = None, device: str | None = None,
          workdir: str | os.PathLike = DEFAULT_WORKDIR, restart: bool = False,
          overhead: str | int | None = None, interval: float = 0.5,
          out: TextIO | None | bool = None, ray: bool | str | None = None) -> ShareResult:
    """Runs several jobs on one device, never charging more than the budget at once.

    Each job is charged its need plus the per-process overhead of the device (see
    :mod:`memfit.share.planner`); jobs are started largest first while they fit, the rest
    queue and start as others end. A job whose memory goes above its share is stopped
    (or, supervised, restarted by ``memfit run``) while the others keep running. The jobs
    file is checked completely before anything starts.

    Example:
        >>> import memfit
        >>> result = memfit.share_jobs("examples/jobs.toml", budget="1GiB",
        ...                       overhead="16MiB", workdir="runs/share")  # doctest: +SKIP
        >>> print(result)                                                 # doctest: +SKIP
        >>> result["mlp-64"].peak, result.makespan, result.serial          # doctest: +SKIP

    Args:
        jobs: a jobs file (TOML, see :mod:`memfit.share.jobs`), a list of job dicts
            (``{"name": "a", "command": ["python", "train.py"], "need": "1GiB"}``), or a
            :class:`~memfit.share.planner.Plan` from :func:`memfit.share.planner.plan`.
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
        ray: run the jobs on a Ray cluster instead (:func:`memfit.share.cluster.run_on_ray`,
            docs/scale-out.md): ``True`` joins ``$RAY_ADDRESS`` or starts a local Ray
            instance; ``"host:port"`` joins that cluster. ``budget`` is then the memory of a
            local instance's node. Needs ``pip install 'memfit[ray]'``.

    Returns:
        A :class:`ShareResult`; ``print`` it for the summary.

    Raises:
        JobsFileError: for a bad jobs file, listing every problem (nothing started).
        ValueError: for a bad ``interval``.
        MemfitError: if the workdir cannot be written or its log is not memfit's.
    """
    if ray is not None and ray is not False:
        from memfit.share.cluster import run_on_ray

        if not isinstance(ray, bool | str) or not ray:
            raise ValueError(f"ray must be True (a local instance, or $RAY_ADDRESS) or a "
                             f"cluster's address such as '10.0.0.5:6379'. Received: ray={ray!r}")
        return run_on_ray(jobs, address=None if ray is True else ray, budget=budget,
                          device=device, workdir=workdir, restart=restart,
                          overhead=overhead, interval=interval, out=out)
    interval = checks.seconds("interval", interval)
    p = jobs if isinstance(jobs, Plan) else plan(
        jobs, budget=budget, device=device, overhead=overhead, workdir=workdir,
        restart=restart)
    if p.device.startswith("gpu") and gpu_memory(int(p.device.split(":")[1])) is None:
        raise MemfitError(f"memfit share cannot see GPU {p.device.split(':')[1]} here (NVML "
                          f"finds no such card): it could neither watch nor enforce the jobs' "
                          f"GPU memory. Give --device cpu, or run where the card is (on a "
                          f"Ray cluster with GPU nodes: --ray). Received: device={p.device!r}")
    wd = Workdir(p.workdir).create()
    stream = sys.stderr if out is None else None if out is False else out
    status = Status(stream)  # type: ignore[arg-type]
    if stream is not None:
        print(p, file=stream)           # the plan: needs, charges, what starts together
    log = MemoryLog(wd.log, source="share", budget=p.budget, device=p.device,
                    overhead=p.overhead, overhead_source=p.overhead_source,
                    jobs_file=p.source, interval=interval,
                    jobs=[{"name": j.name, "command": list(j.command), "need": j.need,
                           "need_source": j.need_source, "share": j.charge,
                           "restart": j.restart} for j in p.jobs])
    scheduler = _Scheduler(p, log, status, interval)
    try:
        scheduler.run()
    finally:
        log.close()
        status.close()
    result = scheduler.result(wd.log)
    if stream is not None:
        print(result, file=stream)
    return result


@dataclasses.dataclass
class _Running:
    """A running job: its process, its sampler and how it is being stopped, if it is."""

    job: PlannedJob
    files: JobFiles
    proc: subprocess.Popen
    sampler: TreeSampler
    started: float
    now: int | None = None          # its memory at the last sweep (what its share holds)
    stopped: Stop | None = None     # why memfit is stopping it, if it is
    reason: str = ""

    @property
    def host_peak(self) -> int | None:
        """The largest anonymous RSS of its tree."""
        return None if self.sampler.peak is None else self.sampler.peak.anon_or_total

    @property
    def peak(self) -> int | None:
        """The largest memory sampled for its share: NVML's on a GPU, else anonymous RSS."""
        return self.sampler.gpu_peak if self.sampler.gpu else self.host_peak


class _Scheduler:
    """One share's loop: every ``interval`` seconds, one tick (:meth:`tick_once`) samples
    the running jobs and stops any over its share, finishes the jobs that ended, starts
    the queued jobs that fit and logs the sweep; a signal stops everything.

    Args:
        plan: what to run.
        log: the shared log (open).
        status: where events and the live table go.
        interval: seconds between two ticks.
    """

    def __init__(self, plan: Plan, log: MemoryLog, status: Status, interval: float):
        self.plan = plan
        self.log = log
        self.status = status
        self.interval = interval
        self.on_gpu = plan.device.startswith("gpu")
        self.queue: list[PlannedJob] = list(plan.jobs)
        self.active: list[_Running] = []
        self.results: dict[str, JobResult] = {}
        self.max_in_use = self.max_charged = 0
        self.stopping_at: float | None = None      # monotonic: when the stragglers die
        self.tick = 0
        self.since = time.time()

    @property
    def interrupted(self) -> bool:
        return self.stopping_at is not None

    def run(self) -> None:
        """Ticks until every job has ended (or was never started after a signal)."""
        try:
            with forward_signals(current=lambda: None) as received:
                next_at = time.monotonic()
                while self.queue or self.active:
                    self.tick_once(received)
                    if not (self.queue or self.active):
                        break
                    next_at = max(next_at + self.interval, time.monotonic())
                    self._wait(next_at)
        except BaseException:
            self.abort()
            raise
        if self.interrupted:
            self.log.write(Event.STOP, reason=Stop.INTERRUPTED)

    def tick_once(self, received: Sequence[int]) -> None:
        """One sweep over the jobs."""
        self.tick += 1
        if received and not self.interrupted:           # Ctrl-C / SIGTERM: stop all
            self.stop_on_signal(received[0])
        if self.stopping_at is not None and time.monotonic() > self.stopping_at:
            for a in self.active:
                kill_tree(a.proc)
        in_use = self.sample()
        for a in list(self.active):
            if a.proc.poll() is not None:
                self.active.remove(a)
                self.finish(a)
        if not self.interrupted:
            self.start_queued()
        charged = sum(a.job.charge for a in self.active)
        self.max_in_use = max(self.max_in_use, in_use)
        self.max_charged = max(self.max_charged, charged)
        self.log.write(Event.SHARE, tick=self.tick, charged=charged, in_use=in_use,
                       budget=self.plan.budget, running=[a.job.name for a in self.active],
                       queued=len(self.queue))
        self.status.update(self._rows(), self._header(charged, in_use))

    def start_queued(self) -> None:
        """Starts the queued jobs that fit in the budget left (first-fit decreasing)."""
        free = self.plan.budget - sum(a.job.charge for a in self.active)
        for job in pick(self.queue, free):
            self.queue.remove(job)
            self.launch(job)

    def launch(self, job: PlannedJob) -> None:
        """Starts one job (one that cannot start fails alone)."""
        files = JobFiles.of(self.plan.workdir, job.name)
        try:
            proc = start_job(job, self.plan.device, files, interval=self.interval)
        except Exception as e:          # noqa: BLE001 - a job that cannot start fails alone
            code = getattr(e, "exit_code", 126)
            now = time.time()
            self.results[job.name] = JobResult.of(job, files, state=JobState.FAILED,
                                                  exit_code=code,
                                                  reason=str(e), started=now, ended=now)
            self.log.write(Event.EXIT, job=job.name, code=code, reason=str(e))
            self.status.event(f"{job.name} could not start: {e}")
            return
        sampler = TreeSampler(proc.pid, log=self.log, gpu=self.on_gpu, job=job.name,
                              share=job.charge)
        self.active.append(_Running(job, files, proc, sampler, time.time()))
        self.log.write(Event.JOB_START, pid=proc.pid, job=job.name, command=list(job.command),
                       share=job.charge, need=job.need, need_source=job.need_source,
                       supervised=job.restart)
        alone = ", alone" if job.need is None else \
            f" = need {format_size(job.need)} + overhead {format_size(self.plan.overhead)}"
        self.status.event(f"started {job.name} (pid {proc.pid}; share "
                          f"{format_size(job.charge)}{alone})")

    def sample(self) -> int:
        """Samples every running job (logged under its pid, with this tick); stops the
        ones above their share. Returns the memory they hold together."""
        in_use = 0
        for a in self.active:
            s = a.sampler.take(tick=self.tick)
            if s is None:
                continue
            value = a.sampler.gpu_now if self.on_gpu else s.anon_or_total
            if value is None:
                continue
            a.now = value
            in_use += value
            if value > a.job.charge and a.stopped is None:
                self.stop_over_share(a, value)
        return in_use

    def stop_over_share(self, a: _Running, value: int) -> None:
        """Kills a job above its share (a supervised one's training process only:
        ``memfit run`` restarts it)."""
        if not stop_over_share(a.proc, a.job, self.log, value, where={"job": a.job.name}):
            self.status.event(f"{a.job.name}: {measured(self.on_gpu)} {format_size(value)} "
                              f"above its share {format_size(a.job.charge)}: its training "
                              f"process was killed for memfit run to restart")
            return
        a.stopped = Stop.OVER_SHARE
        a.reason = over_share_reason(value, a.job.charge, on_gpu=self.on_gpu)
        if self.on_gpu:
            a.reason += (" (is the job capped? it must call memfit.configure_device() before "
                         "TensorFlow starts)")
        with contextlib.suppress(subprocess.TimeoutExpired):
            a.proc.wait(timeout=10)         # its memory is free before another starts

    def finish(self, a: _Running) -> None:
        """A job has ended: its result, its restarts and exit in the log, its record."""
        ended = time.time()
        r = finish(a.job, a.files, self.log, device=self.plan.device,
                   where={"job": a.job.name}, pid=a.proc.pid,
                   code=exit_code(a.proc.returncode), started=a.started, ended=ended,
                   stopped=a.stopped, reason=a.reason, peak=a.peak, host_peak=a.host_peak)
        self.results[a.job.name] = r
        peak = "-" if r.peak is None else format_size(r.peak)
        self.status.event(f"{a.job.name} {r.state}" + (f" ({r.reason})" if r.reason else "")
                          + f" after {ended - a.started:.1f} s, peak {peak}")

    def stop_on_signal(self, signum: int) -> None:
        """Ctrl-C or SIGTERM: SIGTERM to every running job (SIGKILL after
        :data:`STOP_GRACE` seconds); the queued jobs are not started."""
        name = signal_name(signum)
        self.stopping_at = time.monotonic() + STOP_GRACE
        self.status.event(f"{name}: stopping {len(self.active)} running job(s); "
                          f"{len(self.queue)} not started")
        for a in self.active:
            a.stopped, a.reason = Stop.INTERRUPTED, name
            kill_tree(a.proc, signal.SIGTERM)
        for job in self.queue:
            self.results[job.name] = JobResult.of(job, JobFiles.of(self.plan.workdir, job.name),
                                                  state=JobState.NOT_STARTED,
                                                  reason="interrupted")
        self.queue.clear()

    def abort(self) -> None:
        """memfit share itself failed or was interrupted: kill every job."""
        for a in self.active:
            kill_tree(a.proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                a.proc.wait(timeout=10)
        self.log.write(Event.STOP, reason="memfit share itself was interrupted or failed")

    def result(self, log_path: os.PathLike) -> ShareResult:
        ordered = sorted(self.plan.jobs, key=lambda j: j.index)
        return ShareResult(jobs=tuple(self.results[j.name] for j in ordered), plan=self.plan,
                           started=self.since, ended=time.time(),
                           interrupted=self.interrupted, max_in_use=self.max_in_use,
                           max_charged=self.max_charged, log_path=Path(log_path))

    def _wait(self, until: float) -> None:
        """Sleeps until ``until`` (monotonic), waking early when a job ends."""
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            if any(a.proc.poll() is not None for a in self.active):
                return
            time.sleep(min(left, 0.05))

    def _rows(self) -> list[Row]:
        running = {a.job.name: a for a in self.active}
        now = time.time()
        rows: list[Row] = []
        for job in sorted(self.plan.jobs, key=lambda j: j.index):
            if job.name in running:
                a = running[job.name]
                rows.append((job.name, JobState.RUNNING, a.now, a.peak, job.charge,
                             now - a.started))
            elif job.name in self.results:
                r = self.results[job.name]
                rows.append((job.name, r.state, None, r.peak, job.charge, r.duration))
            else:
                rows.append((job.name, JobState.QUEUED, None, None, job.charge, None))
        return rows

    def _header(self, charged: int, in_use: int) -> str:
        return (f"memfit share: {len(self.active)} running, {len(self.queue)} queued, "
                f"{len(self.results)} done · budget {format_size(self.plan.budget)} · "
                f"charged {format_size(charged)} · in use {format_size(in_use)} · "
                f"{time.time() - self.since:.1f} s  ({shlex.quote(self.plan.source)})")

