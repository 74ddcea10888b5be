"""Reading a memfit log into per-process series: what the timeline and the report draw from.

Several processes may write one log (a supervisor and its children, ``memfit watch``
writing a process tree), so records are grouped by ``pid``. Nothing is computed here
beyond grouping and ordering; the report and the plot read the same :class:`RunData`.

Example:
    >>> import tempfile, pathlib
    >>> from memfit.memory.log import Event, MemoryLog
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "memory.jsonl"
    >>> with MemoryLog(path, source="doc") as log:
    ...     _ = log.write(Event.SAMPLE, pid=7, t=1.0, rss=3, rss_anon=2, rss_file=1)
    >>> data = load(path)
    >>> len(data.processes), data.processes[7].samples[0]["rss_anon"]   # writer + pid 7
    (2, 2)
    >>> [p.pid for p in data.measured]          # the run's processes: the writer is not one
    [7]
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Iterable
from pathlib import Path

from memfit.memory.log import Event, LogError, read_log
from memfit.workdir import LOG_NAME, Workdir

__all__ = ["RunData", "ProcessData", "load", "anon", "number", "MEMORY_FIELDS", "MARK_EVENTS"]

MEMORY_FIELDS = ("rss", "rss_anon", "rss_file", "rss_shmem", "py_heap", "gpu", "nvml")
MARK_EVENTS = (Event.RESTART, Event.EXIT, Event.STOP)


def number(value: object) -> float | None:
    """``value`` when it is a number (not a bool), else ``None``: log fields may be absent
    or hold anything.

    Args:
        value: a field of a log record.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def anon(record: dict) -> float | None:
    """Anonymous RSS of a record, else its total RSS (a probe without the split), else None."""
    value = number(record.get("rss_anon"))
    return number(record.get("rss")) if value is None else value


@dataclasses.dataclass(frozen=True)
class ProcessData:
    """The records of one process, in time order.

    Attributes:
        pid: the process id the records were written for.
        records: every record of that pid, sorted by ``t``.
        start: its ``start`` event, or ``None`` (a child appending to its parent's log).
        writer_start: for a process without a ``start`` event, the log's ``start`` event
            when its writer samples other processes only (``memfit watch`` logs the watched
            command's pid): where :attr:`command` comes from then.
    """

    pid: int
    records: tuple[dict, ...]
    start: dict | None
    writer_start: dict | None = None

    @property
    def samples(self) -> tuple[dict, ...]:
        """Records that carry a memory number (``sample``, ``batch``, ``epoch_end``...).

        Where ``memfit watch`` sampled this process's whole tree (``scope: "tree"``), those
        samples alone make the line: a MemoryMonitor inside measures the process only.
        """
        rows = [r for r in self.records if anon(r) is not None]
        tree = [r for r in rows if r.get("scope") == "tree"]
        return tuple(tree or rows)

    @property
    def epoch_ends(self) -> tuple[dict, ...]:
        return tuple(r for r in self.records if r["event"] == Event.EPOCH_END)

    @property
    def measured(self) -> bool:
        """Whether the log has memory numbers or epoch ends of this process. A writer that
        only samples others (the ``memfit watch`` or ``memfit run`` process itself) has
        none: it is not one of the run's processes, in the title or the summary."""
        return bool(self.samples or self.epoch_ends)

    @property
    def first_t(self) -> float:
        return self.records[0]["t"]

    @property
    def last_t(self) -> float:
        return self.records[-1]["t"]

    @property
    def duration(self) -> float:
        return self.last_t - self.first_t

    @property
    def anon_is_total(self) -> bool:
        """True when the log has no anonymous/file split for this process (total RSS used)."""
        return any(number(r.get("rss_anon")) is None for r in self.samples)

    @property
    def source(self) -> str:
        """The writer named by its (or the inherited) ``start`` event: monitor, watch, run..."""
        start = self.start or self.writer_start
        return str(start.get("source") or "") if start else ""

    @property
    def command(self) -> str:
        """What ran: the ``command``/``argv`` of its ``start`` event, else of any of its
        records, else of the writer's ``start`` event (see ``writer_start``); ``""`` if none."""
        starts = tuple(r for r in (self.start, self.writer_start) if r)
        for record in starts[:1] + self.records + starts[1:]:
            for key in ("command", "cmd", "argv"):
                value = record.get(key)
                if value:
                    return shlex.join(map(str, value)) if isinstance(value, list) else str(value)
        return ""


@dataclasses.dataclass(frozen=True)
class RunData:
    """A memfit log, read and grouped by process.

    Attributes:
        source: the workdir or log file that was given.
        log: the log file read.
        records: every record, in file order (the first is the log's ``start`` event).
        processes: one :class:`ProcessData` per pid, in order of first appearance.
    """

    source: Path
    log: Path
    records: tuple[dict, ...]
    processes: dict[int, ProcessData]

    @property
    def start(self) -> dict:
        return self.records[0]

    @property
    def measured(self) -> tuple[ProcessData, ...]:
        """The run's processes: those with memory numbers of their own (see
        :attr:`ProcessData.measured`), in order of first appearance. What "N processes"
        counts, in the timeline's title and in the report alike."""
        return tuple(p for p in self.processes.values() if p.measured)

    @property
    def first_t(self) -> float:
        return min(r["t"] for r in self.records)

    @property
    def last_t(self) -> float:
        return max(r["t"] for r in self.records)

    @property
    def duration(self) -> float:
        return self.last_t - self.first_t

    def events(self, *names: str) -> list[dict]:
        """Records whose ``event`` is one of ``names``, in time order."""
        return sorted((r for r in self.records if r["event"] in names), key=lambda r: r["t"])


def _resolve(source: str | os.PathLike) -> Path:
    path = Path(source)
    if not path.exists():
        raise LogError(f"No memfit workdir or log at {str(path)!r}. Give a workdir (a directory "
                       f"with {LOG_NAME}) or a memfit log file.")
    if path.is_dir():
        log = Workdir(path).log
        if not log.exists():
            raise LogError(f"{str(path)!r} has no memory log ({LOG_NAME}): it is not a memfit "
                           f"workdir, or nothing was monitored there yet. Give the workdir of "
                           f"a run (MemoryMonitor, memfit run, memfit watch) or a log file.")
        return log
    return path


def _check(records: Iterable[dict], log: Path) -> list[dict]:
    checked = []
    for line, record in enumerate(records, start=1):
        if number(record["t"]) is None or not isinstance(record["pid"], int) \
                or isinstance(record["pid"], bool) or not isinstance(record["event"], str):
            raise LogError(f"{str(log)!r} line {line}: 't' must be a number, 'pid' an integer "
                           f"and 'event' a string. Received: t={record['t']!r}, "
                           f"pid={record['pid']!r}, event={record['event']!r}")
        checked.append(record)
    if not checked:                     # read_log skips a last line cut short: the only one
        with open(log, encoding="utf-8", errors="replace") as f:
            first = f.readline().rstrip("\n")
        raise LogError(f"{str(log)!r} is not a memfit log, or its only line was cut short "
                       f"(it holds no complete JSON record): {first[:80]!r}")
    return checked


def load(source: str | os.PathLike) -> RunData:
    """Reads a memfit log (or a workdir's log) and groups its records by process.

    Example:
        >>> data = load("runs/exp1")                        # doctest: +SKIP
        >>> [p.pid for p in data.processes.values()]        # doctest: +SKIP
        [4242, 4243]

    Args:
        source: a workdir (its ``memory.jsonl`` is read) or the path of a memfit log.

    Returns:
        A :class:`RunData`.

    Raises:
        LogError: if the path is missing, is a directory without a log, or the file is
            empty, not a memfit log, or damaged.
    """
    log = _resolve(source)
    records = _check(read_log(log), log)
    by_pid: dict[int, list[dict]] = {}
    for record in records:
        by_pid.setdefault(record["pid"], []).append(record)
    for rows in by_pid.values():
        rows.sort(key=lambda r: r["t"])
    # Writers that sample other processes only (watch): their start event names the command.
    sampled = {r["pid"] for r in records if anon(r) is not None}
    proxies = [r for r in records if r["event"] == Event.START and r["pid"] not in sampled]
    processes = {}
    for pid, rows in by_pid.items():
        start = next((r for r in rows if r["event"] == Event.START), None)
        inherited = None
        if start is None:               # the latest such start before this process appeared
            inherited = next((r for r in reversed(proxies) if r["t"] <= rows[0]["t"]), None)
        processes[pid] = ProcessData(pid, tuple(rows), start, inherited)
    return RunData(Path(source), log, tuple(records), processes)
