"""The states a shared job goes through, and why memfit stopped one: one name each.

A job of ``memfit share`` is ``queued`` (one machine) or ``waiting`` (on Ray, not placed
yet), then ``running``, then ends ``finished``, ``failed``, ``stopped`` or
``interrupted``; a job a signal kept from starting is ``not started``. The share's log,
``job.json`` and the summary table carry these strings; write and compare the members,
never the bare strings (a ``StrEnum`` member equals its string, so files written before
read the same).

Example:
    >>> JobState.FINISHED == "finished", f"{JobState.NOT_STARTED}", Stop("over-share")
    (True, 'not started', <Stop.OVER_SHARE: 'over-share'>)
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["JobState", "Stop"]


class JobState(StrEnum):
    """Where a job is, or how it ended (:attr:`memfit.share.share_results.JobResult.state`)."""

    QUEUED = "queued"               # one machine: waiting for room in the budget
    WAITING = "waiting"             # on Ray: not placed on a node yet
    RUNNING = "running"
    FINISHED = "finished"           # exit code 0
    FAILED = "failed"               # another exit code, or it could not start
    STOPPED = "stopped"             # killed for going above its share
    INTERRUPTED = "interrupted"     # Ctrl-C / SIGTERM (on Ray: its task was cancelled)
    NOT_STARTED = "not started"     # a signal came before it started


class Stop(StrEnum):
    """Why memfit stopped a running job: the ``reason`` of its ``kill`` event
    (``over-share``) and what its outcome is decided from."""

    OVER_SHARE = "over-share"       # its memory went above its share
    INTERRUPTED = "interrupted"     # memfit share got Ctrl-C / SIGTERM, or Ray cancelled it
