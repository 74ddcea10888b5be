"""One job on a Ray node: started, sampled and held to its share where Ray placed it.

:func:`run_job` is the body of the Ray task that :mod:`memfit.share.cluster_driver`
submits for each job. On whichever node it lands it does what ``memfit share`` does on
one machine, for one job:

- starts the job as :mod:`memfit.share.launch` says (its command, under ``memfit run``
  with ``--max-rss``/``--hard-rss`` from its share when supervised; its environment;
  its output to ``WORKDIR/jobs/NAME/stdout.log`` and ``stderr.log``, appended to by a
  retry), tethered
  to the Ray worker (:mod:`memfit.share.cluster_tether`): should the worker die, the job
  gets SIGTERM, checkpoints and exits, and Ray retries the task on another node, where
  ``memfit.session`` resumes it from that checkpoint;
- samples its process tree every ``interval`` seconds with the one sampler
  (:class:`~memfit.memory.sampler.TreeSampler`) into the share's log, each ``sample``
  carrying ``job``, ``node``, ``share`` and ``attempt``;
- stops it (SIGKILL to the tree) when its memory (anonymous RSS; NVML on a GPU) is
  above its share at :data:`CONFIRM` samples in a row; a supervised job's training
  process only, for ``memfit run`` to restart it from its checkpoint. One sample is not
  enough: while a process starts a subprocess (``ctypes.util.find_library`` runs
  ``ldconfig``; CPython's ``subprocess`` uses ``vfork``), the child shows its parent's
  memory until it executes its program, and the tree's sum reads twice the job's memory
  for that instant;
- writes ``job_start``, ``kill``, ``restart`` and ``exit`` events (with ``node``) to the
  share's log and the job's ``job.json`` record, and returns what happened;
- runs a job once: the tether writes how the job ended to ``WORKDIR/jobs/NAME/exit.json``
  the instant it ends. Should the node die after that but before Ray heard of the end
  (the task's wait, its log lines, its reply to the driver), Ray retries the task; the
  retry finds the file, reports the end from it and the log (an ``exit`` event, unless
  the dead attempt wrote one) and does not start the job again, which would charge it a
  second time (and run again from scratch a job that keeps no checkpoint).

Ray's Ctrl-C (``ray.cancel``) reaches it as ``KeyboardInterrupt``: the job gets SIGTERM,
then SIGKILL after :data:`STOP_GRACE` seconds.

Example:
    >>> import ray                                              # doctest: +SKIP
    >>> task = ray.remote(run_job).options(memory=job.charge)   # doctest: +SKIP
    >>> ray.get(task.remote(job, "cpu", "runs/share", 0.5, time.time()))  # doctest: +SKIP
    RayJobResult(name='a', state=<JobState.FINISHED: 'finished'>, exit_code=0, ...)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from typing import Any

from memfit.memory.log import Event, LogError, MemoryLog, read_log
from memfit.memory.process import exit_code, kill_tree, start, ticks
from memfit.memory.sampler import TreeSampler
from memfit.quiet import quieted
from memfit.share.cluster_tether import tethered
from memfit.share.launch import CUDA_DEVICES_ENV, job_command, job_environment
from memfit.share.layout import JobFiles
from memfit.share.outcome import finish, over_share_reason, stop_over_share
from memfit.share.planner import PlannedJob
from memfit.share.share_results import JobResult, RayJobResult
from memfit.share.states import JobState, Stop
from memfit.workdir import Workdir

__all__ = ["run_job", "attempts", "STOP_GRACE", "CONFIRM"]

STOP_GRACE = 10.0           # seconds from SIGTERM to SIGKILL when the task is cancelled
CONFIRM = 2                 # samples in a row above its share before a job is stopped


def attempts(log_path: os.PathLike, name: str, since: float) -> int:
    """How many times job ``name`` was started in the share's log since ``since``.

    Args:
        log_path: the share's log.
        name: the job.
        since: the share's start (Unix time).
    """
    try:
        return sum(1 for r in read_log(log_path) if r["event"] == Event.JOB_START
                   and r.get("job") == name and r["t"] >= since)
    except (LogError, OSError):
        return 0


def _where() -> tuple[str, str]:
    """``(node id, node IP)`` of this Ray worker."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    return node_id, ray.util.get_node_ip_address()


def _peaks(records: list[dict], on_gpu: bool) -> tuple[int | None, int | None]:
    """``(peak, host peak)`` of an attempt's logged samples."""
    host = [r.get("rss_anon", r.get("rss")) for r in records]
    gpu = [r.get("nvml") for r in records]
    host_peak = max((v for v in host if isinstance(v, int)), default=None)
    gpu_peak = max((v for v in gpu if isinstance(v, int)), default=None)
    return (gpu_peak if on_gpu else host_peak), host_peak


def _ended_earlier(job: PlannedJob, device: str, files: JobFiles, log: MemoryLog,
                   since: float) -> RayJobResult | None:
    """What happened to a job an earlier attempt of this share ran to its end (its
    tether wrote ``exit.json``) on a node that died before Ray heard; ``None`` when no
    attempt of this share did."""
    try:
        status = json.loads(files.exit_status.read_text(encoding="utf-8"))
        code, ended = int(status["code"]), float(status["t"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if ended < since:
        return None             # an earlier share's: this one runs the job
    try:
        mine = [r for r in read_log(log.path) if r.get("job") == job.name and r["t"] >= since]
    except (LogError, OSError):
        mine = []
    starts = [r for r in mine if r["event"] == Event.JOB_START]
    start = starts[-1] if starts else {}
    attempt = start.get("attempt", 1)
    of_it = [r for r in mine if r.get("attempt") == attempt]
    exits = [r for r in of_it if r["event"] == Event.EXIT]
    over = [r for r in of_it if r["event"] == Event.KILL and r.get("reason") == Stop.OVER_SHARE]
    peak, host_peak = _peaks([r for r in of_it if r["event"] == Event.SAMPLE],
                             device.startswith("gpu"))
    stopped: Stop | None = None
    reason = ""
    if over and not job.restart:
        stopped = Stop.OVER_SHARE
        reason = (over_share_reason(int(over[-1].get("value", 0)), job.charge,
                                    on_gpu=device.startswith("gpu"))
                  + f" on node {start.get('node')}")
    where = {"job": job.name, "node": start.get("node"), "attempt": attempt}
    return _finish(job, device, files, log, where, start.get("pid"), code,
                   float(start.get("t", ended)), ended, stopped, reason, peak, host_peak,
                   start.get("node_id"), start.get("address"),
                   told=exits[-1] if exits else None)


def _finish(job: PlannedJob, device: str, files: JobFiles, log: MemoryLog,
            where: dict[str, Any], pid: int | None, code: int, started: float,
            ended: float, stopped: Stop | None, reason: str, peak: int | None,
            host_peak: int | None, node_id: str | None, address: str | None,
            told: dict | None = None) -> RayJobResult:
    """Logs the job's end (unless ``told``: the exit event an attempt already wrote),
    writes its ``job.json`` and returns its result, with where it ran."""
    result = finish(job, files, log, device=device, where=where, pid=pid, code=code,
                    started=started, ended=ended, stopped=stopped, reason=reason,
                    peak=peak, host_peak=host_peak, told=told)
    log.close()
    return RayJobResult.on_node(result, node=where["node"], node_id=node_id,
                                address=address, attempt=where["attempt"])


def run_job(job: PlannedJob, device: str, workdir: str, interval: float,
            since: float, quiet: bool = False) -> RayJobResult:
    """Runs one planned job on this node and holds it to its share (a Ray task's body).

    Args:
        job: the planned job (its charge is its share).
        device: the plan's device, ``"cpu"`` or ``"gpu:N"``.
        workdir: the share's workdir, on a path every node sees.
        interval: seconds between two samples of the job's tree.
        since: when the share started (attempts are counted from then).
        quiet: keep TensorFlow's start-up lines out of the job's ``stderr.log``, as
            ``memfit share`` does on one machine (:mod:`memfit.quiet`; off with
            ``--verbose``).

    Returns:
        What happened: a :class:`~memfit.share.share_results.RayJobResult` (its ``state`` is
        ``finished``, ``failed``, ``stopped`` or ``interrupted``), with the node it ran
        on and the attempt.
    """
    node_id, address = _where()
    node = node_id[:8]
    files = JobFiles.of(workdir, job.name).create()
    log = MemoryLog(Workdir(workdir).log, source="share", header=False)
    earlier = _ended_earlier(job, device, files, log, since)
    if earlier is not None:     # it ended on a node that died before Ray heard
        return earlier
    files.exit_status.unlink(missing_ok=True)       # an earlier share's
    attempt = attempts(log.path, job.name, since) + 1
    on_gpu = device.startswith("gpu")
    env = job_environment(job, device, files)
    if on_gpu:                  # the card(s) Ray gave this task, not the plan's index
        env[CUDA_DEVICES_ENV] = os.environ.get(CUDA_DEVICES_ENV, env[CUDA_DEVICES_ENV])
    command = tethered(job_command(job, device, files, interval=interval),
                       status=files.exit_status)
    where = {"job": job.name, "node": node, "attempt": attempt}
    started = time.time()
    try:
        mode = "wb" if attempt == 1 else "ab"      # a retry keeps what the first said
        with open(files.stdout, mode) as out, open(files.stderr, mode) as err, \
                quieted(quiet):
            proc = start(command, env, stdout=out, stderr=err)
    except Exception as e:      # noqa: BLE001 - a job that cannot start fails alone
        code = getattr(e, "exit_code", 126)
        log.write(Event.EXIT, code=code, state=JobState.FAILED, reason=str(e), **where)
        log.close()
        return RayJobResult.on_node(
            JobResult.of(job, files, state=JobState.FAILED, exit_code=code, reason=str(e),
                         started=started, ended=time.time()),
            node=node, node_id=node_id, address=address, attempt=attempt)
    log.write(Event.JOB_START, pid=proc.pid, command=list(job.command), share=job.charge,
              need=job.need, need_source=job.need_source, supervised=job.restart,
              node_id=node_id, address=address, **where)
    sampler = TreeSampler(proc.pid, log=log, gpu=on_gpu, share=job.charge, **where)
    stopped: Stop | None = None
    reason = ""
    over = 0                    # samples in a row above its share
    try:
        for _ in ticks(proc, interval):
            s = sampler.take()
            value = sampler.gpu_now if on_gpu else None if s is None else s.anon_or_total
            over = over + 1 if value is not None and value > job.charge else 0
            if value is None or over < CONFIRM or stopped:
                continue
            over = 0
            # supervised: the training below memfit run (the tether's child) dies;
            # memfit run lives on and restarts it
            if stop_over_share(proc, job, log, value, where=where, below=1):
                stopped = Stop.OVER_SHARE
                reason = over_share_reason(value, job.charge, on_gpu=on_gpu) + \
                    f" on node {node}"
    except KeyboardInterrupt:   # ray.cancel: SIGTERM (the job checkpoints), then SIGKILL
        stopped, reason = Stop.INTERRUPTED, "cancelled"
        kill_tree(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_GRACE)
    ended = time.time()
    code = exit_code(proc.returncode if proc.returncode is not None else -signal.SIGKILL)
    host_peak = None if sampler.peak is None else sampler.peak.anon_or_total
    peak = sampler.gpu_peak if on_gpu else host_peak
    return _finish(job, device, files, log, where, proc.pid, code, started, ended, stopped,
                   reason, peak, host_peak, node_id, address)
