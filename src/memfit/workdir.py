"""The one workdir layout of a training run: log, report and checkpoints side by side.

    WORKDIR/
      memory.jsonl      the shared JSON-lines memory log (monitor, watch, run, share)
      timeline.png      the memory timeline drawn by `memfit report`
      report.html       the self-contained report
      checkpoints/      checkpoints of `memfit run` / `memfit.session()`

Example:
    >>> import tempfile
    >>> wd = Workdir(tempfile.mkdtemp() + "/run").create()
    >>> wd.log.name
    'memory.jsonl'
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from memfit.env import WORKDIR_ENV
from memfit.errors import MemfitError

__all__ = ["Workdir", "LOG_NAME", "default_workdir"]

LOG_NAME = "memory.jsonl"
# Set by `memfit watch` (and later `run`, `share`) for the command they start, so that a
# MemoryMonitor inside it writes to the same workdir without being told.


def default_workdir(fallback: str = "memfit-workdir") -> str:
    """The workdir a supervising memfit process named (``$MEMFIT_WORKDIR``), else ``fallback``."""
    return os.environ.get(WORKDIR_ENV) or fallback


@dataclasses.dataclass(frozen=True)
class Workdir:
    """Paths of one run's workdir. ``create()`` makes it and checks it is writable."""

    path: Path

    def __init__(self, path: str | os.PathLike):
        object.__setattr__(self, "path", Path(path))

    @property
    def log(self) -> Path:
        return self.path / LOG_NAME

    @property
    def timeline(self) -> Path:
        return self.path / "timeline.png"

    @property
    def report(self) -> Path:
        return self.path / "report.html"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def create(self) -> Workdir:
        """Creates the directory (and parents); raises a clear error if it is not writable.

        Raises:
            MemfitError: if the path is a file or cannot be written.
        """
        if self.path.exists() and not self.path.is_dir():
            raise MemfitError(f"The workdir {str(self.path)!r} is a file, not a directory. "
                              f"Choose a directory path.")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MemfitError(f"Cannot create the workdir {str(self.path)!r}: {e.strerror}. "
                              f"Choose a writable directory.") from None
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise MemfitError(f"The workdir {str(self.path)!r} is not writable. Choose a "
                              f"writable directory.")
        return self
