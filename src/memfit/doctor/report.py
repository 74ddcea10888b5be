"""What ``memfit doctor`` found, as text for people and JSON for tools.

Example:
    >>> result = DoctorResult(command=("python", "train.py"), exit_code=0, duration=9.5,
    ...                       findings=(), steps=40, stopped="steps", probe=True)
    >>> print(result)                                  # doctest: +NORMALIZE_WHITESPACE
    memfit doctor: python train.py
      40 training steps in 9.5 s (stopped by memfit doctor after 40 steps); exit code 0
    <BLANKLINE>
    No memory problem found in this run (checked: data held in RAM, memory kept after
    del, activations, memory growth, GPU sharing, input pipeline buffers).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import textwrap
from pathlib import Path
from typing import Any

from memfit.doctor.facts import Finding
from memfit.memory.classifier import TOO_SHORT
from memfit.memory.probe import Sample
from memfit.sizes import format_count, format_size

__all__ = ["DoctorResult", "format_finding", "WIDTH"]

WIDTH = 96
FORMAT = "memfit-doctor"
CHECKED = ("data held in RAM, memory kept after del, activations, memory growth, GPU "
           "sharing, input pipeline buffers")
NO_PROBE = ("The in-process probe did not report: the command ran no Python process that "
            "imported Keras, or its Python ignored $PYTHONPATH (-E, -I, -S). Only the "
            "memory seen from outside was diagnosed.")


_UNIT = re.compile(r"(\d) (B|KiB|MiB|GiB|TiB|%)(?=\W|$)")


def _wrap(label: str, text: str, indent: str = "   ") -> list[str]:
    """Wrapped to WIDTH, never between a number and its unit."""
    glued = _UNIT.sub("\\1\u00a0\\2", f"{label}{text}")
    lines = textwrap.wrap(glued, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                          break_on_hyphens=False, break_long_words=False)
    return [line.replace("\u00a0", " ") for line in lines]


def format_finding(rank: int, finding: Finding) -> str:
    """One finding as text: title, measured, why, fix (the fix lines verbatim)."""
    lines = [f"{rank}. {finding.title}   [{finding.kind}; about "
             f"{format_size(finding.bytes)} at stake]"]
    lines += _wrap("Measured: ", finding.measured)
    lines += _wrap("Why: ", finding.why)
    lines.append("   Fix:")
    lines += [f"     {line}" for line in finding.fix]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class DoctorResult:
    """One ``memfit doctor`` run: the command's outcome and the ranked findings.

    Attributes:
        command: the command run.
        exit_code: its exit code (0 when the doctor stopped it after its steps).
        duration: seconds from start to exit.
        findings: what to change, the most memory at stake first.
        steps: training steps the probe saw (``None``: no probe report).
        epochs: epoch ends the probe saw, over all ``fit`` calls.
        stopped: ``"steps"``, ``"epochs"`` or ``"seconds"`` when the doctor stopped it,
            else ``None``.
        probe: whether the in-process probe reported.
        peak: the process tree's peak sample (from outside), or ``None``.
        verdict: the memory-growth verdict used (a ``Verdict`` record plus ``basis``).
        workdir: the doctor's workdir.
        log_path: the shared memory log of the run.
        measurements: the in-process probe's results (for tools; see
            :func:`memfit.doctor.fit_probe.finish`).
        resumed: where the command's ``memfit.session()`` resumed from a checkpoint an
            earlier run left in the workdir (``epoch``, ``step``: 0-based), or ``None``.
    """

    command: tuple[str, ...]
    exit_code: int
    duration: float
    findings: tuple[Finding, ...]
    steps: int | None = None
    stopped: str | None = None
    probe: bool = False
    peak: Sample | None = None
    verdict: dict | None = None
    workdir: Path | None = None
    log_path: Path | None = None
    measurements: dict | None = dataclasses.field(default=None, repr=False)
    epochs: int | None = None
    resumed: dict | None = None

    def finding(self, kind: str) -> Finding | None:
        """The finding of this kind, or ``None``."""
        return next((f for f in self.findings if f.kind == kind), None)

    @property
    def kinds(self) -> list[str]:
        """The kinds of the findings, in rank order."""
        return [f.kind for f in self.findings]

    def to_json(self) -> dict[str, Any]:
        """A plain dict (sizes in bytes) for ``--json``."""
        return {"format": FORMAT, "command": list(self.command), "exit_code": self.exit_code,
                "duration": self.duration, "steps": self.steps, "stopped": self.stopped,
                "probe": self.probe,
                "peak": None if self.peak is None else self.peak.as_record(),
                "verdict": self.verdict,
                "findings": [dict(f.to_json(), rank=i) for i, f in
                             enumerate(self.findings, start=1)],
                "resumed": self.resumed,
                "workdir": None if self.workdir is None else str(self.workdir),
                "log": None if self.log_path is None else str(self.log_path)}

    def _headline(self) -> list[str]:
        lines = [f"memfit doctor: {shlex.join(self.command)}"]
        if self.steps is None:
            ran = f"ran {self.duration:.1f} s"
        else:
            ran = f"{format_count(self.steps, 'training step')} in {self.duration:.1f} s"
        if self.stopped == "steps":
            ran += f" (stopped by memfit doctor after {format_count(self.steps, 'step')})"
        elif self.stopped == "epochs":
            ran += f" (stopped by memfit doctor after {format_count(self.epochs, 'epoch')})"
        elif self.stopped == "seconds":
            ran += " (stopped by memfit doctor at its time limit)"
        elif self.exit_code == 0:
            ran += " (the command finished before the doctor's limit)"
        lines.append(f"  {ran}; exit code {self.exit_code}")
        if self.peak is not None:
            lines.append(f"  peak anonymous RSS {format_size(self.peak.anon_or_total)} "
                         f"(process tree), file-backed {format_size(self.peak.rss_file)}; "
                         f"log: {self.log_path}")
        return lines

    def __str__(self) -> str:
        lines = self._headline()
        if not self.probe:
            lines += [""] + textwrap.wrap(NO_PROBE, WIDTH)
        if self.resumed is not None:
            lines += [""] + textwrap.wrap(self._resumed_note(), WIDTH)
        if self.exit_code not in (0,) and self.stopped is None:
            how = ("was interrupted (Ctrl-C" if self._interrupted else "failed (") + \
                f"{', ' if self._interrupted else ''}exit code {self.exit_code})"
            lines += ["", f"The command {how} before the doctor stopped it: the findings "
                          f"cover the part that ran."]
        lines.append("")
        if not self.findings:
            failed = self.exit_code != 0 and self.stopped is None
            lines += textwrap.wrap(("No finding in the part that ran" if failed else
                                    "No memory problem found in this run")
                                   + f" (checked: {CHECKED}).{self._short()}", WIDTH)
            return "\n".join(lines)
        n = len(self.findings)
        lines.append(f"{format_count(n, 'finding')}, the most memory at stake first:")
        for rank, finding in enumerate(self.findings, start=1):
            lines += ["", format_finding(rank, finding)]
        if self._short():
            lines += [""] + textwrap.wrap(self._short().strip(), WIDTH)
        return "\n".join(lines)

    def _short(self) -> str:
        """For a run too short to judge its growth: a sentence saying so, else ``""``."""
        v = self.verdict or {}
        if v.get("verdict") != TOO_SHORT:
            return ""
        if self.resumed is not None:
            return (f" Memory growth: {v.get('headline', 'too short to judge')}: the "
                    f"script resumed where an earlier run stopped (above).")
        if self.exit_code != 0 and self.stopped is None and not self._interrupted:
            # a script that crashed is not made longer by the doctor's options
            return (f" Memory growth: {v.get('headline', 'too short to judge')}: the command "
                    f"ended with exit code {self.exit_code}; fix what stopped it (its error "
                    f"is above), then run the doctor again.")
        return (f" Memory growth: {v.get('headline', 'too short to judge')}; give the "
                f"doctor a longer run (--epochs, --steps or --seconds).")

    @property
    def _interrupted(self) -> bool:
        """The command ended by a Ctrl-C (exit 130, or killed by SIGINT)."""
        return self.exit_code in (130, -2)

    def _resumed_note(self) -> str:
        """The command resumed from an earlier run's checkpoint: what the doctor saw, and
        how to have it see the whole run."""
        r = self.resumed or {}
        where = f"epoch {r.get('epoch', 0) + 1}" + (
            f", step {r['step']}" if r.get("step") else "")
        folder = Path(self.workdir or ".") / "checkpoints"
        return (f"The script's memfit.session() resumed at {where} from a checkpoint an "
                f"earlier run left in {folder}: the doctor saw only what was left to train. "
                f"To diagnose the whole run, give the doctor a fresh --workdir, or delete "
                f"{folder}.")
