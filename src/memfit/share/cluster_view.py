"""The one view of a share on a Ray cluster, read from the share's log as the jobs write it.

Every job writes its ``job_start``, ``sample``, ``kill`` and ``exit`` events, each with
its ``job`` and ``node``, to the share's log (:mod:`memfit.share.cluster_job`); the
driver writes the ``start`` event listing the nodes. :class:`ClusterView` follows the
log (new complete lines only) and keeps, per job, its node, attempt, state, memory now
and peak; per node, the memory its jobs hold together (the sum of each job's latest
sample) and the most they held at once. :meth:`ClusterView.rows` feeds the live table of
:class:`memfit.share.status.Status`; :meth:`ClusterView.feed` returns the lines worth
printing (a job started, retried on another node, stopped, ended).

Example:
    >>> view = ClusterView()
    >>> view.feed([{"t": 1.0, "pid": 1, "event": "start", "source": "share", "ray": "local",
    ...             "device": "cpu", "nodes": [{"name": "n1", "memory": 1000}],
    ...             "jobs": [{"name": "a", "share": 600}]}])
    ['1 job on Ray (local), 1 node: n1 (1000 B)']
    >>> view.feed([{"t": 2.0, "pid": 7, "event": "job_start", "job": "a", "node": "n1",
    ...             "attempt": 1, "share": 600}])
    ['started a on node n1 (pid 7, share 600 B)']
    >>> _ = view.feed([{"t": 2.5, "pid": 7, "event": "sample", "job": "a", "node": "n1",
    ...                 "rss_anon": 400, "rss": 500}])
    >>> view.node_peak["n1"], view.jobs["a"].peak
    (400, 400)
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from memfit.memory.log import Event
from memfit.share.states import JobState, Stop
from memfit.share.status import Row
from memfit.sizes import format_count, format_size

__all__ = ["ClusterView", "JobView", "LogFollower"]


class LogFollower:
    """Reads the complete lines appended to a JSON-lines log since the last read.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "memory.jsonl"
        >>> follow = LogFollower(path)
        >>> _ = path.write_text('{"t": 1, "pid": 1, "event": "x"}\\n{"t": 2')
        >>> [r["t"] for r in follow.read()]
        [1]

    Args:
        path: the log (it may not exist yet).
        offset: where to start reading (bytes; e.g. the size before a run appends).
    """

    def __init__(self, path: str | os.PathLike, offset: int = 0):
        self.path = Path(path)
        self.offset = offset

    def read(self) -> list[dict]:
        """The records of the lines completed since the last call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        records = []
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "event" in record:
                records.append(record)
        return records


@dataclasses.dataclass
class JobView:
    """One job as the log tells it so far.

    Attributes:
        name: the job.
        share: its charge (bytes).
        state: ``"waiting"`` (not placed yet), ``"running"``, then the state its task
            ended in (``finished``, ``failed``, ``stopped``, ``interrupted``).
        node: the node it runs (or last ran) on.
        attempt: 1, then 2... when Ray retried it after its node died.
        nodes: every node it ran on, in order.
        now: its memory at its last sample; ``peak``: the largest.
        started / ended: Unix times of its last attempt.
    """

    name: str
    share: int = 0
    state: str = JobState.WAITING
    node: str | None = None
    attempt: int = 0
    nodes: list[str] = dataclasses.field(default_factory=list)
    now: int | None = None
    peak: int | None = None
    started: float | None = None
    ended: float | None = None


class ClusterView:
    """Jobs and nodes of one share on Ray, from its log's records (:meth:`feed`).

    Attributes:
        jobs: :class:`JobView` by job name.
        node_memory: each node's memory (``memory`` of the ``start`` event's nodes).
        node_peak: the most memory a node's jobs held together, at any sample.
        max_in_use: the most all jobs held together; ``max_charged``: the most charged.
        device: the plan's device (``cpu``: samples are anonymous RSS; else NVML).
    """

    def __init__(self) -> None:
        self.jobs: dict[str, JobView] = {}
        self.node_memory: dict[str, int] = {}
        self.node_peak: dict[str, int] = {}
        self.max_in_use = 0
        self.max_charged = 0
        self.device = "cpu"
        self.started = time.time()
        self._latest: dict[str, dict[str, int]] = {}      # node -> job -> memory now

    def _value(self, record: dict) -> int | None:
        key = ("rss_anon", "rss") if self.device == "cpu" else ("nvml",)
        for k in key:
            v = record.get(k)
            if isinstance(v, int | float) and not isinstance(v, bool):
                return int(v)
        return None

    def _job(self, name: str) -> JobView:
        return self.jobs.setdefault(name, JobView(name))

    def _leave(self, job: JobView) -> None:
        if job.node is not None:
            self._latest.get(job.node, {}).pop(job.name, None)

    def feed(self, records: Iterable[dict]) -> list[str]:
        """Takes new log records in; returns the lines worth telling the user."""
        told = []
        for r in records:
            event, name = r.get("event"), r.get("job")
            if event == Event.START and r.get("source") == "share" and "nodes" in r:
                self.device = str(r.get("device", "cpu"))
                self.started = float(r["t"])
                self.node_memory = {n["name"]: int(n["memory"]) for n in r["nodes"]}
                for j in r.get("jobs", []):
                    self._job(j["name"]).share = int(j["share"])
                count = len(self.node_memory)
                told.append(f"{format_count(len(self.jobs), 'job')} on Ray "
                            f"({r.get('ray', '?')}), {format_count(count, 'node')}: " + ", ".join(
                                f"{n} ({format_size(m)})" for n, m in self.node_memory.items()))
            elif event == Event.JOB_START and name:
                job = self._job(name)
                self._leave(job)
                job.state, job.node, job.attempt = JobState.RUNNING, r.get("node"), \
                    r.get("attempt", 1)
                job.nodes.append(str(job.node))
                job.share = int(r.get("share", job.share))
                job.started, job.ended, job.now = float(r["t"]), None, None
                self.max_charged = max(self.max_charged, sum(
                    j.share for j in self.jobs.values() if j.state == JobState.RUNNING))
                again = f", attempt {job.attempt}: its last node died" \
                    if job.attempt > 1 else ""
                told.append(f"started {name} on node {job.node} (pid {r['pid']}, share "
                            f"{format_size(job.share)}{again})")
            elif event == Event.SAMPLE and name and r.get("node"):
                self._sample(self._job(name), str(r["node"]), r)
            elif event == Event.KILL and name and r.get("reason") == Stop.OVER_SHARE:
                told.append(f"{name}: {format_size(int(r.get('value', 0)))} is above its "
                            f"share {format_size(self._job(name).share)} on node "
                            f"{r.get('node')}: stopped")
            elif event == Event.EXIT and name:
                job = self._job(name)
                self._leave(job)
                job.state = str(r.get("state", JobState.FAILED))
                job.ended, job.now = float(r["t"]), None
                took = "" if job.started is None else f" after {job.ended - job.started:.1f} s"
                why = r.get("reason")
                told.append(f"{name} {job.state} on node {r.get('node')}{took}, peak "
                            f"{'-' if job.peak is None else format_size(job.peak)}"
                            + (f" ({why})" if why and why != job.state else ""))
        return told

    def _sample(self, job: JobView, node: str, record: dict) -> None:
        value = self._value(record)
        if value is None or job.state != JobState.RUNNING or job.node != node:
            return
        job.now = value
        job.peak = value if job.peak is None else max(job.peak, value)
        on_node = self._latest.setdefault(node, {})
        on_node[job.name] = value
        self.node_peak[node] = max(self.node_peak.get(node, 0), sum(on_node.values()))
        self.max_in_use = max(self.max_in_use,
                              sum(sum(v.values()) for v in self._latest.values()))

    def in_use(self, node: str | None = None) -> int:
        """What the running jobs hold now (on ``node``, or everywhere)."""
        nodes = [node] if node is not None else list(self._latest)
        return sum(sum(self._latest.get(n, {}).values()) for n in nodes)

    def rows(self) -> list[Row]:
        """The live table's rows: the job (with its node), state, now, peak, share,
        seconds since its start."""
        now = time.time()
        rows: list[Row] = []
        for job in self.jobs.values():
            label = job.name if job.node is None else f"{job.name} @{job.node}"
            end = job.ended if job.ended is not None else now
            rows.append((label, job.state if job.attempt < 2 or job.state != JobState.RUNNING
                         else f"retry {job.attempt - 1}", job.now, job.peak, job.share,
                         None if job.started is None else end - job.started))
        return rows

    def header(self, source: str) -> str:
        """The live table's first line."""
        states = [j.state for j in self.jobs.values()]
        nodes = ", ".join(f"{n} {format_size(self.in_use(n))}/{format_size(m)}"
                          for n, m in self.node_memory.items())
        running, waiting = states.count(JobState.RUNNING), states.count(JobState.WAITING)
        return (f"memfit share --ray: {running} running, {waiting} waiting, "
                f"{len(states) - running - waiting} done"
                f" · nodes (in use/memory): {nodes or '-'} · "
                f"{time.time() - self.started:.1f} s  ({source})")
