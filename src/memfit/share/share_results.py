"""What ``memfit share`` did: one :class:`JobResult` per job, and the :class:`ShareResult`.

Both are built once, at the end of a job (or when it cannot start, or never starts), by
:meth:`JobResult.of` from the planned job; ``print`` a :class:`ShareResult` for the
summary table.

Example:
    >>> from memfit.share.planner import PlannedJob
    >>> job = PlannedJob(name="a", command=("python", "train.py"), need=2**20,
    ...                  need_source="given", note="given", charge=2**21, exclusive=False,
    ...                  restart=False, env={}, index=1)
    >>> r = JobResult.of(job, JobFiles.of("runs", "a"), state="finished", exit_code=0,
    ...                  started=10.0, ended=12.5)
    >>> r.duration, r.share, r.directory.as_posix()
    (2.5, 2097152, 'runs/jobs/a')
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from memfit.share.layout import JobFiles
from memfit.share.planner import SUPERVISOR_RSS, Plan, PlannedJob
from memfit.share.states import JobState
from memfit.sizes import format_count, format_size

__all__ = ["JobResult", "RayJobResult", "ShareResult"]


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
    state: JobState
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

    @classmethod
    def of(cls, job: PlannedJob, files: JobFiles, *, state: JobState,
           exit_code: int | None = None, reason: str = "", peak: int | None = None,
           host_peak: int | None = None, pid: int | None = None,
           started: float | None = None, ended: float | None = None,
           restarts: int = 0) -> JobResult:
        """The result of ``job`` (its name, share and need from the plan): the one way a
        :class:`JobResult` is built."""
        return cls(name=job.name, state=state, exit_code=exit_code, reason=reason, peak=peak,
                   host_peak=host_peak, share=job.charge, need=job.need,
                   need_source=job.need_source, pid=pid, started=started, ended=ended,
                   restarts=restarts, directory=files.directory)

    @property
    def duration(self) -> float | None:
        """Seconds from its start to its end."""
        if self.started is None or self.ended is None:
            return None
        return self.ended - self.started


@dataclasses.dataclass(frozen=True)
class RayJobResult(JobResult):
    """What one Ray task of ``memfit share --ray`` did with its job
    (:func:`memfit.share.cluster_job.run_job` returns it; Ray pickles it back to the
    driver): a :class:`JobResult` plus where the job ran.

    Example:
        >>> from memfit.share.planner import PlannedJob
        >>> job = PlannedJob(name="a", command=("python", "train.py"), need=2**20,
        ...                  need_source="given", note="given", charge=2**21,
        ...                  exclusive=False, restart=False, env={}, index=1)
        >>> r = RayJobResult.on_node(JobResult.of(job, JobFiles.of("runs", "a"),
        ...                                       state=JobState.FINISHED, exit_code=0),
        ...                          node="1a2b3c4d", node_id="1a2b3c4d5e", attempt=1)
        >>> r.node, r.state, type(r.plain()).__name__
        ('1a2b3c4d', <JobState.FINISHED: 'finished'>, 'JobResult')

    Attributes:
        node: the short name of the node it ran on (``None``: it never started there).
        node_id: Ray's id of that node.
        address: that node's IP address.
        attempt: 1, then 2... when Ray retried it after its node died (0: the driver
            made this result: the task failed or was cancelled before it answered).
    """

    node: str | None = None
    node_id: str | None = None
    address: str | None = None
    attempt: int = 0

    @classmethod
    def on_node(cls, result: JobResult, *, node: str | None = None,
                node_id: str | None = None, address: str | None = None,
                attempt: int = 0) -> RayJobResult:
        """``result``, with where it ran."""
        return cls(**{f.name: getattr(result, f.name) for f in dataclasses.fields(JobResult)},
                   node=node, node_id=node_id, address=address, attempt=attempt)

    def plain(self) -> JobResult:
        """The :class:`JobResult` alone (what a :class:`ShareResult` lists)."""
        return JobResult(**{f.name: getattr(self, f.name)
                            for f in dataclasses.fields(JobResult)})


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
        return all(j.state == JobState.FINISHED for j in self.jobs)

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
        faster = f", {self.serial / self.makespan:.1f}× faster" if self.makespan > 0 \
            and not self.interrupted else ""
        lines = [f"memfit share: {format_count(len(self.jobs), 'job')} on {p.device}, budget "
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
            extra = f"; {format_count(j.restarts, 'restart')}" \
                if j.restarts else ""
            why = f"  {j.reason}" if j.reason else ""
            lines.append(f"  {j.name:<{width}}  {j.state:<11} {code:>4}  {peak:>9}  "
                         f"{format_size(j.share):>9}  {at:>6}  {took:>6}  {need} "
                         f"({j.need_source}{extra}){why}")
        what = "GPU memory (NVML)" if p.device.startswith("gpu") else "anonymous RSS"
        lines.append(f"  most in use at once: {format_size(self.max_in_use)} {what}; most "
                     f"charged: {format_size(self.max_charged)} of {format_size(p.budget)} "
                     f"(each job: need + {format_size(p.overhead)} overhead, "
                     f"{p.overhead_source}"
                     + (f"; + {format_size(SUPERVISOR_RSS)} for memfit run under --restart"
                        if any(j.restart for j in p.jobs) and p.device == "cpu" else "")
                     + ")")
        lines.append(f"  job output: {p.workdir / 'jobs'}/NAME/stdout.log, stderr.log; "
                     f"log: {self.log_path} (memfit report {p.workdir})")
        return "\n".join(lines)

