"""What a measuring child tells its parent: one JSON object per line on stdout, behind
:data:`MARKER`, named by a :class:`Report`.

The child (:mod:`memfit.estimate.child`) writes them with :func:`emit`; the parent
(:func:`memfit.estimate.measure.run_child`) reads them back with :func:`read_reports`,
ignoring every other line (a model's own prints, TensorFlow's).

Example:
    >>> line = MARKER + '{"event": "result", "measured": 1024}'
    >>> read_reports("hello from the model\\n" + line)
    {'result': {'event': 'result', 'measured': 1024}}
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Any

__all__ = ["MARKER", "Report", "emit", "read_reports"]

MARKER = "MEMFIT-CHILD "


class Report(StrEnum):
    """The reports a measuring child writes (see :mod:`memfit.estimate.child`)."""

    BASELINE = "baseline"       # the framework baseline, after importing TensorFlow
    RESULT = "result"           # what the child was asked for
    ERROR = "error"             # ``kind``: ``"input"`` (bad model...) or ``"oom"``


def emit(event: Report, **fields: Any) -> None:
    """Writes one report line for the parent."""
    sys.stdout.write(MARKER + json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def read_reports(text: str) -> dict[str, dict]:
    """The reports in a child's stdout by name (the last of each name)."""
    reports = {}
    for line in text.splitlines():
        if line.startswith(MARKER):
            record = json.loads(line[len(MARKER):])
            reports[record["event"]] = record
    return reports
