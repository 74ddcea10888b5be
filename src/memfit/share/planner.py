"""Planning a share: every job's need resolved, its charge on the budget, all checked up front.

A job is charged **its need plus the per-process overhead** of the device:

- the need is given (``need = "1GiB"``), estimated (``need = "auto"``: memfit's
  estimator, in a child process, for ``model`` at ``batch_size``: the estimate's
  ``model_bytes``, without the framework baseline), or learned from the peak this job
  (same name, same command, exit 0) reached in a previous run in the same workdir,
  plus 10 %. A job with none of these runs alone (charged the whole budget), and its
  peak is learned for the next run;
- the overhead is what every training process holds before it has a model: on the CPU
  the anonymous RSS of a process with TensorFlow started; on a GPU the device memory
  beyond the cap (CUDA context, cuDNN/cuBLAS). Both are measured by ``memfit
  calibrate`` (``--device gpu:0``) and cached; the first plan on a machine with nothing
  cached measures it once, as the first estimate does (a GPU this machine does not have
  gets the default); ``overhead=`` overrides it (e.g. for jobs that are not TensorFlow
  processes);
- a job supervised by ``memfit run`` (``restart``) is also charged the supervisor's own
  memory (:data:`SUPERVISOR_RSS`) on the CPU.

Nothing starts until every job is resolved and fits: a job charged more than the whole
budget, a bad size, an unknown key, a command that does not exist... are reported
together, before any job runs.

Example:
    >>> p = plan([{"name": "a", "command": ["python", "-c", "pass"], "need": "100MiB"}],
    ...          budget="1GiB", device="cpu", overhead="20MiB")
    >>> p.jobs[0].charge == 120 * 2**20
    True
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memfit.errors import FrameworkMissingError, MemfitError
from memfit.estimate.baseline import check_device, ensure_calibration, framework_baseline
from memfit.memory.log import LogError, check_log
from memfit.memory.probe import nvml_devices, system_memory
from memfit.share.jobs import (
    Job,
    JobsFileError,
    JobsSpec,
    format_problems,
    load_jobs,
    parse_jobs,
)
from memfit.share.layout import DEFAULT_WORKDIR, JobFiles
from memfit.sizes import format_count, format_size, parse_size
from memfit.workdir import Workdir

__all__ = ["Plan", "PlannedJob", "plan", "pick", "SUPERVISOR_RSS", "LEARN_MARGIN",
           "gpu_memory"]

# `python -m memfit run` itself: 22 MiB anonymous RSS measured on this machine (x86-64,
# Python 3.11), rounded up.
SUPERVISOR_RSS = 32 * 2**20
LEARN_MARGIN = 0.10               # a learned need is the previous peak + 10 %
_ESTIMATE_TIMEOUT = 600.0


@dataclasses.dataclass(frozen=True)
class PlannedJob:
    """A job with its need resolved and its charge on the budget.

    Attributes:
        name: the job's name.
        command: what runs (for a supervised job: the user's command; ``memfit run`` is
            put in front when it starts).
        need: bytes above the overhead; ``None`` for a job run alone to learn it.
        need_source: ``"given"``, ``"auto"``, ``"learned"`` or ``"unknown"`` (run alone).
        note: where the need came from, in words.
        charge: what the job holds on the budget: need + overhead (+ the supervisor);
            the whole budget for a job run alone. Its memory may not exceed this: it is
            the job's share.
        exclusive: it runs alone (its need is unknown).
        restart: supervised by ``memfit run`` (restarted when over its share).
        env: extra environment variables from the jobs file.
        index: its position in the jobs file.
    """

    name: str
    command: tuple[str, ...]
    need: int | None
    need_source: str
    note: str
    charge: int
    exclusive: bool
    restart: bool
    env: Mapping[str, str]
    index: int


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything :func:`memfit.share` will do, checked.

    Attributes:
        jobs: the jobs in the order they are considered (charge, largest first; file
            order among equals): first-fit decreasing.
        budget: bytes all running jobs together may hold (host RAM on the CPU, device
            memory on a GPU).
        budget_source: where the budget came from.
        device: ``"cpu"`` or ``"gpu:N"``.
        overhead: the per-process overhead charged to every job, in bytes.
        overhead_source: ``"given"``, ``"calibrated"`` or ``"default"`` (not calibrated).
        workdir: the shared workdir.
        source: the jobs file (or ``"<jobs>"``).
        warnings: things worth knowing that do not stop the run.
    """

    jobs: tuple[PlannedJob, ...]
    budget: int
    budget_source: str
    device: str
    overhead: int
    overhead_source: str
    workdir: Path
    source: str
    warnings: tuple[str, ...] = ()

    def first_wave(self) -> list[PlannedJob]:
        """The jobs that start at once (first-fit decreasing on the empty budget)."""
        return pick(self.jobs, self.budget)

    def __str__(self) -> str:
        lines = [f"memfit share: {format_count(len(self.jobs), 'job')} "
                 f"from {self.source} on {self.device}, budget {format_size(self.budget)} "
                 f"({self.budget_source}), per-process overhead {format_size(self.overhead)} "
                 f"({self.overhead_source})"]
        width = max([4] + [len(j.name) for j in self.jobs])
        lines.append(f"  {'job':<{width}}  {'need':>10}  {'charge':>10}  from")
        for j in self.jobs:
            need = "alone" if j.need is None else format_size(j.need)
            extra = ", supervised by memfit run" if j.restart else ""
            lines.append(f"  {j.name:<{width}}  {need:>10}  {format_size(j.charge):>10}  "
                         f"{j.note}{extra}")
        wave = self.first_wave()
        left = len(self.jobs) - len(wave)
        rest = "; the rest queue" if left > 1 else "; the other queues" if left else ""
        lines.append(f"  starting {'together' if len(wave) > 1 else 'first'}: "
                     f"{', '.join(j.name for j in wave)} "
                     f"({format_size(sum(j.charge for j in wave))} of "
                     f"{format_size(self.budget)}){rest}")
        lines += [f"  note: {w}" for w in self.warnings]
        return "\n".join(lines)


def pick(queue: Sequence[PlannedJob], free: int) -> list[PlannedJob]:
    """First-fit decreasing: the jobs of ``queue`` to start now in ``free`` bytes.

    ``queue`` is taken largest charge first (as :func:`plan` orders it); each job that
    fits in what is left is taken.

    Example:
        >>> jobs = [PlannedJob(n, (), c, "given", "", c, False, False, {}, i)
        ...         for i, (n, c) in enumerate([("a", 6), ("b", 5), ("c", 3)])]
        >>> [j.name for j in pick(jobs, 9)]
        ['a', 'c']
    """
    chosen = []
    for job in sorted(queue, key=lambda j: (-j.charge, j.index)):
        if job.charge <= free:
            chosen.append(job)
            free -= job.charge
    return chosen


def gpu_memory(index: int) -> tuple[int, int] | None:
    """``(total, free)`` bytes of GPU ``index`` from NVML, or ``None`` without one."""
    devices = nvml_devices() or []
    if index >= len(devices):
        return None
    return devices[index]["total"], devices[index]["free"]


def _default_device() -> str:
    return "gpu:0" if gpu_memory(0) is not None else "cpu"


def _budget(value: Any, device: str) -> tuple[int, str]:
    if value is not None:
        budget = parse_size(value, name="budget", memory=True)
        if budget <= 0:
            raise JobsFileError(f"budget must be more than 0 bytes. Received: budget={value!r}")
        return budget, "given"
    if device == "cpu":
        return system_memory()[1], "memory available now"
    memory = gpu_memory(int(device.split(":")[1]))
    if memory is None:
        raise JobsFileError(f"No GPU {device} is visible (NVML reports none): give --budget "
                            f"and --device cpu to share this machine's memory instead. "
                            f"Received: device={device!r}")
    return memory[1], f"free memory of {device} now"


def _overhead(value: Any, device: str) -> tuple[int, str]:
    if value is not None:
        return parse_size(value, name="overhead"), "given"
    # Measured once when nothing is cached, as the first estimate does: the default is
    # below this machine's baseline where JAX sits beside TensorFlow (263 against 220 MiB),
    # and a stranger's examples/jobs.toml had two of its jobs stopped for that difference.
    here = device == "cpu" or gpu_memory(int(device.split(":")[1])) is not None
    try:
        baseline, source = ensure_calibration(device) if here else framework_baseline(device)
    except FrameworkMissingError:   # no framework here to measure: jobs of any command
        baseline, source = framework_baseline(device)
    if source == "default":
        source = f"default: run memfit calibrate{' --device ' + device if device != 'cpu' else ''}"
    return baseline, source


_estimates: dict[tuple, tuple[int | None, str]] = {}


def _estimate_need(job: Job, device: str) -> tuple[int | None, str]:
    """The estimator's ``model_bytes`` for the job's model and batch, in a child process
    (this process never imports TensorFlow). ``(None, why)`` when it cannot estimate."""
    from memfit.estimate.measure import run_child
    from memfit.estimate.model import EstimateError, ModelSpec, parse_input_shape

    a = job.auto
    try:
        shapes = parse_input_shape(a.get("input_shape"))
    except EstimateError as e:
        return None, str(e)
    key = (a["model"], a["batch_size"], a.get("optimizer"), a.get("dtype_policy"), shapes,
           device)
    if key not in _estimates:
        request = {"mode": "estimate", "model": ModelSpec(a["model"], shapes).to_json(),
                   "batch_size": a["batch_size"], "optimizer": a.get("optimizer"),
                   "dtype_policy": a.get("dtype_policy"), "device": device}
        r = run_child(request, timeout=_ESTIMATE_TIMEOUT)
        if r.status == "ok" and isinstance(r.report.get("model_bytes_high"), int):
            _estimates[key] = (r.report["model_bytes_high"],   # the range's high end
                               f"auto: estimate of {a['model']} at batch {a['batch_size']}")
        else:
            _estimates[key] = (None, f"cannot estimate {a['model']!r} at batch size "
                                     f"{a['batch_size']} ({r.status}): {r.message.strip()}")
    return _estimates[key]


def _learned(workdir: Path, job: Job, device: str, overhead: int) -> tuple[int | None, str]:
    """The need learned from the job's record of its previous run, or ``(None, why)``."""
    files = JobFiles.of(workdir, job.name)
    record = files.read_record()
    if record is None:
        return None, "unknown: no previous run in the workdir; runs alone, and is learned"
    if record.peak is None:
        return None, f"unknown: {files.record} holds no peak; runs alone, and is learned"
    if record.device != device or record.command != job.command:
        return None, ("unknown: the previous run had another command or device; runs alone, "
                      "and is learned")
    if record.exit_code != 0:
        return None, (f"unknown: the previous run did not finish (exit "
                      f"{record.exit_code}); runs alone, and is learned")
    need = max(0, math.ceil(record.peak * (1 + LEARN_MARGIN)) - overhead)
    return need, f"learned: peak {format_size(record.peak)} in the previous run, + 10 %"


def _check_workdir(workdir: Path) -> None:
    if workdir.exists() and not workdir.is_dir():
        raise MemfitError(f"The workdir {str(workdir)!r} is a file, not a directory. Choose "
                          f"a directory path.")
    try:
        check_log(Workdir(workdir).log)
    except LogError as e:
        raise MemfitError(f"{e} Choose another workdir for memfit share.") from None


def plan(jobs: str | os.PathLike | JobsSpec | Sequence[Mapping[str, Any]], *,
         budget: str | int | None = None, device: str | None = None,
         overhead: str | int | None = None, workdir: str | os.PathLike = DEFAULT_WORKDIR,
         restart: bool = False) -> Plan:
    """Reads and checks the jobs and resolves every need and charge; starts nothing.

    Example:
        >>> p = plan("examples/jobs.toml", budget="2GiB")       # doctest: +SKIP
        >>> print(p)                                            # doctest: +SKIP

    Args:
        jobs: a jobs file (TOML), a :class:`JobsSpec`, or a list of job dicts with the
            keys of a ``[[job]]`` table.
        budget: bytes all running jobs together may hold (``"12GiB"``); default: the
            file's ``budget``, else the memory available now (CPU) or the GPU's free
            memory.
        device: ``"cpu"`` or ``"gpu:N"``; default: the file's, else ``gpu:0`` when NVML
            sees a GPU, else ``cpu``.
        overhead: the per-process overhead charged to every job; default: the file's,
            else the calibrated framework baseline of the device (``memfit calibrate``).
        workdir: the shared workdir (previous runs' peaks are learned from it).
        restart: supervise every job with ``memfit run`` (a job's ``restart`` key wins).

    Raises:
        JobsFileError: listing every problem with the jobs (nothing has started).
        MemfitError: for a workdir that is a file or holds a log that is not memfit's.
    """
    spec = jobs if isinstance(jobs, JobsSpec) else (
        load_jobs(jobs) if isinstance(jobs, str | os.PathLike) else parse_jobs(jobs))
    target = _target(spec, budget, device, overhead, Path(workdir), restart)
    problems: list[str] = []
    warnings = _target_warnings(target)
    from memfit.estimate.measure import warm_children

    # Two jobs or more whose need is estimated: their estimating children are forked from
    # one parent that imported the frameworks once, not one import each.
    with warm_children(sum(job.need_source == "auto" for job in spec.jobs) > 1):
        planned = [p for p in (_plan_job(job, target, problems, warnings)
                               for job in spec.jobs) if p is not None]
    if problems:
        raise JobsFileError(format_problems(spec.source, problems), problems)
    planned.sort(key=lambda j: (-j.charge, j.index))
    return Plan(jobs=tuple(planned), budget=target.budget, budget_source=target.budget_source,
                device=target.device, overhead=target.overhead,
                overhead_source=target.overhead_source, workdir=target.workdir,
                source=spec.source, warnings=tuple(warnings))


@dataclasses.dataclass(frozen=True)
class _Target:
    """Where the jobs of a plan run: the device, its budget and overhead, the workdir."""

    device: str
    budget: int
    budget_source: str
    overhead: int
    overhead_source: str
    workdir: Path
    restart: bool

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("gpu")


def _target(spec: JobsSpec, budget: Any, device: Any, overhead: Any, workdir: Path,
            restart: bool) -> _Target:
    """The device, budget and overhead (the arguments win over the file's), checked, and
    the workdir, checked."""
    def checked(given: Any, in_file: Any, check: Any) -> Any:
        # A value the file gave is the file's problem; one the caller gave (--budget lots)
        # is the caller's: a stranger read "jobs.toml: budget is not a size" for his option.
        try:
            return check(given if given is not None else in_file)
        except (ValueError, MemfitError) as e:
            if given is None and in_file is not None:
                raise JobsFileError(f"{spec.source}: {e}") from None
            raise

    device = checked(device, spec.device,
                     lambda d: check_device(d if d is not None else _default_device()))
    budget_bytes, budget_source = checked(budget, spec.budget, lambda b: _budget(b, device))
    overhead_bytes, overhead_source = checked(overhead, spec.overhead,
                                              lambda o: _overhead(o, device))
    if budget is None and spec.budget is not None:
        budget_source = f"from {spec.source}"
    _check_workdir(workdir)
    return _Target(device=device, budget=budget_bytes, budget_source=budget_source,
                   overhead=overhead_bytes, overhead_source=overhead_source,
                   workdir=workdir, restart=restart)


def _target_warnings(target: _Target) -> list[str]:
    memory = gpu_memory(int(target.device.split(":")[1])) if target.on_gpu else None
    if target.on_gpu and memory is None:
        # a plan for another machine may be read here; running it here is refused (runner)
        return [f"no GPU {target.device.split(':')[1]} is visible here (NVML finds no such "
                f"card): memfit share would refuse to run these jobs on this machine; run "
                f"them where the card is, or give --device cpu"]
    if memory is None or target.overhead < memory[0] // 2:
        return []
    return [f"the per-process overhead {format_size(target.overhead)} "
            f"({target.overhead_source}) is half the GPU or more: it looks like TensorFlow's "
            f"whole reservation, not the memory above a cap; give overhead= "
            f"(benchmarks/share_gpu.py measures it)"]


def _need(job: Job, target: _Target, problems: list[str]) -> tuple[bool, int | None, str]:
    """``(ok, need, where it came from)``: given, estimated or learned; not ok (with a
    problem added) when it cannot be used."""
    need, note = job.need, "given"
    if job.need_source == "auto":
        need, note = _estimate_need(job, target.device)
        if need is None:
            problems.append(f"job {job.index} ({job.name!r}): need = 'auto': "
                            f"{note.rstrip('.')}. "
                            f"Give the need as a size instead, such as need = '2GiB'.")
            return False, None, note
    elif job.need_source == "learned":
        need, note = _learned(target.workdir, job, target.device, target.overhead)
    if target.on_gpu and need is not None and need < 2**20:
        problems.append(f"job {job.index} ({job.name!r}): on a GPU the need is the job's "
                        f"memory cap, at least 1 MiB. Received: need={job.written_need!r}")
        return False, None, note
    return True, need, note


def _plan_job(job: Job, target: _Target, problems: list[str],
              warnings: list[str]) -> PlannedJob | None:
    """The job with its need and charge, or ``None`` (with a problem added)."""
    ok, need, note = _need(job, target, problems)
    if not ok:
        return None
    supervised = target.restart if job.restart is None else job.restart
    extra = SUPERVISOR_RSS if supervised and not target.on_gpu else 0
    charge = target.budget if need is None else need + target.overhead + extra
    if charge > target.budget:
        parts = f"need {format_size(need)} + overhead {format_size(target.overhead)}"
        if extra:
            parts += f" + memfit run {format_size(extra)}"
        problems.append(f"job {job.index} ({job.name!r}): {parts} = {format_size(charge)} is "
                        f"more than the whole budget {format_size(target.budget)}: it could "
                        f"never start. Lower its need, or raise the budget. Received: need="
                        f"{job.written_need!r}")
        return None
    if need is None:
        warnings.append(f"{job.name}: no need given and none learned yet: it runs alone "
                        f"(charged the whole budget); its peak is learned for the next run "
                        f"in {target.workdir}")
    else:
        previous = _previous_peak(target.workdir, job)
        if previous is not None and previous > charge:
            warnings.append(f"{job.name}: peaked at {format_size(previous)} in the previous "
                            f"run, above its share {format_size(charge)} now: it will likely "
                            f"be stopped")
    return PlannedJob(name=job.name, command=job.command, need=need,
                      need_source="unknown" if need is None else job.need_source, note=note,
                      charge=charge, exclusive=need is None, restart=bool(supervised),
                      env=job.env, index=job.index)


def _previous_peak(workdir: Path, job: Job) -> int | None:
    """The job's peak in its previous run, when it ran the same command."""
    record = JobFiles.of(workdir, job.name).read_record()
    return record.peak if record is not None and record.command == job.command else None
