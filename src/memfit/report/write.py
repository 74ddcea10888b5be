"""``write_report``: the PNG and the HTML of a run, written side by side, atomically.

Example:
    >>> from memfit.report import write_report
    >>> result = write_report("runs/exp1")                 # doctest: +SKIP
    >>> result.html, result.png                            # doctest: +SKIP
    (PosixPath('runs/exp1/report.html'), PosixPath('runs/exp1/timeline.png'))
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from memfit.atomic import write_text_atomic
from memfit.errors import MemfitError
from memfit.report.data import load
from memfit.report.page import render
from memfit.report.summary import (
    ProcessSummary,
    VerdictSummary,
    doctor_findings,
    summarize,
    verdicts,
)
from memfit.report.timeline_plot import timeline
from memfit.workdir import LOG_NAME, Workdir

__all__ = ["ReportResult", "write_report", "output_paths"]


@dataclasses.dataclass(frozen=True)
class ReportResult:
    """What :func:`write_report` wrote and found.

    Attributes:
        html: the self-contained report.
        png: the timeline image (also embedded in the HTML).
        summary: one :class:`~memfit.report.summary.ProcessSummary` per process.
        verdicts: the verdict(s) shown in the report.
        doctor: what ``memfit doctor`` found, in one line, where it ran on this log.
    """

    html: Path
    png: Path
    summary: tuple[ProcessSummary, ...]
    verdicts: tuple[VerdictSummary, ...]
    doctor: str | None = None

    @property
    def headline(self) -> str:
        """The verdict headline(s), one line each (``pid N: `` in front when per process)."""
        return "\n".join(f"pid {v.pid}: {v.headline}" if v.origin == "computed" else v.headline
                         for v in self.verdicts)


def output_paths(log: Path, output: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """Where the HTML and the PNG go.

    Without ``output``: a workdir's ``report.html`` and ``timeline.png`` when the log is a
    workdir's ``memory.jsonl``, else ``NAME.report.html`` and ``NAME.timeline.png`` next to
    the log ``NAME.jsonl``. With ``output``: a directory (existing, or a path ending in
    ``/``) gets ``report.html`` and ``timeline.png``; a file ``OUT.html`` gets ``OUT.png``
    beside it (``timeline.png`` beside a ``report.html``).

    Raises:
        ValueError: if ``output`` ends in ``.png`` (it names the HTML file).
    """
    if output is None:
        if log.name == LOG_NAME:
            wd = Workdir(log.parent)
            return wd.report, wd.timeline
        return log.with_name(f"{log.stem}.report.html"), log.with_name(f"{log.stem}.timeline.png")
    out = Path(output)
    if out.is_dir() or str(output).endswith(("/", os.sep)):
        wd = Workdir(out)
        return wd.report, wd.timeline
    if out.suffix.lower() == ".png":
        raise ValueError(f"output names the HTML report (the PNG is written beside it); give a "
                         f".html path or a directory. Received: output={str(out)!r}")
    if out.name == Workdir(out.parent).report.name:
        return out, Workdir(out.parent).timeline
    return out, out.with_suffix(".png")


def write_report(source: str | os.PathLike,
                 output: str | os.PathLike | None = None) -> ReportResult:
    """Writes the memory timeline (PNG) and a self-contained HTML report of a run.

    Example:
        >>> import memfit.report
        >>> r = memfit.report.write_report("runs/exp1")            # doctest: +SKIP
        >>> print(r.html, r.headline)                              # doctest: +SKIP
        runs/exp1/report.html leak: +932.2 MiB after warm-up, +233.1 MiB/epoch over 6 epochs

    Args:
        source: a workdir or a memfit log file.
        output: the HTML file to write, or a directory for ``report.html`` (see
            :func:`output_paths` for the defaults). The PNG is written beside it.

    Returns:
        A :class:`ReportResult`.

    Raises:
        LogError: if ``source`` is not a readable memfit log or workdir.
        MemfitError: if the report cannot be written where asked.
        ValueError: if ``output`` names a ``.png``.
    """
    data = load(source)
    html_path, png_path = output_paths(data.log, output)
    summary, judged = summarize(data), verdicts(data)
    try:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        timeline(data, png_path)
        write_text_atomic(html_path, render(data, png_path.read_bytes(), summaries=summary,
                                            judged=judged))
    except OSError as e:
        raise MemfitError(f"Cannot write the report to {str(html_path)!r}: "
                          f"{e.strerror or e}. Choose a writable path with -o/output=.") from None
    return ReportResult(html_path, png_path, summary, judged, doctor_findings(data))
