"""Supervise training: restart the process (every N epochs, by memory, after a crash) and
resume exactly.

``memfit.run()`` / ``memfit run`` is the parent (:mod:`memfit.supervise.supervisor`, its
results in :mod:`~memfit.supervise.run_results`);
``memfit.session()`` is the child side inside the training script
(:mod:`memfit.supervise.session`, which imports Keras and is loaded on first use), with
its callback (:mod:`~memfit.supervise.callback`), what a checkpoint holds
(:mod:`~memfit.supervise.state`, :mod:`~memfit.supervise.checkpoint`,
:mod:`~memfit.supervise.snapshot`, :mod:`~memfit.supervise.metrics`,
:mod:`~memfit.supervise.rng`) and SIGTERM handling (:mod:`~memfit.supervise.preempt`).
:mod:`~memfit.supervise.restart_protocol` is how the two talk.
"""

from typing import Any

from memfit.supervise.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    CheckpointWriteError,
)
from memfit.supervise.run_results import ChildRun, RunResult
from memfit.supervise.state import CheckpointState
from memfit.supervise.supervisor import run

__all__ = ["Checkpoint", "CheckpointError", "CheckpointState", "CheckpointStore",
           "CheckpointWriteError", "ChildRun", "RunResult", "run", "Session"]


def __getattr__(name: str) -> Any:
    if name in ("Session", "SessionConfigError"):     # memfit.session is the function
        from memfit.supervise import session as module

        return getattr(module, name)
    if name == "SessionCallback":
        from memfit.supervise.callback import SessionCallback

        return SessionCallback
    raise AttributeError(f"module 'memfit.supervise' has no attribute {name!r}")
