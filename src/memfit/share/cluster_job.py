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
  share's log and the job's ``job.json`` record, and returns what happened.

Ray's Ctrl-C (``ray.cancel``) reaches it as ``KeyboardInterrupt``: the job gets SIGTERM,
then SIGKILL after :data:`STOP_GRACE` seconds.

Example:
    >>> import ray                                              # doctest: +SKIP
    >>> task = ray.remote(run_job).options(memory=job.charge)   # doctest: +SKIP
    >>> ray.get(task.remote(job, "cpu", "runs/share", 0.5, time.time()))  # doctest: +SKIP
    {'name': 'a', 'state': 'finished', 'exit_code': 0, 'node': '1a2b3c4d', ...}
"""

from __future__ import annotations

import contextlib
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
from memfit.share.layout import JobFiles, JobRecord
from memfit.share.planner import PlannedJob
from memfit.sizes import format_size
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


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return f"signal {code - 128}"


def run_job(job: PlannedJob, device: str, workdir: str, interval: float,
            since: float, quiet: bool = False) -> dict[str, Any]:
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
        What happened, as a JSON object: ``name``, ``state`` (``finished``, ``failed``,
        ``stopped``, ``interrupted``), ``exit_code``, ``reason``, ``peak``, ``host_peak``,
        ``pid``, ``started``, ``ended``, ``restarts``, ``node``, ``node_id``, ``address``,
        ``attempt``.
    """
    node_id, address = _where()
    node = node_id[:8]
    files = JobFiles.of(workdir, job.name).create()
    log = MemoryLog(Workdir(workdir).log, source="share", header=False)
    attempt = attempts(log.path, job.name, since) + 1
    on_gpu = device.startswith("gpu")
    env = job_environment(job, device, files)
    if on_gpu:                  # the card(s) Ray gave this task, not the plan's index
        env[CUDA_DEVICES_ENV] = os.environ.get(CUDA_DEVICES_ENV, env[CUDA_DEVICES_ENV])
    command = tethered(job_command(job, device, files, interval=interval))
    where = {"job": job.name, "node": node, "attempt": attempt}
    started = time.time()
    try:
        mode = "wb" if attempt == 1 else "ab"      # a retry keeps what the first said
        with open(files.stdout, mode) as out, open(files.stderr, mode) as err, \
                quieted(quiet):
            proc = start(command, env, stdout=out, stderr=err)
    except Exception as e:      # noqa: BLE001 - a job that cannot start fails alone
        code = getattr(e, "exit_code", 126)
        log.write(Event.EXIT, code=code, state="failed", reason=str(e), **where)
        log.close()
        return {"name": job.name, "state": "failed", "exit_code": code, "reason": str(e),
                "peak": None, "host_peak": None, "pid": None, "started": started,
                "ended": time.time(), "restarts": 0, "node": node, "node_id": node_id,
                "address": address, "attempt": attempt}
    log.write(Event.JOB_START, pid=proc.pid, command=list(job.command), share=job.charge,
              need=job.need, need_source=job.need_source, supervised=job.restart,
              node_id=node_id, address=address, **where)
    sampler = TreeSampler(proc.pid, log=log, gpu=on_gpu, share=job.charge, **where)
    stopped, reason = None, ""
    over = 0                    # samples in a row above its share
    try:
        for _ in ticks(proc, interval):
            s = sampler.take()
            value = sampler.gpu_now if on_gpu else None if s is None else s.anon_or_total
            over = over + 1 if value is not None and value > job.charge else 0
            if value is None or over < CONFIRM or stopped:
                continue
            over = 0
            what = "NVML" if on_gpu else "anonymous RSS"
            log.write(Event.KILL, pid=proc.pid, reason="over-share", value=value,
                      share=job.charge, **where)
            if job.restart:
                # the training below memfit run (the tether's child) dies; memfit
                # run lives on and restarts it
                kill_tree(proc, include_self=False, below=1)
                continue
            kill_tree(proc)
            stopped = "over-share"
            reason = (f"{what} {format_size(value)} went above its share "
                      f"{format_size(job.charge)} on node {node}")
    except KeyboardInterrupt:   # ray.cancel: SIGTERM (the job checkpoints), then SIGKILL
        stopped, reason = "interrupted", "cancelled"
        kill_tree(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_GRACE)
    ended = time.time()
    code = exit_code(proc.returncode if proc.returncode is not None else -signal.SIGKILL)
    restarts, stop = files.supervisor_events(started) if job.restart else ([], "")
    for r in restarts:
        log.write(Event.RESTART, pid=proc.pid, t=r["t"], reason=r.get("reason"), **where)
    if stopped == "over-share":
        state = "stopped"
    elif stopped == "interrupted":
        state = "interrupted"
    elif code == 0:
        state = "finished"
    else:
        state = "failed"
        reason = stop or (f"killed by {_signal_name(code)}" if code > 128
                          else f"exit code {code}")
    host_peak = None if sampler.peak is None else sampler.peak.anon_or_total
    peak = sampler.gpu_peak if on_gpu else host_peak
    log.write(Event.EXIT, pid=proc.pid, code=code, state=state, reason=reason or state,
              peak=peak, duration=ended - started, **where)
    log.close()
    files.write_record(JobRecord(
        name=job.name, command=job.command, device=device, exit_code=code, state=state,
        peak=peak, host_peak=host_peak, share=job.charge, need=job.need,
        need_source=job.need_source, duration=ended - started, restarts=len(restarts),
        t=ended))
    return {"name": job.name, "state": state, "exit_code": code, "reason": reason,
            "peak": peak, "host_peak": host_peak, "pid": proc.pid, "started": started,
            "ended": ended, "restarts": len(restarts), "node": node, "node_id": node_id,
            "address": address, "attempt": attempt}

