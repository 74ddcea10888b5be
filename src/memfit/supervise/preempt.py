"""Preemption: a SIGTERM while ``fit`` runs becomes a checkpoint after the current step.

Kubernetes, Slurm and spot instances send SIGTERM some seconds before they kill. While
a session's ``fit`` runs, :class:`SigtermGuard` catches it and hands it to the session,
which finishes the current step (or, during validation, the current validation batch),
checkpoints and exits with ``128 + SIGTERM`` (143). Outside ``fit`` (it ended by an
exception, or has not begun), and in a script that set a SIGTERM handler of its own,
the signal keeps its usual effect.

Example:
    >>> guard = SigtermGuard(on_signal=print)
    >>> guard.release()                     # nothing installed: nothing to give back
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["SigtermGuard"]


class SigtermGuard:
    """Catches SIGTERM while one model's ``fit`` runs.

    Args:
        on_signal: called with the signal's number when it arrives inside ``fit``
            (:meth:`memfit.supervise.session.Session.preempt`).
    """

    def __init__(self, on_signal: Callable[[int], None]):
        self._on_signal = on_signal
        self._model: Any = None
        self._previous: Any = None

    def install(self, model: Any) -> None:
        """Catches SIGTERM from now on, while ``model.fit`` is on the stack (on the main
        thread only; a handler the script set itself is left alone)."""
        if threading.current_thread() is not threading.main_thread() \
                or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        self._model = model
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def release(self) -> None:
        """Gives SIGTERM back its previous handler."""
        self._model = None
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self._model is None or not _fitting(frame, self._model):
            # fit ended by an exception (no on_train_end): the signal's default effect
            self.release()
            os.kill(os.getpid(), signum)
            return
        self._on_signal(signum)


def _fitting(frame: Any, model: Any) -> bool:
    """Whether ``model``'s ``fit`` is on the interrupted stack."""
    while frame is not None:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return True
        frame = frame.f_back
    return False
