"""The jobs file of ``memfit share``: reading it and checking every value before anything starts.

A jobs file is TOML: optional defaults at the top, then one ``[[job]]`` table per job.

.. code-block:: toml

    budget = "12GiB"          # optional; --budget wins (default: memory available now)
    device = "cpu"            # optional; --device wins ("cpu" or "gpu:N")
    overhead = "220MiB"       # optional; --overhead wins (default: `memfit calibrate`)

    [[job]]
    name = "small"                                   # optional: job1, job2... by default
    command = ["python", "train.py", "--width", "64"]   # a list, or one string (shlex)
    need = "1.5GiB"                                  # a size...

    [[job]]
    name = "cnn"
    command = "python train_cnn.py --batch 64"
    need = "auto"                                    # ...from memfit's estimator,
    model = "mymodels:make_cnn"                      #   for this model
    batch_size = 64                                  #   and batch size

    [[job]]
    name = "again"                                   # no need: learned from this job's
    command = "python train.py --width 256"          # peak in a previous run in the workdir

Job keys: ``name``, ``command`` (required), ``need``, ``model``, ``batch_size``,
``optimizer``, ``dtype_policy``, ``input_shape`` (the last five with ``need = "auto"``),
``env`` (a table of environment variables for the job), ``restart`` (true: supervise
the job with ``memfit run``, as ``--restart`` does for all). ``python`` (or
``python3``) at the start of a command is the Python running memfit, so jobs use the
same environment.

Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "jobs.toml"
    >>> _ = path.write_text('[[job]]\\nname = "a"\\ncommand = "python -c pass"\\n'
    ...                     'need = "64MiB"\\n')
    >>> spec = load_jobs(path)
    >>> spec.jobs[0].name, spec.jobs[0].need
    ('a', 67108864)
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shlex
import shutil
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memfit import checks
from memfit.errors import MemfitError
from memfit.estimate.baseline import check_device
from memfit.sizes import parse_size

__all__ = ["Job", "JobsSpec", "JobsFileError", "load_jobs", "parse_jobs", "JOB_KEYS",
           "TOP_KEYS", "AUTO_KEYS", "format_problems"]

JOB_KEYS = ("name", "command", "need", "model", "batch_size", "optimizer", "dtype_policy",
            "input_shape", "env", "restart")
AUTO_KEYS = ("model", "batch_size", "optimizer", "dtype_policy", "input_shape")
TOP_KEYS = ("budget", "device", "overhead", "job")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PYTHONS = ("python", "python3")

EXAMPLE = '''[[job]]
name = "small"
command = ["python", "train.py", "--width", "64"]
need = "1GiB"'''


class JobsFileError(MemfitError, ValueError):
    """A jobs file (or list of jobs) that cannot be run as written; nothing was started.

    Attributes:
        problems: one line per problem found, each quoting the value.
    """

    def __init__(self, message: str, problems: Sequence[str] = ()):
        super().__init__(message)
        self.problems = list(problems) or [message]


@dataclasses.dataclass(frozen=True)
class Job:
    """One job as written in the jobs file, checked.

    Attributes:
        name: a name, unique in the file (letters, digits, ``_.-``): its directory in
            ``WORKDIR/jobs/``.
        command: the program and its arguments (``python`` replaced by this Python).
        need: the memory it needs above the per-process overhead, in bytes; ``None``
            when it is to be estimated (``need_source == "auto"``) or learned from a
            previous run (``"learned"``).
        need_source: ``"given"``, ``"auto"`` or ``"learned"`` (to be resolved by
            :func:`memfit.share.planner.plan`).
        auto: for ``need = "auto"``: ``model``, ``batch_size`` and the optional
            ``optimizer``, ``dtype_policy``, ``input_shape``.
        env: environment variables for the job.
        restart: supervise it with ``memfit run`` (``None``: as ``--restart`` says).
        index: its position in the file (1-based).
        written_need: ``need`` as written (for messages), or ``None``.
    """

    name: str
    command: tuple[str, ...]
    need: int | None
    need_source: str
    auto: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    restart: bool | None = None
    index: int = 0
    written_need: Any = None


@dataclasses.dataclass(frozen=True)
class JobsSpec:
    """A checked jobs file: the jobs and the file's defaults (``None`` where not given).

    Attributes:
        jobs: the jobs, in file order.
        budget: ``budget`` of the file, in bytes.
        device: ``device`` of the file.
        overhead: ``overhead`` of the file, in bytes.
        source: the file read, or ``"<jobs>"`` for a list given from Python.
    """

    jobs: tuple[Job, ...]
    budget: int | None = None
    device: str | None = None
    overhead: int | None = None
    source: str = "<jobs>"


def _suggest(key: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _size(value: Any, name: str, where: str, problems: list[str]) -> int | None:
    try:
        return parse_size(value, name=name, memory=name != "overhead")
    except ValueError as e:
        problems.append(f"{where}: {e}")
        return None


def _command(value: Any, where: str, problems: list[str]) -> tuple[str, ...] | None:
    if isinstance(value, str):
        try:
            parts = shlex.split(value)
        except ValueError as e:
            problems.append(f"{where}: command is not a valid command line ({e}). "
                            f"Received: command={value!r}")
            return None
    elif isinstance(value, list) and all(isinstance(p, str) for p in value):
        parts = list(value)
    else:
        problems.append(f"{where}: command must be a list of strings such as "
                        f"['python', 'train.py'] or one string such as 'python train.py'. "
                        f"Received: command={value!r}")
        return None
    if not parts or not parts[0].strip():
        problems.append(f"{where}: command is empty: give the program to run and its "
                        f"arguments, such as 'python train.py'. Received: command={value!r}")
        return None
    if parts[0] in _PYTHONS:
        parts[0] = sys.executable
    program = parts[0]
    if os.sep in program or (os.altsep and os.altsep in program):
        if not Path(program).is_file():
            problems.append(f"{where}: command not found: {program!r} is not a file (a "
                            f"relative path is taken from the current directory, "
                            f"{os.getcwd()!r}). Received: command={value!r}")
            return None
    elif shutil.which(program) is None:
        problems.append(f"{where}: command not found: {program!r} is not on the PATH (check "
                        f"the spelling, or give the program's path). "
                        f"Received: command={value!r}")
        return None
    return tuple(parts)


def _need(entry: Mapping[str, Any], where: str,
          problems: list[str]) -> tuple[int | None, str, dict[str, Any]]:
    """``(need, need_source, auto)`` of a job's table: a size (``"given"``), ``"auto"``
    with the estimator's keys, or left out (``"learned"``)."""
    need_value = entry.get("need")
    need, source = None, "learned"
    if isinstance(need_value, str) and need_value.strip().lower() == "auto":
        source = "auto"
    elif need_value is not None:
        need, source = _size(need_value, "need", where, problems), "given"
    auto = {k: entry[k] for k in AUTO_KEYS if k in entry}
    if source == "auto":
        if not isinstance(auto.get("model"), str) or not auto.get("model"):
            problems.append(f"{where}: need = 'auto' estimates the need of a Keras model: "
                            f"give model = 'module:function' or a '.keras' path. "
                            f"Received: model={auto.get('model')!r}")
        try:
            checks.count("batch_size", auto.get("batch_size"), example=64)
        except ValueError as e:
            problems.append(f"{where}: need = 'auto' needs a batch_size: {e}")
    elif auto:
        problems.append(f"{where}: {', '.join(auto)} "
                        f"{'serves' if len(auto) == 1 else 'serve'} only need = 'auto'; "
                        f"this job's "
                        f"need is {need_value!r}. Set need = 'auto' or remove them.")
    return need, source, auto


def _job(entry: Any, index: int, problems: list[str]) -> Job | None:
    where = f"job {index}"
    if not isinstance(entry, Mapping):
        problems.append(f"{where}: each job must be a table with at least a command "
                        f"([[job]] in TOML, a dict from Python). Received: {entry!r}")
        return None
    name = entry.get("name", f"job{index}")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.append(f"{where}: name must be 1 to 64 letters, digits, '_', '.' or '-' "
                        f"(it names the job's directory), starting with a letter or digit. "
                        f"Received: name={name!r}")
        name = None
    else:
        where = f"job {index} ({name!r})"
    before = len(problems)
    for key in entry:
        if key not in JOB_KEYS:
            problems.append(f"{where}: unknown key {key!r}{_suggest(key, JOB_KEYS)}. Job "
                            f"keys: {', '.join(JOB_KEYS)}. Received: {key}={entry[key]!r}")
    if "command" not in entry:
        problems.append(f"{where}: missing command: every job needs one, such as "
                        f"command = ['python', 'train.py']")
        command = None
    else:
        command = _command(entry["command"], where, problems)
    need_value = entry.get("need")
    need, source, auto = _need(entry, where, problems)
    env = entry.get("env", {})
    if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str | int | float) and not isinstance(v, bool)
            for k, v in env.items()):
        problems.append(f"{where}: env must be a table of names to strings, such as "
                        f"env = {{ OMP_NUM_THREADS = '1' }}. Received: env={env!r}")
        env = {}
    restart = entry.get("restart")
    if restart is not None and not isinstance(restart, bool):
        problems.append(f"{where}: restart must be true or false. Received: "
                        f"restart={restart!r}")
        restart = None
    if len(problems) > before or name is None or command is None:
        return None
    return Job(name=name, command=command, need=need, need_source=source, auto=auto,
               env={k: str(v) for k, v in env.items()}, restart=restart, index=index,
               written_need=need_value)


def parse_jobs(data: Mapping[str, Any] | Sequence[Mapping[str, Any]], *,
               source: str = "<jobs>") -> JobsSpec:
    """Checks jobs given as the parsed TOML document or as a list of job dicts.

    Every problem is collected (each quoting the value) and raised together.

    Example:
        >>> spec = parse_jobs([{"name": "a", "command": ["python", "-c", "pass"],
        ...                     "need": "100MiB"}])
        >>> spec.jobs[0].need_source
        'given'

    Args:
        data: ``{"budget": ..., "job": [{...}, ...]}`` (a jobs file), or a list of jobs.
        source: where it came from, for the messages.

    Raises:
        JobsFileError: listing every problem: unknown keys, a missing or empty command,
            a command that does not exist, duplicate names, sizes that are not sizes.
    """
    problems: list[str] = []
    budget = device = overhead = None
    if isinstance(data, Mapping):
        for key in data:
            if key not in TOP_KEYS:
                problems.append(f"unknown key {key!r}{_suggest(key, TOP_KEYS)} at the top of "
                                f"the file. Top-level keys: {', '.join(TOP_KEYS)} (one "
                                f"[[job]] table per job). Received: {key}={data[key]!r}")
        if "budget" in data:
            budget = _size(data["budget"], "budget", "top of the file", problems)
        if "overhead" in data:
            overhead = _size(data["overhead"], "overhead", "top of the file", problems)
        if "device" in data:
            try:        # listed with the file's other problems, not after they are fixed
                device = check_device(data["device"])
            except MemfitError as e:
                problems.append(f"top of the file: {e}")
        entries = data.get("job", [])
        if not isinstance(entries, list):
            problems.append(f"'job' must be an array of tables: write [[job]] (two "
                            f"brackets) before each job. Received: job={entries!r}")
            entries = []
    elif isinstance(data, Sequence) and not isinstance(data, str | bytes):
        entries = list(data)
    else:
        raise JobsFileError(f"jobs must be a jobs file path, or a list of job dicts such as "
                            f"[{{'name': 'a', 'command': ['python', 'train.py'], 'need': "
                            f"'1GiB'}}]. Received: {data!r}")
    if not entries and not problems:
        raise JobsFileError(f"{source}: no jobs: add one [[job]] table per job, such "
                            f"as\n{EXAMPLE}")
    jobs = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries, start=1):
        job = _job(entry, index, problems)
        # the name as written: a job with other problems can still repeat a name
        name = job.name if job is not None else (
            entry.get("name") if isinstance(entry, dict) else None)
        if isinstance(name, str) and name in seen:
            problems.append(f"job {index}: duplicate name {name!r} (job {seen[name]} "
                            f"has it too): names must be unique, each names the job's "
                            f"directory and its lines in the log")
            continue
        if isinstance(name, str):
            seen[name] = index
        if job is not None:
            jobs.append(job)
    if problems:
        raise JobsFileError(format_problems(source, problems), problems)
    return JobsSpec(jobs=tuple(jobs), budget=budget, device=device, overhead=overhead,
                    source=source)


def format_problems(source: str, problems: Sequence[str]) -> str:
    if len(problems) == 1:
        return f"{source}: {problems[0]}"
    return f"{source}: {len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)


def load_jobs(path: str | os.PathLike) -> JobsSpec:
    """Reads and checks a jobs file (TOML).

    Example:
        >>> spec = load_jobs("examples/jobs.toml")          # doctest: +SKIP
        >>> [job.name for job in spec.jobs]                 # doctest: +SKIP

    Args:
        path: the jobs file.

    Raises:
        JobsFileError: if it is missing, empty, not TOML, or any value is wrong (every
            problem listed, each quoting the value).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise JobsFileError(f"No jobs file at {str(path)!r}: give the path of a TOML file "
                            f"with one [[job]] table per job.") from None
    except IsADirectoryError:
        raise JobsFileError(f"{str(path)!r} is a directory: give the path of a TOML jobs "
                            f"file.") from None
    except OSError as e:
        raise JobsFileError(f"Cannot read the jobs file {str(path)!r}: {e.strerror}.") from None
    text = raw.decode("utf-8", errors="replace")
    if not text.strip():
        raise JobsFileError(f"{str(path)!r} is empty: it lists no jobs. Add one [[job]] "
                            f"table per job, such as\n{EXAMPLE}")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise JobsFileError(f"{str(path)!r} is not valid TOML: {e}. A jobs file holds one "
                            f"[[job]] table per job, such as\n{EXAMPLE}") from None
    return parse_jobs(data, source=str(path))
