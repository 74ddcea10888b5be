"""How a shared job's run ends, decided in one place for one machine and for Ray.

The local scheduler (:mod:`memfit.share.runner`) and a job's Ray task
(:mod:`memfit.share.cluster_job`) both watch a job's tree and end it the same way:

- :func:`stop_over_share`: a job above its share gets its ``kill`` event and SIGKILL to
  its whole tree, or, supervised (``restart``), to its training process only, for
  ``memfit run`` to restart it from its checkpoint;
- :func:`decide`: the state it ended in and the reason, from why memfit stopped it (if
  it did), its exit code and what its ``memfit run`` said when it stopped;
- :func:`finish`: its ``restart`` and ``exit`` events in the share's log, its
  ``job.json`` record and its :class:`~memfit.share.share_results.JobResult`.

Example:
    >>> [f"{state}: {why}" for state, why in (decide(0, None, ""), decide(137, None, ""),
    ...                                       decide(3, None, ""))]
    ['finished: ', 'failed: killed by SIGKILL', 'failed: exit code 3']
    >>> decide(137, Stop.OVER_SHARE, over_share_reason(3 * 2**20, 2**20, on_gpu=False))
    (<JobState.STOPPED: 'stopped'>, 'anonymous RSS 3.0 MiB went above its share 1.0 MiB')
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from typing import Any

from memfit.exitcodes import signal_name
from memfit.memory.log import Event, MemoryLog
from memfit.memory.process import kill_tree
from memfit.share.layout import JobFiles, JobRecord
from memfit.share.planner import PlannedJob
from memfit.share.share_results import JobResult
from memfit.share.states import JobState, Stop
from memfit.sizes import format_size

__all__ = ["decide", "finish", "measured", "over_share_reason", "stop_over_share"]


def measured(on_gpu: bool) -> str:
    """What a share holds a job to: ``"NVML"`` (its GPU memory) or ``"anonymous RSS"``.

    Args:
        on_gpu: the share's device is a GPU.
    """
    return "NVML" if on_gpu else "anonymous RSS"


def over_share_reason(value: int, share: int, *, on_gpu: bool) -> str:
    """Why a job was stopped over its share, in words.

    Args:
        value: the memory sampled (bytes).
        share: its share (bytes).
        on_gpu: the share's device is a GPU.
    """
    return f"{measured(on_gpu)} {format_size(value)} went above its share {format_size(share)}"


def stop_over_share(proc: subprocess.Popen, job: PlannedJob, log: MemoryLog, value: int, *,
                    where: Mapping[str, Any], below: int = 0) -> bool:
    """Logs the ``kill`` event of a job above its share and kills it: its whole tree, or
    for a supervised job its training process only (``memfit run`` restarts it).

    Args:
        proc: the job's process.
        job: the planned job (its charge is its share).
        log: the share's log.
        value: the memory sampled above its share.
        where: the fields that place the job in the log (``job``; on Ray ``node`` and
            ``attempt``).
        below: levels under ``proc`` the supervised kill spares (1 on Ray: the tether's
            child is ``memfit run``).

    Returns:
        Whether the job itself is stopped (``False``: ``memfit run`` restarts it).
    """
    log.write(Event.KILL, pid=proc.pid, **where, reason=Stop.OVER_SHARE, value=value,
              share=job.charge)
    if job.restart:
        kill_tree(proc, include_self=False, below=below)
        return False
    kill_tree(proc)
    return True


def decide(code: int, stopped: Stop | None, reason: str,
           supervisor_stop: str = "") -> tuple[JobState, str]:
    """The state a job ended in, and why.

    Args:
        code: its exit code, as a shell reports it (128 + N: killed by signal N).
        stopped: why memfit stopped it, or ``None``.
        reason: the words of that stop.
        supervisor_stop: for a supervised job, why its ``memfit run`` stopped (``""``).
    """
    if stopped == Stop.OVER_SHARE:
        return JobState.STOPPED, reason
    if stopped == Stop.INTERRUPTED:
        return JobState.INTERRUPTED, reason or "interrupted"
    if code == 0:
        return JobState.FINISHED, ""
    return JobState.FAILED, supervisor_stop or (
        f"killed by {signal_name(code - 128)}" if code > 128 else f"exit code {code}")


def finish(job: PlannedJob, files: JobFiles, log: MemoryLog, *, device: str,
           where: Mapping[str, Any], pid: int | None, code: int, started: float,
           ended: float, stopped: Stop | None = None, reason: str = "",
           peak: int | None = None, host_peak: int | None = None,
           told: Mapping[str, Any] | None = None) -> JobResult:
    """A job has ended: logs its ``restart`` and ``exit`` events, writes its ``job.json``
    and returns its result.

    Args:
        job: the planned job.
        files: its files.
        log: the share's log.
        device: the plan's device.
        where: the fields that place the job in the log (see :func:`stop_over_share`).
        pid: the process started.
        code: its exit code.
        started: when it started (Unix time).
        ended: when it ended.
        stopped: why memfit stopped it, if it did; ``reason``: in words.
        peak: the largest memory sampled for its share; ``host_peak``: anonymous RSS.
        told: the ``exit`` event an earlier attempt already wrote (on Ray, after its node
            died): its state and reason stand, and nothing more is logged.
    """
    restarts, stop = files.supervisor_events(started) if job.restart else ([], "")
    state, reason = decide(code, stopped, reason, stop)
    if told is not None:
        state, reason = JobState(told.get("state", state)), str(told.get("reason", reason))
        reason = "" if reason == state else reason
    else:
        for r in restarts:
            log.write(Event.RESTART, pid=pid, t=r["t"], **where, reason=r.get("reason"))
        log.write(Event.EXIT, pid=pid, t=ended, **where, code=code, state=state,
                  reason=reason or state, peak=peak, duration=ended - started)
    files.write_record(JobRecord(
        name=job.name, command=job.command, device=device, exit_code=code, state=state,
        peak=peak, host_peak=host_peak, share=job.charge, need=job.need,
        need_source=job.need_source, duration=ended - started, restarts=len(restarts),
        t=ended))
    return JobResult.of(job, files, state=state, exit_code=code, reason=reason, peak=peak,
                        host_peak=host_peak, pid=pid, started=started, ended=ended,
                        restarts=len(restarts))
