"""Where ``memfit share`` keeps its files, and the record each job leaves for the next run.

::

    WORKDIR/
      memory.jsonl                the shared log: every job on one timeline
      jobs/NAME/                  one directory per job (JobFiles)
        stdout.log, stderr.log    the job's output
        job.json                  what its last run measured (JobRecord)
        exit.json                 on Ray: how the job ended, written by its tether
        memory.jsonl, checkpoints/    memfit run's own, for a supervised job

The runner writes ``job.json`` when a job ends; the planner reads it to learn a need the
jobs file left out. Both go through :class:`JobRecord`, never through a dict's keys.

Example:
    >>> files = JobFiles.of("runs/share", "small")
    >>> files.stdout.as_posix(), files.record.name
    ('runs/share/jobs/small/stdout.log', 'job.json')
    >>> record = JobRecord(name="small", command=("python", "train.py"), device="cpu",
    ...                    exit_code=0, state=JobState.FINISHED, peak=2**20, host_peak=2**20,
    ...                    share=2**21, need=2**20, need_source="given", duration=1.5,
    ...                    restarts=0, t=1796030000.0)
    >>> JobRecord.from_json(record.to_json()) == record
    True
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from memfit import checks
from memfit.atomic import temporary_name
from memfit.memory.log import Event, LogError, read_log
from memfit.share.states import JobState
from memfit.workdir import Workdir

__all__ = ["DEFAULT_WORKDIR", "RECORD_NAME", "EXIT_STATUS_NAME", "STDOUT_NAME",
           "STDERR_NAME", "JobFiles", "JobRecord"]

DEFAULT_WORKDIR = "memfit-share"
RECORD_NAME = "job.json"          # WORKDIR/jobs/NAME/job.json: what the last run measured
EXIT_STATUS_NAME = "exit.json"    # on Ray: how the job ended, written the instant it ends
STDOUT_NAME = "stdout.log"
STDERR_NAME = "stderr.log"


@dataclasses.dataclass(frozen=True)
class JobFiles:
    """One job's directory, ``WORKDIR/jobs/NAME``, and the files in it.

    Attributes:
        directory: the job's directory (for a supervised job, also ``memfit run``'s
            workdir: its log and checkpoints).
    """

    directory: Path

    @classmethod
    def of(cls, workdir: str | os.PathLike, name: str) -> JobFiles:
        """The files of job ``name`` in the share's ``workdir``."""
        return cls(Path(workdir) / "jobs" / name)

    @property
    def stdout(self) -> Path:
        """The job's standard output."""
        return self.directory / STDOUT_NAME

    @property
    def stderr(self) -> Path:
        """The job's standard error."""
        return self.directory / STDERR_NAME

    @property
    def record(self) -> Path:
        """``job.json``: what the job's last run measured."""
        return self.directory / RECORD_NAME

    @property
    def exit_status(self) -> Path:
        """``exit.json``: how the job ended, written by its tether on Ray the instant it
        ends (:mod:`memfit.share.cluster_tether`), so that a retry of its task after its
        node died does not run it again."""
        return self.directory / EXIT_STATUS_NAME

    def create(self) -> JobFiles:
        """Makes the directory (and its parents); returns ``self``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        return self

    def write_record(self, record: JobRecord) -> None:
        """Writes ``job.json`` under a temporary name, then renames it: a reader never sees
        half of it. No fsync: the loop that enforces the shares must not wait on the disk
        (a record lost to a power cut only means the need is learned again). A record the
        disk refuses (full, ``ulimit -f``) is lost the same way, with no temporary file
        left: it must not stop the loop, which still watches the other jobs."""
        tmp = temporary_name(self.record)
        try:
            tmp.write_text(json.dumps(record.to_json(), indent=1), encoding="utf-8")
            os.replace(tmp, self.record)
        except OSError:
            tmp.unlink(missing_ok=True)

    def supervisor_events(self, started: float) -> tuple[list[dict], str]:
        """What a supervised job's ``memfit run`` logged in this directory since the job
        ``started`` (Unix time): its ``restart`` events, and the reason it stopped (``""``
        when it did not)."""
        restarts, stop = [], ""
        try:
            for record in read_log(Workdir(self.directory).log):
                if record["t"] < started - 1:
                    continue
                if record["event"] == Event.RESTART:
                    restarts.append(record)
                elif record["event"] == Event.STOP:
                    stop = str(record.get("reason") or "")
        except (LogError, OSError):
            pass
        return restarts, stop

    def read_record(self) -> JobRecord | None:
        """The job's last record, or ``None`` when there is none it can read."""
        try:
            return JobRecord.from_json(json.loads(self.record.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """What one run of a job measured (``job.json``).

    Attributes:
        name: the job.
        command: what ran (the user's command, without ``memfit run``).
        device: ``"cpu"`` or ``"gpu:N"``.
        exit_code: as a shell reports it, or ``None`` if it never started.
        state: the :class:`memfit.share.share_results.JobResult` state.
        peak: the largest memory sampled for its tree (CPU: anonymous RSS; GPU: NVML),
            or ``None`` when none was sampled.
        host_peak: the largest anonymous RSS of its tree, or ``None``.
        share: its charge on the budget.
        need: its need above the overhead (``None``: it ran alone).
        need_source: where the need came from.
        duration: seconds from its start to its end.
        restarts: restarts by ``memfit run``.
        t: when it ended (Unix time).
    """

    name: str
    command: tuple[str, ...]
    device: str
    exit_code: int | None
    state: JobState
    peak: int | None
    host_peak: int | None
    share: int
    need: int | None
    need_source: str
    duration: float
    restarts: int
    t: float

    def to_json(self) -> dict[str, Any]:
        """The JSON object of ``job.json``."""
        return {**dataclasses.asdict(self), "command": list(self.command)}

    @classmethod
    def from_json(cls, data: Any) -> JobRecord:
        """The record in a ``job.json`` object, checked field by field.

        Raises:
            ValueError: a field is missing or of the wrong type, quoting it.
        """
        if not isinstance(data, dict):
            raise ValueError(f"a job record must be a JSON object. Received: {data!r}")
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in data]
        if missing:
            raise ValueError(f"a job record must hold {', '.join(missing)}. Received: "
                             f"{sorted(data)!r}")
        command = data["command"]
        if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
            raise ValueError(f"command must be a list of strings. Received: "
                             f"command={command!r}")
        for name in ("name", "device", "state", "need_source"):
            if not isinstance(data[name], str):
                raise ValueError(f"{name} must be a string. Received: {name}={data[name]!r}")
        if data["state"] not in set(JobState):
            raise ValueError(f"state must be one of {', '.join(JobState)}. Received: "
                             f"state={data['state']!r}")
        return cls(name=data["name"], command=tuple(command), device=data["device"],
                   exit_code=checks.count("exit_code", data["exit_code"], minimum=0,
                                          optional=True),
                   state=JobState(data["state"]),
                   peak=checks.count("peak", data["peak"], minimum=0, optional=True),
                   host_peak=checks.count("host_peak", data["host_peak"], minimum=0,
                                          optional=True),
                   share=checks.count("share", data["share"], minimum=0),
                   need=checks.count("need", data["need"], minimum=0, optional=True),
                   need_source=data["need_source"],
                   duration=checks.seconds("duration", data["duration"], positive=False),
                   restarts=checks.count("restarts", data["restarts"], minimum=0),
                   t=checks.seconds("t", data["t"], positive=False))
