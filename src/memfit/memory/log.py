"""The one log format: JSON lines, one event per line, in ``WORKDIR/memory.jsonl``.

Every line has ``t`` (Unix time), ``pid`` and ``event``. The first line of a log is a
``start`` event naming the format, so that ``memfit report`` can refuse other files:

    {"t": 1796030000.1, "pid": 4242, "event": "start", "format": "memfit-log",
     "format_version": 1, "memfit": "0.1.0", "source": "monitor", ...}
    {"t": ..., "pid": 4242, "event": "sample", "rss": ..., "rss_anon": ..., "rss_file": ...}
    {"t": ..., "pid": 4242, "event": "epoch_end", "epoch": 0, "rss_anon": ..., ...}

Events: ``start``, ``sample`` (periodic; ``scope: "tree"`` when it sums a process tree,
as ``memfit watch`` does), ``train_begin``/``train_end``, ``batch`` (every n batches),
``epoch_end`` (``epoch``), ``trim`` (``released`` bytes), ``verdict`` (the classifier's
result), ``restart``, ``exit`` (``code``), ``stop``; from ``memfit run`` and
``memfit.session``: ``request`` (a restart asked, ``reason``), ``kill`` (``reason``),
``checkpoint`` (``epoch``, ``step``, ``seconds``), ``resume`` (``epoch``, ``step``).
Memory fields are bytes and come from the probe (:class:`memfit.memory.Sample`: ``rss``,
``rss_anon``, ``rss_file``, ``rss_shmem``, ``rss_peak``, ``processes``; plus optional
``py_heap``, ``gpu``, ``nvml``); a source that was not available is left out, never
written as zero. Several runs may append to one log, each beginning with its own ``start``.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "memory.jsonl"
    >>> with MemoryLog(path, source="doc") as log:
    ...     _ = log.write("sample", rss=1, rss_anon=1, rss_file=0)
    >>> [r["event"] for r in read_log(path)]
    ['start', 'sample']
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

from memfit._version import __version__
from memfit.errors import MemfitError, write_failure

__all__ = ["MemoryLog", "read_log", "check_log", "LogError", "FORMAT", "Event"]

FORMAT = "memfit-log"
FORMAT_VERSION = 1

log = logging.getLogger("memfit")
_RECORD_START = '{"t":'                  # how every line MemoryLog writes begins


class Event(StrEnum):
    """Every event name a memfit log holds: write and compare ``Event.SAMPLE``, never the
    bare string (a ``StrEnum`` member equals its string, so old logs read the same)."""

    START = "start"                 # first line of each run: format, source, command...
    SAMPLE = "sample"               # periodic probe sample (``scope: "tree"`` from outside)
    TRAIN_BEGIN = "train_begin"
    TRAIN_END = "train_end"
    BATCH = "batch"                 # every n batches (MemoryMonitor)
    EPOCH_END = "epoch_end"         # ``epoch``
    TRIM = "trim"                   # ``released`` bytes
    VERDICT = "verdict"             # the classifier's result
    REQUEST = "request"             # a restart asked of a training (``reason``)
    KILL = "kill"                   # a supervisor killed a process (``reason``)
    RESTART = "restart"             # a supervisor started the training again
    WARM = "warm"                   # memfit run's warm parent imported the frameworks
    CHECKPOINT = "checkpoint"       # ``epoch``, ``step``, ``seconds``
    RESUME = "resume"               # ``epoch``, ``step``
    FIRST_STEP = "first_step"       # a training process's first step ended (its compile)
    SESSION = "session"             # a memfit.session() began (``seed``, ``epoch``, ``step``)
    EXIT = "exit"                   # a process ended (``code``)
    STOP = "stop"                   # a supervisor stopped for good (``reason``)
    JOB_START = "job_start"         # memfit share started a job
    SHARE = "share"                 # memfit share's per-tick totals
    DOCTOR = "doctor"               # memfit doctor's probe results
    COLLECT = "collect"             # memfit doctor: a gc.collect() and what it freed
    FINDINGS = "findings"           # memfit doctor's ranked findings


class LogError(MemfitError):
    """A file that is not a memfit log, or a damaged one."""


class MemoryLog:
    """Appends events to a JSON-lines log; each line is flushed as it is written.

    Several writers (a parent and its children) may append to the same file: each line
    is written with one ``write`` call in append mode, which the OS keeps whole.

    A line the disk refuses (full, ``ulimit -f``) ends this writer's logging, not the
    run: one warning says so and what to do, and later events are not written (a log
    is what the run is watched by; a full disk must not end the training it watches).
    A line the disk cut short is ended before the next writer appends its own.

    Args:
        path: the log file (created with its directory if missing).
        source: who writes (``"monitor"``, ``"watch"``, ``"run"``...), recorded in ``start``.
        header: write the ``start`` line (only the first writer of a file should).
        **start_fields: more fields for the ``start`` event (command, budget...).

    Raises:
        LogError: the file cannot be opened for appending (one line, with what to do).
    """

    def __init__(self, path: str | os.PathLike, *, source: str, header: bool = True,
                 **start_fields: Any):
        self.path = Path(path)
        self.error: OSError | None = None      # the write the disk refused, if one was
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            what, hint = write_failure(e, "choose another --workdir")
            raise LogError(f"Cannot write the memory log {str(self.path)!r}: {what}; "
                           f"{hint}.") from None
        if not _ends_a_line(self.path):
            self._append("\n")                 # a line cut short: ours starts on a new one
        if header:
            self.write(Event.START, format=FORMAT, format_version=FORMAT_VERSION,
                       memfit=__version__, source=source, **start_fields)

    def write(self, event: Event | str, *, pid: int | None = None, t: float | None = None,
              **fields: Any) -> dict:
        """Appends one event; returns the record written (also when the disk refused it:
        see :attr:`error`)."""
        record = {"t": time.time() if t is None else t,
                  "pid": os.getpid() if pid is None else pid, "event": str(event),
                  **{k: v for k, v in fields.items() if v is not None}}
        self._append(json.dumps(record, separators=(",", ":")) + "\n")
        return record

    def _append(self, text: str) -> None:
        with self._lock:
            if self._file.closed:
                return
            try:
                self._file.write(text)
                self._file.flush()
            except OSError as e:
                self.error = e
                with contextlib.suppress(OSError):     # the close flushes the line again
                    self._file.close()
                what, hint = write_failure(e)
                log.warning("memfit: could not write the memory log %r: %s; the run goes "
                            "on, but its memory is no longer logged there. To log it, %s.",
                            str(self.path), what, hint)

    def close(self) -> None:
        """Closes the file (a close the disk refuses is the warning :meth:`write` gave)."""
        with self._lock:
            with contextlib.suppress(OSError):
                self._file.close()

    def __enter__(self) -> MemoryLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ends_a_line(path: Path) -> bool:
    """Whether ``path`` is empty or its last byte ends a line."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return True
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"
    except OSError:
        return True


def check_log(path: str | os.PathLike) -> None:
    """Checks that a log a run would append to is memfit's: missing or empty is fine
    (the run starts it), anything else must read as a memfit log, so that nothing is
    appended to someone else's file.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "memory.jsonl"
        >>> check_log(path)                         # nothing there yet: fine
        >>> _ = path.write_text("a,b\\n1,2\\n")
        >>> try:
        ...     check_log(path)
        ... except LogError as e:
        ...     print(str(e)[-50:])
        s first line is not a memfit 'start' event): 'a,b'

    Args:
        path: the log.

    Raises:
        LogError: it holds something that is not a memfit log.
    """
    path = Path(path)
    if path.exists() and path.stat().st_size > 0:
        for _ in read_log(path):
            pass


def read_log(path: str | os.PathLike) -> Iterator[dict]:
    """Reads a memfit log, checking that it is one.

    A line cut short at the end (a writer killed mid-line) is skipped, and so is one
    inside that begins as a record and does not end as one (a line the disk cut short, a
    full disk or ``ulimit -f``, after which another run appended); anything else that is
    not a JSON object with ``t``, ``pid`` and ``event`` is an error.

    Raises:
        LogError: if the file is missing, empty, or not a memfit log.
    """
    path = Path(path)
    try:
        f = open(path, encoding="utf-8")
    except FileNotFoundError:
        raise LogError(f"No memfit log at {str(path)!r}.") from None
    except IsADirectoryError:
        raise LogError(f"{str(path)!r} is a directory; give a log file or a workdir.") from None
    with f:
        lines = f.read().splitlines()
    if not lines:
        raise LogError(f"{str(path)!r} is empty: no memfit log was written there.")
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
            ok = isinstance(record, dict) and {"t", "pid", "event"} <= set(record)
        except json.JSONDecodeError:
            if number == len(lines) > 1:
                return                          # the last line was cut short
            if number > 1 and line.startswith(_RECORD_START):
                continue                        # cut short by the disk; a run went on
            ok = False
        if number == 1 and not (ok and record.get("format") == FORMAT):
            raise LogError(f"{str(path)!r} is not a memfit log (its first line is not a "
                           f"memfit 'start' event): {line[:80]!r}")
        if not ok:
            raise LogError(f"{str(path)!r} line {number} is not a memfit log record: "
                           f"{line[:80]!r}")
        yield record
