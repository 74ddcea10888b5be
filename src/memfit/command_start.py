"""The ``memfit`` command's first second: a Ctrl-C while the package imports ends it quietly.

Importing memfit (NumPy, psutil, Matplotlib's pieces, every subcommand) takes about a
second on a busy 2-core machine, before ``memfit.cli.main`` can catch anything: a Ctrl-C
there printed Python's 20-line ``KeyboardInterrupt`` traceback from deep inside an import.
``memfit/__init__.py`` calls :func:`hold_interrupts` first; in the ``memfit`` console
script only (``sys.argv[0]`` is the script pip wrote for ``memfit``), it makes SIGINT end
the process at once with status 130 and one line, as the command does later.
``memfit.cli.main`` calls :func:`release_interrupts` before it does anything else. A
program that imports memfit is never touched.

Example:
    >>> import signal
    >>> hold_interrupts(argv0="python")          # not the memfit command: nothing changes
    False
    >>> signal.getsignal(signal.SIGINT) is signal.default_int_handler
    True
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["hold_interrupts", "release_interrupts"]


def _end_quietly(signum: int, frame: object) -> None:
    os.write(2, b"memfit: interrupted\n")
    os._exit(128 + signal.SIGINT)


def _is_console_script(path: str) -> bool:
    """Whether ``path`` is the small script pip writes for ``memfit`` (not a user's own
    program that happens to be called memfit)."""
    try:
        with open(path, "rb") as f:
            return b"from memfit.cli import main" in f.read(4096)
    except OSError:
        return False


def hold_interrupts(argv0: str | None = None) -> bool:
    """In the ``memfit`` command, a SIGINT before :func:`release_interrupts` ends the
    process with status 130 and the line ``memfit: interrupted``. Returns whether it did.

    Args:
        argv0: the program's name (default: ``sys.argv[0]``).
    """
    path = argv0 if argv0 is not None else (sys.argv[0] if sys.argv else "")
    if os.path.basename(path) != "memfit" or not _is_console_script(path) or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    try:
        signal.signal(signal.SIGINT, _end_quietly)
    except ValueError:                  # not the main thread
        return False
    return True


def release_interrupts() -> None:
    """SIGINT raises ``KeyboardInterrupt`` again (when :func:`hold_interrupts` held it)."""
    if signal.getsignal(signal.SIGINT) is _end_quietly:
        signal.signal(signal.SIGINT, signal.default_int_handler)
