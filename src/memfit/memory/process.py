"""Starting a user's command and standing between it and the terminal.

Shared by the commands that run another program: ``memfit watch``, ``memfit run`` (and
``memfit share``). One place decides how a command is checked, started (with the
workdir handed down in ``$MEMFIT_WORKDIR``), how SIGINT/SIGTERM reach it, how its exit
status is told, and how a whole process tree is killed.

Example:
    >>> import sys
    >>> proc = start([sys.executable, "-c", "pass"], env={})
    >>> exit_code(proc.wait())
    0
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import IO

from memfit import exitcodes
from memfit.errors import MemfitError
from memfit.memory.probe import descendants
from memfit.quiet import FilteredPopen, filters_children

__all__ = ["CommandStartError", "check_command", "start", "forward_signals", "exit_code",
           "kill_tree", "ticks", "running"]


class CommandStartError(MemfitError):
    """The command could not be started; ``exit_code`` is what a shell would return.

    Attributes:
        command: the command that was given.
        exit_code: 127 (``memfit.exitcodes.NOT_FOUND``) when it does not exist, 126 when
            it cannot be executed.
    """

    def __init__(self, message: str, command: Sequence[str], exit_code: int):
        super().__init__(message)
        self.command = list(command)
        self.exit_code = exit_code


def check_command(command: Sequence[str]) -> list[str]:
    """The command as a list of strings, once its program is known to exist and be
    executable: callers check it before they create anything (a workdir, a log).

    Raises:
        ValueError: quoting what was given, for a command that is not a list of strings.
        CommandStartError: the program does not exist (127) or cannot be executed (126).
    """
    if isinstance(command, str | bytes) or not isinstance(command, Sequence):
        raise ValueError(f"command must be a list of strings, such as ['python', 'train.py'] "
                         f"(use shlex.split for a command line). Received: command={command!r}")
    if not command:
        raise ValueError("command is empty: give the program to run and its arguments, such "
                         "as ['python', 'train.py']. Received: command=[]")
    bad = [c for c in command if not isinstance(c, str | os.PathLike)]
    if bad:
        raise ValueError(f"command must hold strings only. Received: command={command!r}")
    command = [os.fspath(c) for c in command]
    program = command[0]
    if os.sep in program:
        if not os.path.exists(program):
            raise _not_found(command)
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            raise _not_executable(command)
    elif shutil.which(program) is None:
        raise _not_found(command)
    script = _python_script(command)
    if script is not None and not os.path.isfile(script):
        # Python would exit 2 at once, and memfit run would restart it for nothing.
        what = "is a directory" if os.path.isdir(script) else "does not exist"
        raise ValueError(f"the script {script!r} {what} (looked for from {os.getcwd()!r}): "
                         f"check the path. Received: command={command!r}")
    return command


# Python's options that take no value, which may come before a script's path.
_PYTHON_FLAGS = frozenset({"-u", "-B", "-O", "-OO", "-s", "-S", "-E", "-I", "-q", "-v", "-b",
                           "-bb", "-d", "-i", "-P", "-R", "-x"})


def _python_script(command: list[str]) -> str | None:
    """The script a ``python [flags] script.py ...`` command runs, where it is plain which
    (``None`` for ``-m``, ``-c``, an option that takes a value, or another program)."""
    if not os.path.basename(command[0]).startswith("python"):
        return None
    for arg in command[1:]:
        if arg in _PYTHON_FLAGS:
            continue
        return None if arg.startswith("-") or not arg.endswith(".py") else arg
    return None


def _not_found(command: list[str]) -> CommandStartError:
    return CommandStartError(
        f"command not found: {command[0]!r} (check the spelling, your PATH, or give the "
        f"program's path)", command, exitcodes.NOT_FOUND)


def _not_executable(command: list[str]) -> CommandStartError:
    return CommandStartError(
        f"command cannot be executed: {command[0]!r} (permission denied; make it "
        f"executable with chmod +x, or run it through its interpreter)", command, 126)


def start(command: list[str], env: Mapping[str, str], *, stdout: IO | None = None,
          stderr: IO | None = None, pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Starts ``command`` with this process's environment plus ``env``, and its streams
    (or the open files ``stdout``/``stderr``).

    Inside :func:`memfit.quiet.quieted` (``memfit run``, ``share`` and ``doctor`` without
    ``--verbose``), the command's stderr reaches its terminal or file through a filter
    that drops TensorFlow's start-up lines, and nothing else; its environment is the same.

    Args:
        command: the program and its arguments (see :func:`check_command`).
        env: variables to add to this process's environment.
        stdout: an open file for the command's standard output, or ``None`` (this one's).
        stderr: an open file for its standard error, or ``None`` (this one's).
        pass_fds: descriptors the command inherits (besides its streams).

    Raises:
        CommandStartError: if it does not exist (127) or cannot be executed (126).
    """
    filtered = filters_children() and (stderr is None or hasattr(stderr, "fileno"))
    popen = FilteredPopen if filtered else subprocess.Popen
    try:
        return popen(command, env={**os.environ, **env}, stdout=stdout, stderr=stderr,
                     pass_fds=tuple(pass_fds))
    except FileNotFoundError:
        raise _not_found(command) from None
    except PermissionError:
        raise _not_executable(command) from None
    except OSError as e:
        raise CommandStartError(f"command cannot be started: {command[0]!r} ({e.strerror})",
                                command, 126) from None


def ticks(proc: subprocess.Popen, interval: float) -> Iterator[float]:
    """Yields the time every ``interval`` seconds (first at once) until ``proc`` exits;
    an exit between two ticks ends the wait at once, not at the next tick."""
    next_at = time.time()
    while True:
        yield time.time()
        next_at = max(next_at + interval, time.time())
        try:
            proc.wait(timeout=max(0.0, next_at - time.time()))
            return
        except subprocess.TimeoutExpired:
            continue


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has: one nobody reaps,
    as under a container's init that does not, counts as ended).

    Example:
        >>> running(os.getpid())
        True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def exit_code(returncode: int) -> int:
    """A ``Popen.returncode`` as a shell reports it: killed by signal N gives 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def kill_tree(proc: subprocess.Popen, sig: int = signal.SIGKILL, *,
              include_self: bool = True, below: int = 0) -> None:
    """Sends ``sig`` to every process below ``proc`` (data-loader workers too) and, with
    ``include_self``, to ``proc`` itself (without: a supervisor's training process dies,
    the supervisor lives on to restart it).

    Args:
        proc: the root.
        sig: the signal.
        include_self: also signal ``proc``.
        below: spare the first ``below`` levels under ``proc`` too (1: a tether whose
            child is ``memfit run``: only the training below that supervisor dies).
    """
    for pid in descendants(proc.pid, below=below):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    if include_self:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def _terminal_sent(signum: int, pid: int) -> bool:
    """Whether a SIGINT most likely came from the terminal (Ctrl-C), which sends it to the
    whole foreground process group: the command then has it already."""
    if signum != signal.SIGINT:
        return False
    try:
        if os.getpgid(pid) != os.getpgrp():
            return False
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def forward_signals(proc: subprocess.Popen | None = None, *,
                    current: object = None) -> Iterator[list[int]]:
    """Forwards SIGINT and SIGTERM to the command while the block runs (main thread only).

    Yields a list that collects the signals received, so that a supervisor can tell an
    interrupted run from a crash. ``current`` may be a callable returning the process to
    forward to (for a supervisor that replaces its child); otherwise ``proc`` is used.

    A signal this process ignores (``memfit watch -- ... &`` in a script: the shell
    ignores SIGINT for it) stays ignored: a command started in the block would otherwise
    lose the ignore, as ``exec`` resets a caught signal to its default, and die of the
    Ctrl-C its shell meant to keep from it.
    """
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        target = current() if callable(current) else proc
        if target is not None and target.poll() is None \
                and not _terminal_sent(signum, target.pid):
            with contextlib.suppress(ProcessLookupError):
                target.send_signal(signum)

    previous = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) != signal.SIG_IGN:
                previous[signum] = signal.signal(signum, forward)
    except ValueError:          # not the main thread: signals stay as they are
        pass
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
