"""Supervise training: restart the process (every N epochs, by memory, after a crash) and
resume exactly.

``memfit.run()`` / ``memfit run`` is the parent (:mod:`memfit.supervise.run`);
``memfit.session()`` is the child side inside the training script
(:mod:`memfit.supervise.session`, which imports Keras and is loaded on first use).
"""

from typing import Any

from memfit.supervise.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    CheckpointWriteError,
)
from memfit.supervise.run import ChildRun, RunResult, run

__all__ = ["Checkpoint", "CheckpointError", "CheckpointStore", "CheckpointWriteError",
           "ChildRun", "RunResult", "run", "session", "Session"]


def __getattr__(name: str) -> Any:
    if name in ("session", "Session", "SessionCallback", "SessionConfigError"):
        from memfit.supervise import session as module

        return getattr(module, name)
    raise AttributeError(f"module 'memfit.supervise' has no attribute {name!r}")
