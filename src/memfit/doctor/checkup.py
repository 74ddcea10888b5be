"""``memfit.run_doctor()``: run a training command for a few steps, measure it, say what to change.

The command runs unchanged under :func:`memfit.memory.watch.watch` (its process tree is
sampled from outside into ``WORKDIR/memory.jsonl``), with the in-process probe put into
its Python processes through ``$PYTHONPATH`` (:mod:`memfit.doctor.site`). The probe ends
the training after ``epochs`` epochs (by default 3, or at most 120 s: long enough to see
what repeats every epoch), ``steps`` steps or ``seconds`` seconds, and reports what it
measured;
:func:`memfit.doctor.findings.diagnose` turns that into ranked findings.

Example:
    >>> result = doctor(["python", "train.py"], steps=50)        # doctest: +SKIP
    >>> print(result)                                            # doctest: +SKIP
    >>> result.kinds                                             # doctest: +SKIP
    ['data-in-ram', 'memory-growth']
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from memfit import checks
from memfit.atomic import write_text_atomic
from memfit.doctor import site
from memfit.doctor.facts import PROBE_FORMAT, Facts, ProbeResults
from memfit.doctor.findings import diagnose
from memfit.doctor.report import DoctorResult
from memfit.memory.log import Event, MemoryLog, read_log
from memfit.memory.probe import system_memory
from memfit.memory.process import check_command
from memfit.memory.watch import WatchResult, watch
from memfit.quiet import quieted
from memfit.workdir import Workdir

__all__ = ["doctor", "DEFAULT_EPOCHS", "DEFAULT_SECONDS", "DEFAULT_WORKDIR",
           "DEFAULT_INTERVAL", "check_limits"]

DEFAULT_EPOCHS = 3              # epochs over all fit() calls: what repeats per epoch shows
DEFAULT_SECONDS = 120.0         # ... or this many seconds, whichever comes first
DEFAULT_WORKDIR = "memfit-doctor"
DEFAULT_INTERVAL = 0.2


def check_limits(steps: int | None, seconds: float | None, epochs: int | None = None
                 ) -> tuple[int | None, float | None, int | None]:
    """Validates the run's bound: ``steps``, or ``epochs`` and/or ``seconds`` (default:
    :data:`DEFAULT_EPOCHS` epochs or :data:`DEFAULT_SECONDS` seconds, whichever first).

    Example:
        >>> check_limits(None, None)
        (None, 120.0, 3)

    Args:
        steps: training steps over all ``fit`` calls.
        seconds: seconds from the start of each Python process.
        epochs: epoch ends over all ``fit`` calls.

    Raises:
        ValueError: for steps with seconds or epochs, a count that is not an integer >= 1,
            or seconds that are not a positive number, quoting the value
            (:mod:`memfit.checks`).
    """
    if steps is not None and seconds is not None:
        raise ValueError(f"give steps or seconds, not both. Received: steps={steps!r}, "
                         f"seconds={seconds!r}")
    if steps is not None and epochs is not None:
        raise ValueError(f"give steps or epochs, not both. Received: steps={steps!r}, "
                         f"epochs={epochs!r}")
    epochs = checks.count("epochs", epochs, optional=True, example=DEFAULT_EPOCHS)
    steps = checks.count("steps", steps, optional=True, example=100)
    seconds = checks.seconds("seconds", seconds, optional=True, example=60)
    if steps is None and seconds is None and epochs is None:
        seconds, epochs = DEFAULT_SECONDS, DEFAULT_EPOCHS
    return steps, seconds, epochs


def _read_probe(results_dir: Path, run_id: str) -> ProbeResults | None:
    """The results of the process that trained the most (a tree may hold several)."""
    best = None
    for path in sorted(results_dir.glob(f"probe-{run_id}-*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("format") != PROBE_FORMAT:
            continue
        key = (data.get("steps") or 0, data.get("rss_peak_steps") or 0)
        if best is None or key > best[0]:
            best = (key, data)
    return None if best is None else ProbeResults.from_json(best[1])


def doctor(command: Sequence[str], *, steps: int | None = None, seconds: float | None = None,
           epochs: int | None = None, workdir: str | os.PathLike = DEFAULT_WORKDIR,
           interval: float = DEFAULT_INTERVAL,
           status: TextIO | None = None) -> DoctorResult:
    """Runs a training command for a bounded number of steps and diagnoses its memory.

    The command runs unchanged (same terminal and environment, plus the probe's
    variables), its output too but for TensorFlow's start-up lines, left out as ``memfit
    doctor`` leaves them out (inside ``memfit.quiet.quieted(False)`` they are shown).
    Its Python processes that import Keras get memfit's probe: ``fit`` is
    watched step by step and ended after ``epochs`` epoch ends or ``steps`` steps over
    all its calls, or once ``seconds`` have passed since the process started; the
    process then exits with code 0 (a script that calls ``fit(epochs=1)`` in a loop is
    stopped at the ``fit`` call after the last epoch, so what it does between epochs,
    such as ``del`` + ``gc.collect()``, is measured). A command that finishes sooner is
    measured at its end.

    Example:
        >>> import memfit
        >>> result = memfit.run_doctor(["python", "train.py"], steps=50)     # doctest: +SKIP
        >>> for f in result.findings:                                   # doctest: +SKIP
        ...     print(f.kind, f.bytes, f.fix[0])

    Args:
        command: the program and its arguments, e.g. ``["python", "train.py"]``.
        steps: training steps to run.
        seconds: or seconds to run, counted from each Python process's start.
        epochs: or epochs to run, over all ``fit`` calls (with ``seconds``: whichever
            comes first). With none of the three: 3 epochs or 120 s.
        workdir: where the log (``memory.jsonl``), the probe's results
            (``.doctor/``) and ``doctor.json`` go; created if missing.
        interval: seconds between samples of the process tree from outside.
        status: where the live status line goes on a terminal (default stderr).

    Returns:
        A :class:`memfit.doctor.report.DoctorResult`: ``print`` it for the ranked
        findings; ``.to_json()`` for tools (what ``--json`` prints).

    Raises:
        ValueError: an empty command, bad or clashing ``steps``/``seconds``/``epochs``, a bad
            ``interval`` (each quoting the value).
        MemfitError: a workdir that cannot be written or holds a file that is not a
            memfit log.
        CommandStartError: the command does not exist (exit code 127) or cannot be run.
    """
    command = check_command(command)
    steps, seconds, epochs = check_limits(steps, seconds, epochs)
    interval = checks.seconds("interval", interval, example=DEFAULT_INTERVAL)
    wd = Workdir(workdir).create()
    results_dir = wd.path / ".doctor"
    run_id = uuid.uuid4().hex[:12]
    env = site.environment(site.prepare(wd.path), results_dir, run_id, steps=steps,
                           seconds=seconds, epochs=epochs)
    since = time.time()
    with quieted():     # as `memfit doctor` does; quieted(False) around the call shows them
        watched = watch(command, interval=interval, workdir=wd.path, status=status, env=env)
    result = _diagnose(tuple(command), watched, _read_probe(results_dir, run_id), wd.path)
    resumed = _resumed(watched.log_path, since)
    if resumed is not None:
        result = dataclasses.replace(result, resumed=resumed)
    _record(result, wd)
    return result


def _diagnose(command: tuple[str, ...], watched: WatchResult, probe: ProbeResults | None,
              workdir: Path) -> DoctorResult:
    """The findings of one run, from what was seen from outside and the probe's results."""
    outside = {**watched.verdict.to_record(), "basis": watched.basis}
    verdict = outside
    if probe is not None and probe.verdict and "error" not in probe.verdict:
        verdict = probe.verdict           # per step, with a trim probe: the better one
    facts = Facts(command=command, probe=probe,
                  peak_anon=None if watched.peak is None else watched.peak.anon_or_total,
                  watch_verdict=outside, ram_total=system_memory()[0])
    return DoctorResult(command=command, exit_code=watched.exit_code,
                        duration=watched.duration, findings=tuple(diagnose(facts)),
                        steps=None if probe is None else probe.steps,
                        stopped=None if probe is None else probe.stopped,
                        probe=probe is not None, peak=watched.peak,
                        verdict={k: v for k, v in verdict.items() if k != "values"},
                        workdir=workdir, log_path=watched.log_path,
                        measurements=None if probe is None else probe.to_json(),
                        epochs=None if probe is None else probe.epochs)


def _resumed(log_path: Path, since: float) -> dict | None:
    """Where the command's ``memfit.session()`` resumed in this run from a checkpoint an
    earlier run left in the workdir (``epoch``, ``step``), or ``None`` (a fresh start, or
    no session): a second doctor run on a session script trains only what is left."""
    for event in read_log(log_path):
        if event["event"] == Event.RESUME and event["t"] >= since \
                and event.get("fresh") is False:
            return {"epoch": int(event.get("epoch") or 0), "step": int(event.get("step") or 0)}
    return None


def _record(result: DoctorResult, wd: Workdir) -> None:
    """Writes ``doctor.json`` and the run's last events to the shared log."""
    write_text_atomic(wd.path / "doctor.json", json.dumps(result.to_json(), indent=1) + "\n")
    probe = result.measurements
    with MemoryLog(wd.log, source="doctor", header=False) as log:
        if probe and probe.get("verdict") and "error" not in probe["verdict"]:
            # The in-process verdict (per step, with a trim probe) is the better one: log
            # it after watch's, so that `memfit report` shows it.
            log.write(Event.VERDICT, pid=probe.get("pid"), source="doctor", **result.verdict)
        log.write(Event.FINDINGS, kinds=result.kinds,
                  bytes=[f.bytes for f in result.findings], steps=result.steps)
