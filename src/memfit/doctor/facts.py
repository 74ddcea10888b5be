"""What the doctor's rules read and what they return: :class:`Facts` and :class:`Finding`.

:class:`Facts` holds one run's measurements: the in-process probe's results
(:class:`ProbeResults`, which :func:`memfit.doctor.fit_probe.finish` writes as JSON across
the process) and the process tree's memory seen from outside.
A rule (:mod:`memfit.doctor.findings` lists them) reads the facts and returns a
:class:`Finding`: the numbers measured, why they matter, the fix and the memory at stake.
The small helpers below word the numbers the same way in every rule.

Example:
    >>> facts = Facts(command=("python", "train.py"), probe=None, peak_anon=2**30)
    >>> facts.peak, facts.cmd, arg_size(1.7 * 2**30), percent(1, 4)
    (1073741824, 'python train.py', '1.5GiB', '25 %')
    >>> probe = ProbeResults.from_json({"format": PROBE_FORMAT, "steps": 40, "fits": 1})
    >>> probe.steps, probe.fits, probe.verdict, ProbeResults.from_json(probe.to_json()) == probe
    (40, 1, None, True)
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from memfit.sizes import format_size

__all__ = ["Finding", "Facts", "ProbeResults", "PROBE_FORMAT", "arg_size", "percent",
           "array_names", "describe_array"]

MiB = 2**20
PROBE_FORMAT = "memfit-doctor-probe"     # the ``format`` of the probe's results file


@dataclasses.dataclass(frozen=True)
class ProbeResults:
    """What the in-process probe measured in one training process
    (``$MEMFIT_DOCTOR_DIR/probe-RUN-PID.json``): written by
    :func:`memfit.doctor.fit_probe.finish`, read by :mod:`memfit.doctor.checkup`. The fields are
    the file's keys, in its order; a key the file lacks takes its default.

    Attributes:
        format: :data:`PROBE_FORMAT`.
        pid, argv, run: the process, its command line and the doctor run's id.
        steps, fits, epochs: training steps, ``fit`` calls and epoch ends seen.
        stopped: ``"steps"``, ``"epochs"`` or ``"seconds"`` when the probe stopped it.
        steps_limit, seconds_limit, epochs_limit: the limits it was given.
        duration: seconds from the process's start; ``train_seconds``: from the first fit.
        rss_before_fit, rss_first_step, rss_final, rss_peak_steps: anonymous RSS (bytes)
            when ``fit`` was called, after its first step, at the end, and the most after
            a step.
        step_rss, epoch_rss: anonymous RSS after each step (the last ones) and epoch end.
        fit: what the largest ``fit`` call trained on (arrays, pipeline, batch size...).
        arrays: the arrays alive at the end (``total``, ``mapped``, ``largest``, ``memfit``).
        releases: what a trim gave back after each ``del`` + ``gc.collect()``.
        verdict, causes, kept: the classifier's verdict on the steps, what usually causes
            a leak (models alive, retraced functions), allocator retention after ``del``
            (each ``{"error": ...}`` when it could not be measured).
        gpu, model_file, estimate: the GPU settings, the saved model, the estimator's
            breakdown of the model's step.
    """

    format: str = PROBE_FORMAT
    pid: int | None = None
    argv: tuple[str, ...] = ()
    run: str | None = None
    steps: int = 0
    fits: int = 0
    stopped: str | None = None
    steps_limit: int | None = None
    seconds_limit: float | None = None
    duration: float | None = None
    train_seconds: float | None = None
    rss_before_fit: int | None = None
    rss_first_step: int | None = None
    rss_final: int | None = None
    rss_peak_steps: int | None = None
    step_rss: tuple[int, ...] = ()
    epoch_rss: tuple[int, ...] = ()
    fit: Mapping[str, Any] | None = None
    arrays: Mapping[str, Any] | None = None
    epochs: int = 0
    epochs_limit: int | None = None
    releases: tuple[Mapping[str, Any], ...] = ()
    verdict: Mapping[str, Any] | None = None
    causes: Mapping[str, Any] | None = None
    kept: Mapping[str, Any] | None = None
    gpu: Mapping[str, Any] | None = None
    model_file: str | None = None
    estimate: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the results file, its keys in the probe's order."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProbeResults:
        """The results in a results file's object (keys it lacks take their default,
        keys this version does not know are left out)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) and k in _LISTS else v
                      for k, v in data.items() if k in names})


_LISTS = {"argv", "step_rss", "epoch_rss", "releases"}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing to change, with the numbers that show it.

    Attributes:
        kind: ``data-in-ram``, ``activations``, ``allocator-retention``,
            ``memory-growth``, ``gpu-no-limit`` or ``pipeline-buffers``.
        title: one line.
        bytes: memory at stake: about what the fix saves (what ranks findings).
        measured: what this run measured, in words with the numbers.
        why: why it matters.
        fix: the commands or code lines that fix it, one per item.
        details: the numbers, for tools.
    """

    kind: str
    title: str
    bytes: int
    measured: str
    why: str
    fix: tuple[str, ...]
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kind": self.kind, "title": self.title, "bytes": self.bytes,
                "measured": self.measured, "why": self.why, "fix": list(self.fix),
                "details": dict(self.details)}


@dataclasses.dataclass(frozen=True)
class Facts:
    """What one doctor run measured.

    Attributes:
        command: the command run.
        probe: the in-process probe's results (:func:`memfit.doctor.fit_probe.finish`), or
            ``None`` when the command has no Python process that imported Keras.
        peak_anon: peak anonymous RSS of the whole process tree (from outside).
        watch_verdict: the verdict from outside (:class:`memfit.memory.Verdict` record).
        ram_total: the machine's memory, in bytes.
    """

    command: Sequence[str]
    probe: ProbeResults | None
    peak_anon: int | None = None
    watch_verdict: Mapping[str, Any] | None = None
    ram_total: int | None = None

    @property
    def peak(self) -> int:
        """The largest anonymous RSS seen, from inside or outside (0 if none)."""
        inside = self.measurements.rss_peak_steps or 0
        return max(inside, self.peak_anon or 0)

    @property
    def measurements(self) -> ProbeResults:
        """The probe's results, or empty ones (every field its default) without a probe."""
        return self.probe or _NO_PROBE

    @property
    def fit(self) -> Mapping[str, Any]:
        """What the largest ``fit`` call trained on (arrays, pipeline, batch size...)."""
        return self.measurements.fit or {}

    @property
    def alive(self) -> list[Mapping[str, Any]]:
        """The largest arrays alive at the end of the run, memory-mapped ones left out."""
        return [a for a in (self.measurements.arrays or {}).get("largest", [])
                if not a["mapped"]]

    @property
    def containers(self) -> list[Mapping[str, Any]]:
        """Python containers of many small arrays alive at the end (a list of tuples...)."""
        return [a for a in (self.measurements.arrays or {}).get("largest", [])
                if a.get("container")]

    @property
    def given(self) -> list[Mapping[str, Any]]:
        """The arrays given to ``fit``, memory-mapped ones left out."""
        return [a for a in self.fit.get("arrays", []) if not a["mapped"]]

    @property
    def first_step_growth(self) -> int | None:
        """How much anonymous RSS grew from the call of ``fit`` to its first step (Keras
        copying in-memory arrays, a shuffle buffer filling), or ``None`` if not measured."""
        before = self.measurements.rss_before_fit
        first = self.measurements.rss_first_step
        return None if before is None or first is None else max(0, first - before)

    @property
    def cmd(self) -> str:
        """The command, quoted as a shell would take it."""
        return shlex.join(self.command)


_NO_PROBE = ProbeResults()


def arg_size(n: float) -> str:
    """A size as a command-line argument: ``19.5GiB``, rounded down to 0.5 GiB / 1 MiB.

    Args:
        n: bytes.
    """
    if n >= 2**30:
        return f"{max(0.5, math.floor(n / 2**29) / 2):g}GiB"
    return f"{max(1, int(n // MiB))}MiB"


def percent(part: float, whole: float) -> str:
    """``part`` as a share of ``whole``: ``"25 %"`` (``"n/a"`` of nothing)."""
    return f"{100 * part / whole:.0f} %" if whole else "n/a"


def array_names(array: Mapping[str, Any], i: int) -> tuple[str, str]:
    """``(feature, variable)`` for an array of fit's arguments: ``("x", "x_train")``.

    Args:
        array: an array's record from the probe (``names``: the argument first, then the
            variables that hold it).
        i: its position, for names made up when it has none that is an identifier.
    """
    names = list(array.get("names", ()))
    arg = names[0] if names else f"a{i}"
    feature = arg if arg.isidentifier() else f"f{i}"
    variables = [n for n in names[1:] if n.isidentifier()]
    return feature, variables[0] if variables else (arg if arg.isidentifier() else f"array{i}")


def describe_array(a: Mapping[str, Any]) -> str:
    """``x_train: float32 (6000, 48, 64) 70.3 MiB`` or, for a container of small arrays,
    ``samples: a list of 6,000 tuples of float32/int32 arrays, 70.4 MiB``.

    Args:
        a: an array's record from the probe.
    """
    name = (a.get("names") or ["unnamed"])[0]
    if a.get("container"):
        return (f"{name}: a {a['container']} of {a['dtype']} arrays ({a['shape'][0]:,} "
                f"arrays, {format_size(a['nbytes'])})")
    return f"{name}: {a['dtype']} {tuple(a['shape'])} {format_size(a['nbytes'])}"
