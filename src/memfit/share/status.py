"""What ``memfit share`` shows while it runs: a live table on a terminal, event lines elsewhere.

On a terminal (stderr is a TTY) one table is redrawn in place (job, state, memory
now/peak/share, elapsed); lines about events (a job started, ended, stopped) are printed
above it. Elsewhere (CI logs, pipes) only the event lines are printed.

Example:
    >>> import io
    >>> s = Status(io.StringIO(), live=False)
    >>> s.event("started a")
    >>> s.out.getvalue()
    'memfit share: started a\\n'
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TextIO

from memfit.sizes import format_size

__all__ = ["Status", "Row", "table"]

Row = tuple[str, str, int | None, int | None, int, float | None]   # name, state, now, peak,
#                                                                   share, elapsed


def table(rows: Sequence[Row], header: str) -> list[str]:
    """The status table's lines: a header line, then one line per job.

    Example:
        >>> print("\\n".join(table([("a", "running", 2**20, 2**21, 2**22, 1.5)], "2 jobs")))
        2 jobs
          job  state           now       peak      share  elapsed
          a    running     1.0 MiB    2.0 MiB    4.0 MiB     1.5s
    """
    width = max([3] + [len(r[0]) for r in rows])
    lines = [header, f"  {'job':<{width}}  {'state':<9} {'now':>9}  {'peak':>9}  "
                     f"{'share':>9}  elapsed"]
    for name, state, now, peak, share, elapsed in rows:
        lines.append(f"  {name:<{width}}  {state:<9} {_size(now):>9}  {_size(peak):>9}  "
                     f"{format_size(share):>9}  "
                     f"{'' if elapsed is None else f'{elapsed:6.1f}s':>7}")
    return lines


def _size(value: int | None) -> str:
    return "-" if value is None else format_size(value)


class Status:
    """Prints events, and redraws the table in place on a terminal.

    Args:
        out: the stream (stderr by default); ``None`` prints nothing.
        live: redraw the table (default: when ``out`` is a terminal).
        every: seconds between two redraws.
    """

    def __init__(self, out: TextIO | None, *, live: bool | None = None, every: float = 0.5):
        self.out = out
        self.live = bool(out is not None and (out.isatty() if live is None else live))
        self.every = every
        self._drawn = 0
        self._last = 0.0

    def _clear(self) -> None:
        if self._drawn and self.out is not None:
            self.out.write(f"\x1b[{self._drawn}F\x1b[J")      # up N lines, clear below
            self._drawn = 0

    def event(self, text: str) -> None:
        """One line about what happened (above the table on a terminal)."""
        if self.out is None:
            return
        self._clear()
        self.out.write(f"memfit share: {text}\n")
        self._last = 0.0                # the next update redraws the table at once
        self.out.flush()

    def _draw(self, lines: list[str]) -> None:
        assert self.out is not None
        self.out.write("\n".join(lines) + "\n")
        self._drawn = len(lines)

    def update(self, rows: Sequence[Row], header: str, *, force: bool = False) -> None:
        """Redraws the table (on a terminal, at most every ``every`` seconds)."""
        if not self.live or self.out is None:
            return
        now = time.monotonic()
        if not force and now - self._last < self.every:
            return
        self._last = now
        self._clear()
        self._draw(table(rows, header))
        self.out.flush()

    def close(self) -> None:
        """Removes the live table (the summary is printed in its place)."""
        if self.live:
            self._clear()
            if self.out is not None:
                self.out.flush()
