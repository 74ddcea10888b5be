"""Supervise training: restart the process (every N epochs, by memory, after a crash) and
resume exactly.

``memfit.run()`` / ``memfit run`` is the parent (:mod:`memfit.supervise.run`, its
results in :mod:`~memfit.supervise.results`);
``memfit.session()`` is the child side inside the training script
(:mod:`memfit.supervise.session`, which imports Keras and is loaded on first use), with
its callback (:mod:`~memfit.supervise.callback`), what a checkpoint holds
(:mod:`~memfit.supervise.state`, :mod:`~memfit.supervise.checkpoint`,
:mod:`~memfit.supervise.snapshot`, :mod:`~memfit.supervise.metrics`,
:mod:`~memfit.supervise.rng`) and SIGTERM handling (:mod:`~memfit.supervise.preempt`).
:mod:`~memfit.supervise.protocol` is how the two talk.
"""

from typing import Any

from memfit.supervise.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    CheckpointWriteError,
)
from memfit.supervise.results import ChildRun, RunResult
from memfit.supervise.run import run
from memfit.supervise.state import CheckpointState

__all__ = ["Checkpoint", "CheckpointError", "CheckpointState", "CheckpointStore",
           "CheckpointWriteError", "ChildRun", "RunResult", "run", "session", "Session"]


def __getattr__(name: str) -> Any:
    if name in ("session", "Session", "SessionConfigError"):
        from memfit.supervise import session as module

        return getattr(module, name)
    if name == "SessionCallback":
        from memfit.supervise.callback import SessionCallback

        return SessionCallback
    raise AttributeError(f"module 'memfit.supervise' has no attribute {name!r}")
