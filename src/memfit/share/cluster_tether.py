"""A command tethered to the process that started it: when that one dies, the command is
sent SIGTERM, and its own children are its business, as after a preemption.

    python -I .../memfit/share/cluster_tether.py STARTER_PID [--status FILE] -- COMMAND...

A Ray worker that runs a memfit job starts it this way. When the worker dies (its node is
removed, its raylet crashes, the task is force-cancelled), Ray SIGKILLs the worker's
children: a job started directly would die without a checkpoint, and its own children (a
``memfit run`` supervisor's training process, data-loader workers) would live on,
orphaned, while Ray retries the job elsewhere: two copies writing one job's checkpoints.
So the worker's child is this small tether, which:

1. dies with its starter (``PR_SET_PDEATHSIG`` = SIGKILL; and exits at once if the
   starter is already gone);
2. starts ``COMMAND`` as its child with the signal mask and SIGINT/SIGTERM handlers reset
   (a Ray worker blocks SIGINT) and ``PR_SET_PDEATHSIG`` = SIGTERM: when the tether dies,
   however it dies, the command gets SIGTERM, which ``memfit.session`` answers by
   checkpointing after the current step and exiting, and ``memfit run`` passes on to its
   training process;
3. passes SIGINT and SIGTERM on to it, waits for it and exits as it did (128 + N when
   it was killed by signal N);
4. with ``--status FILE``, writes how the command ended (``{"code": N, "t": TIME,
   "pid": PID}``, JSON, under a temporary name then renamed) the instant it ends, even
   before it reaps it: once the command is gone, its end is on disk. The starter learns
   of the end later (a Ray task: its sample's wait, its log, its reply to the driver);
   should its node die in between, a retry of the task reads the file and reports the
   end instead of running the command again.

It is run as a file, not as a module of the package, and imports the standard library
only: the tether's own memory (a bare Python, about 2 MiB anonymous) is part of the job's
tree. Off Linux (no ``prctl``) the command runs untethered.

Example:
    >>> import subprocess, sys, os
    >>> out = subprocess.run(tethered([sys.executable, "-c", "print('hi')"]),
    ...                      capture_output=True, text=True)
    >>> out.stdout, out.returncode
    ('hi\\n', 0)
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import Sequence

__all__ = ["tethered", "tether_to_parent", "main"]

_PR_SET_PDEATHSIG = 1


def tethered(command: Sequence[str], starter: int | None = None,
             status: str | os.PathLike | None = None) -> list[str]:
    """``command`` run through this module: sent SIGTERM when ``starter`` dies.

    Example:
        >>> tethered(["python", "train.py"], starter=42)[-4:]
        ['42', '--', 'python', 'train.py']
        >>> tethered(["python", "train.py"], starter=42, status="exit.json")[-6:-2]
        ['42', '--status', 'exit.json', '--']
        >>> tethered(["python", "train.py"])[2].endswith("cluster_tether.py")
        True

    Args:
        command: the program and its arguments.
        starter: the process that will start it (default: this one).
        status: a file where the tether writes how the command ended, the instant it
            ends (default: none).
    """
    pid = os.getpid() if starter is None else starter
    more = [] if status is None else ["--status", os.fspath(status)]
    return [sys.executable, "-I", os.path.abspath(__file__), str(pid), *more, "--",
            *command]


def tether_to_parent(sig: int = signal.SIGTERM) -> bool:
    """Has ``sig`` sent to this process when its parent dies; ``False`` where Linux's
    ``prctl`` is not available (the process then outlives its parent as usual).

    Args:
        sig: the signal to receive.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)     # this process's symbols: libc's prctl
    return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def _clean_signals() -> None:
    """Signals blocked or ignored by the starter stay so across ``exec``: reset them."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _run_child(command: list[str], tether: int) -> None:
    """In the forked child: tethered to the tether by SIGTERM, then the command."""
    try:
        tether_to_parent(signal.SIGTERM)
        if os.getppid() != tether:
            os._exit(128 + signal.SIGTERM)
        os.execvp(command[0], command)
    except FileNotFoundError:
        os.write(2, f"command not found: {command[0]!r}\n".encode())
        os._exit(127)
    except OSError as e:
        os.write(2, f"command cannot be executed: {command[0]!r} ({e.strerror})\n".encode())
        os._exit(126)
    finally:
        os._exit(126)


def _write_status(path: str, code: int, pid: int) -> None:
    """How the command ended, in ``path`` (a temporary name, then renamed). A status that
    cannot be written only means a retry runs the command again, as before."""
    tmp = os.path.join(os.path.dirname(path) or ".",
                       f".tmp-{os.getpid()}-{os.path.basename(path)}")
    with contextlib.suppress(OSError):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"code": code, "t": time.time(), "pid": pid}, f)
        os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command tethered; returns its exit status as a shell tells it.

    Args:
        argv: ``[STARTER_PID, ["--status", FILE,] "--", COMMAND...]`` (default:
            ``sys.argv[1:]``).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    status = None
    if len(args) > 2 and args[1] == "--status":
        status = args[2]
        del args[1:3]
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print("usage: python -I cluster_tether.py STARTER_PID [--status FILE] -- "
              "COMMAND [ARGS...]", file=sys.stderr)
        return 2
    tether_to_parent(signal.SIGKILL)
    _clean_signals()
    if os.getppid() != int(args[0]):
        return 128 + signal.SIGTERM         # the starter died before the tether held
    me = os.getpid()
    child = os.fork()
    if child == 0:
        _run_child(args[2:], me)

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    # The status is written while the ended command is still a zombie (waitid's WNOWAIT),
    # then it is reaped: once the command is gone, its status is on disk.
    ended = _wait(child, os.WEXITED | os.WNOWAIT)
    code = 128 + ended.si_status if ended.si_code in (os.CLD_KILLED, os.CLD_DUMPED) \
        else ended.si_status
    if status is not None:
        _write_status(status, code, child)
    _wait(child, os.WEXITED)
    return code


def _wait(child: int, options: int) -> os.waitid_result:
    while True:
        try:
            ended = os.waitid(os.P_PID, child, options)
        except InterruptedError:
            continue
        if ended is not None:
            return ended


if __name__ == "__main__":
    raise SystemExit(main())
