"""Reports from any memfit log: a memory timeline (PNG) and a self-contained HTML page.

Example:
    >>> import memfit.report
    >>> data = memfit.report.load("runs/exp1")                      # doctest: +SKIP
    >>> memfit.report.timeline(data, "timeline.png")                # doctest: +SKIP
    PosixPath('timeline.png')
    >>> memfit.report.write_report("runs/exp1").html                # doctest: +SKIP
    PosixPath('runs/exp1/report.html')
"""

from memfit.report.data import ProcessData, RunData, load
from memfit.report.summary import ProcessSummary, VerdictSummary
from memfit.report.timeline_plot import timeline
from memfit.report.write import ReportResult, write_report

__all__ = ["ProcessData", "ProcessSummary", "ReportResult", "RunData", "VerdictSummary", "load",
           "timeline", "write_report"]
