"""A process that must not outlive the process that started it (Linux's parent-death
signal, ``prctl(PR_SET_PDEATHSIG)``).

memfit starts helper processes whose work means nothing once their starter is gone, and
that would do harm if they went on: a pack's writer process renaming shards beside the
rerun, find-batch-size's measuring child training on, held to the budget by nobody, the
warm parent forking for a search that was killed. Each calls :func:`die_with_parent` first.

The signal is asked for by the child itself, after it started, so a starter that died in
between would never send it: the child then compares its parent with the pid it was
given, and exits at once if they differ. Linux sends the signal when the *thread* that
started the child ends; every memfit starter waits for its child in that thread. Off
Linux nothing is asked, and the process outlives its parent as usual.

(``memfit.share.cluster_tether`` keeps its own copy of the ``prctl`` call: it runs as a
file with ``python -I`` and imports the standard library only.)

Example:
    >>> import os, subprocess, sys
    >>> code = f"from memfit.lifeline import die_with_parent; die_with_parent({os.getpid()})"
    >>> subprocess.run([sys.executable, "-c", code]).returncode
    0
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Has ``sig`` sent to this process when its parent dies; exits at once (status 1)
    when ``parent`` is given and is no longer this process's parent.

    Returns ``False`` where the signal cannot be asked for (not Linux): the process then
    outlives its parent, and only the check against ``parent`` is made.

    Args:
        parent: the pid of the process that started this one (``None``: no check).
        sig: the signal to receive when the parent dies.
    """
    held = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)   # this process's symbols: libc's
            held = libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
        except (OSError, AttributeError):
            held = False
    if parent is not None and os.getppid() != parent:   # it died before the signal held
        os._exit(1)
    return held
