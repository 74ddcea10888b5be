"""What the doctor's rules read and what they return: :class:`Facts` and :class:`Finding`.

:class:`Facts` holds one run's measurements: the in-process probe's results (a plain dict,
see :func:`memfit.doctor.probe.finish`) and the process tree's memory seen from outside.
A rule (:mod:`memfit.doctor.findings` lists them) reads the facts and returns a
:class:`Finding`: the numbers measured, why they matter, the fix and the memory at stake.
The small helpers below word the numbers the same way in every rule.

Example:
    >>> facts = Facts(command=("python", "train.py"), probe=None, peak_anon=2**30)
    >>> facts.peak, facts.cmd, arg_size(1.7 * 2**30), percent(1, 4)
    (1073741824, 'python train.py', '1.5GiB', '25 %')
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from memfit.sizes import format_size

__all__ = ["Finding", "Facts", "arg_size", "percent", "array_names", "describe_array"]

MiB = 2**20


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
        probe: the in-process probe's results (:func:`memfit.doctor.probe.finish`), or
            ``None`` when the command has no Python process that imported Keras.
        peak_anon: peak anonymous RSS of the whole process tree (from outside).
        watch_verdict: the verdict from outside (:class:`memfit.memory.Verdict` record).
        ram_total: the machine's memory, in bytes.
    """

    command: Sequence[str]
    probe: Mapping[str, Any] | None
    peak_anon: int | None = None
    watch_verdict: Mapping[str, Any] | None = None
    ram_total: int | None = None

    @property
    def peak(self) -> int:
        """The largest anonymous RSS seen, from inside or outside (0 if none)."""
        inside = (self.probe or {}).get("rss_peak_steps") or 0
        return max(inside, self.peak_anon or 0)

    @property
    def measurements(self) -> Mapping[str, Any]:
        """The probe's results, or an empty mapping without a probe."""
        return self.probe or {}

    @property
    def fit(self) -> Mapping[str, Any]:
        """What the largest ``fit`` call trained on (arrays, pipeline, batch size...)."""
        return self.measurements.get("fit") or {}

    @property
    def alive(self) -> list[Mapping[str, Any]]:
        """The largest arrays alive at the end of the run, memory-mapped ones left out."""
        return [a for a in (self.measurements.get("arrays") or {}).get("largest", [])
                if not a["mapped"]]

    @property
    def containers(self) -> list[Mapping[str, Any]]:
        """Python containers of many small arrays alive at the end (a list of tuples...)."""
        return [a for a in (self.measurements.get("arrays") or {}).get("largest", [])
                if a.get("container")]

    @property
    def given(self) -> list[Mapping[str, Any]]:
        """The arrays given to ``fit``, memory-mapped ones left out."""
        return [a for a in self.fit.get("arrays", []) if not a["mapped"]]

    @property
    def first_step_growth(self) -> int | None:
        """How much anonymous RSS grew from the call of ``fit`` to its first step (Keras
        copying in-memory arrays, a shuffle buffer filling), or ``None`` if not measured."""
        before = self.measurements.get("rss_before_fit")
        first = self.measurements.get("rss_first_step")
        return None if before is None or first is None else max(0, first - before)

    @property
    def cmd(self) -> str:
        """The command, quoted as a shell would take it."""
        return shlex.join(self.command)


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
