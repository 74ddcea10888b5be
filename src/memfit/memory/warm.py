"""A warm parent: a Python that has imported the frameworks, forking processes that skip it.

``import tensorflow`` costs 3-10 s of CPU on a 2-core machine; every restart under
``memfit run`` and every measuring child of ``memfit find-batch-size`` paid it again. A
:class:`WarmParent` is a small process that imports the frameworks once (no op run, no
model built), then forks one process for each :meth:`WarmParent.start`: a script run as
``python script.py`` would run it, or a module as ``python -m module`` would. Each forked
process can write its output to files of its own (``output``), and its exit status is
reported back through the warm parent (:class:`WarmChild` looks like a
:class:`subprocess.Popen`).

When that fork is safe, measured on TensorFlow 2.21 / Keras 3 (docs/supervise.md): after
the imports, TensorFlow's eager context is not initialised (no device, no thread pool,
oneDNN untouched until the first op) and the only threads besides the main one are
OpenBLAS's pools, which OpenBLAS stops before a fork and restarts after it. Python's
``random`` reseeds itself in a forked process; NumPy's global generator is reseeded here,
so each process draws fresh entropy as a new interpreter would. The callers decide where
a warm start is allowed (:mod:`memfit.supervise.warm` for ``memfit run``,
:mod:`memfit.estimate.measure` for measuring children).

A process may still set a variable the frameworks read when imported (``KERAS_BACKEND``,
``TF_*``, ``CUDA_*``...) before it imports them. In a forked process an audit hook sees
every ``os.environ`` change: one that gives such a variable a value other than the one
the warm parent imported under stops the process at once, before it uses the frameworks,
with ``memfit.exitcodes.START_COLD`` (76), for its caller to start it again as a new
interpreter (:func:`changed_environment` checks the same on demand).

Example:
    >>> parent = WarmParent(sys.executable, (), ("json",), {})          # doctest: +SKIP
    >>> with parent.open() as p:                                        # doctest: +SKIP
    ...     p.start({}, ["-m", "json.tool", "--help"], module="json.tool").wait()
    0
    >>> changed_environment() is None       # this process was not forked by one
    True
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from memfit import exitcodes
from memfit.lifeline import die_with_parent
from memfit.memory.process import running, start

__all__ = ["WarmParent", "WarmChild", "WarmStartError", "changed_environment",
           "IMPORT_TIME_PREFIXES", "COLD_MARK", "cold_reason", "serve"]

# Environment variables read when the frameworks are imported (or their libraries
# loaded): a process that gives one a new value itself must start as a new interpreter.
# (XLA_FLAGS is not one: XLA reads it when a backend first starts, which the warm parent
# never does; memfit's deterministic sessions set it.)
IMPORT_TIME_PREFIXES = ("KERAS_", "TF_", "TENSORFLOW_", "JAX_", "CUDA_", "NVIDIA_",
                        "OMP_", "OPENBLAS_", "MKL_", "KMP_")
# ... except TensorFlow's C++ log levels, which change only how much it prints (and
# memfit filters its start-up lines anyway).
_LOG_ONLY = ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE")
#: How the line a forked process prints before it asks to start cold begins.
COLD_MARK = "memfit: "


class WarmStartError(Exception):
    """The warm parent could not start, or stopped answering; the run goes on cold."""


class WarmChild:
    """A process forked by the :class:`WarmParent`, seen as a :class:`subprocess.Popen`
    (``pid``, ``poll``, ``wait``, ``send_signal``, ``returncode``): it is the warm
    parent's child, not this process's, so its exit status comes from the warm parent.
    """

    def __init__(self, pid: int, parent: WarmParent, args: Sequence[str]):
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self.lost = False           # its exit status was lost with the warm parent
        self._parent = parent

    def poll(self) -> int | None:
        if self.returncode is None:
            self._parent.collect(self, timeout=0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._parent.collect(self, timeout=timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WarmParent:
    """A warm parent: started by :meth:`open`, it forks a process for each :meth:`start`,
    and exits when :meth:`close` closes its pipe.

    Example:
        >>> parent = WarmParent("python", ("-u",), ("keras",), env)  # doctest: +SKIP
        >>> with parent.open():                                      # doctest: +SKIP
        ...     child = parent.start(env, ["train.py"], script="/abs/train.py")
        ...     child.wait()

    Args:
        python: the interpreter to start it with.
        flags: interpreter options it takes too (``-u``, ``-B``).
        modules: what it imports, in order, before it says it is ready.
        env: variables added to this process's environment for the warm parent (the
            children's environment: each child gets the same, as given to ``start``).
        stdout, stderr: open files for the output of the warm parent and of children
            started without ``output``, or ``None`` (this process's).
        tied: the warm parent dies with this process, and each child it forked with it
            (Linux's parent-death signal): for children nobody else may watch, such as
            measuring children held to a budget by this process alone.
    """

    def __init__(self, python: str, flags: Sequence[str], modules: Sequence[str],
                 env: Mapping[str, str], *, stdout: IO | None = None,
                 stderr: IO | None = None, tied: bool = False):
        self.python, self.flags, self.modules = python, tuple(flags), tuple(modules)
        self.tied = tied
        self.env = dict(env)
        self.stdout, self.stderr = stdout, stderr
        self.proc: subprocess.Popen | None = None
        self.ready: dict[str, Any] = {}
        self._to: IO | None = None
        self._from: IO | None = None
        self._buffer = b""

    def open(self, timeout: float = 300.0, interrupted: Sequence[int] = ()) -> WarmParent:
        """Starts the warm parent and waits until it has imported the frameworks.

        Raises:
            WarmStartError: it could not import them, or exited (the reason in one line).
        """
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        code = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "try:\n    from memfit.memory.warm import serve\n"
                "except ImportError:\n    raise SystemExit(3)\n"
                f"serve({to_child}, {from_child}, {list(self.modules)!r}, "
                f"tied_to={os.getpid() if self.tied else None!r})\n")
        try:
            self.proc = start([self.python, *self.flags, "-c", code], self.env,
                              stdout=self.stdout, stderr=self.stderr,
                              pass_fds=(to_child, from_child))
        finally:
            os.close(to_child)
            os.close(from_child)
        self._to = os.fdopen(from_parent, "wb", buffering=0)
        self._from = os.fdopen(to_parent, "rb", buffering=0)
        try:
            message = self._read(timeout, interrupted)
        except BaseException:       # Ctrl-C while it imports: it has nothing to finish
            self.proc.kill()
            self.close()
            raise
        if message is None or message.get("event") != "ready":
            self.close()
            why = message.get("error") if message else None
            code = self.proc.poll()
            if why is None and code == 3:           # the ImportError above
                why = (f"{self.python} cannot import memfit: it is not the Python that "
                       f"memfit is installed in ({sys.executable}); give that one's path, "
                       f"or activate its environment")
            raise WarmStartError(why or f"the warm parent ended before it was ready "
                                 f"(exit {code})")
        self.ready = message
        return self

    def __enter__(self) -> WarmParent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, env: Mapping[str, str], argv: Sequence[str], *, script: str | None = None,
              module: str | None = None, output: tuple[str, str] | None = None,
              who: str = "memfit run") -> WarmChild:
        """Forks one process with ``env`` added to this process's environment: it runs
        ``script`` (an absolute path) as ``python script.py`` would, or ``module`` as
        ``python -m module`` would, with ``sys.argv`` set to ``argv``.

        Args:
            env: its environment, beyond this process's.
            argv: its ``sys.argv`` (for a module, ``argv[0]`` becomes the module's path).
            script, module: what it runs (one of them).
            output: paths of two existing files its stdout and stderr are written to
                (``None``: the warm parent's).
            who: what starts it again as a new interpreter if it changes a variable
                read at import (named in the line it prints then).

        Raises:
            WarmStartError: the warm parent is gone or did not answer.
        """
        # A signal memfit run ignores (its shell's `&` in a script: SIGINT) stays ignored
        # in the training, as it does in a new interpreter (forward_signals keeps it).
        ignored = [int(s) for s in (signal.SIGINT, signal.SIGTERM)
                   if signal.getsignal(s) == signal.SIG_IGN]
        if (script is None) == (module is None):
            raise ValueError("give a script or a module to run")
        request = {"argv": list(argv), "script": script, "module": module,
                   "output": list(output) if output else None, "who": who,
                   "env": {**os.environ, **env}, "cwd": os.getcwd(), "ignored": ignored}
        try:
            assert self._to is not None
            self._to.write(json.dumps(request).encode() + b"\n")
        except (OSError, AssertionError) as e:
            raise WarmStartError(f"the warm parent is gone ({e})") from None
        message = self._read(60.0, ())
        if message is None or message.get("event") != "forked":
            raise WarmStartError("the warm parent did not fork the process")
        return WarmChild(int(message["pid"]), self, argv)

    def collect(self, child: WarmChild, timeout: float | None) -> None:
        """Sets ``child.returncode`` if the warm parent reports its exit within
        ``timeout`` seconds (``None``: waits)."""
        message = self._read(timeout, ())
        if message is None:
            if self._from is None or self._eof:
                # The warm parent died: its status report is lost. Wait for the process
                # itself to be gone, then report it as killed.
                if not running(child.pid):
                    child.returncode = -signal.SIGKILL
                    child.lost = True
            return
        if message.get("event") == "exited" and message.get("pid") == child.pid:
            child.returncode = int(message["returncode"])

    _eof = False

    def _read(self, timeout: float | None, interrupted: Sequence[int]) -> dict[str, Any] | None:
        """The next message, or ``None`` at a timeout, an interruption or the end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            if self._from is None or self._eof or interrupted:
                return None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = 0.2 if left is None else min(0.2, left)
            ready, _, _ = select.select([self._from], [], [], step)
            if ready:
                chunk = os.read(self._from.fileno(), 65536)
                if not chunk:
                    self._eof = True
                    return None
                self._buffer += chunk
            elif left is not None and left <= 0:
                return None
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    @property
    def alive(self) -> bool:
        """Whether the warm parent still runs and answers."""
        return self.proc is not None and self.proc.poll() is None and not self._eof

    def close(self) -> None:
        """Ends the warm parent (it exits when its pipe closes; killed if it does not)."""
        for f in (self._to, self._from):
            if f is not None:
                f.close()
        self._to = self._from = None
        if self.proc is not None and self.proc.poll() is None:
            try:
                # one still importing (a Ctrl-C meanwhile) has no child to wait for
                self.proc.wait(timeout=5 if self.ready else 0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---- the warm parent's side ------------------------------------------------------------

_inherited: dict[str, str] | None = None     # set in a forked child: its environment then
_who = "memfit run"                           # in a forked child: what starts it again cold


def changed_environment() -> str | None:
    """In a process a warm parent forked: the first variable read at import time whose
    value now differs from the one the frameworks were imported under (the script set
    it itself), as ``"KERAS_BACKEND='jax' (...)"``; else ``None``."""
    if _inherited is None:
        return None
    now = dict(os.environ)
    for name in sorted(set(now) | set(_inherited)):
        problem = _conflict(name, now.get(name))
        if problem is not None:
            return problem
    return None


def _conflict(name: str, value: str | None) -> str | None:
    """Why giving ``name`` the value ``value`` in a forked child contradicts what the
    warm parent imported, or ``None``."""
    if _inherited is None or not name.startswith(IMPORT_TIME_PREFIXES) or name in _LOG_ONLY:
        return None
    if name == "KERAS_BACKEND" and "keras" in sys.modules:
        loaded = sys.modules["keras"].config.backend()
        if value in (None, loaded):
            return None
        return f"KERAS_BACKEND={value!r} (the warm parent imported Keras on {loaded!r})"
    before = _inherited.get(name)
    if value == before:
        return None
    return f"{name}={value!r} (the warm parent imported the frameworks with {before!r})"


def _watch_environment(event: str, args: tuple) -> None:
    """An audit hook in a forked child: a script that gives a variable read at import a
    new value (``os.environ[...] = ...``) stops there, before it uses the frameworks
    imported under the old one, and asks to be started as a new interpreter."""
    if event not in ("os.putenv", "os.unsetenv"):
        return
    name = os.fsdecode(args[0])
    value = os.fsdecode(args[1]) if event == "os.putenv" else None
    problem = _conflict(name, value)
    if problem is None:
        return
    print(f"{COLD_MARK}{_setter()} sets {problem}; {_who} starts it again as a new "
          f"interpreter (set it in the environment {_who} starts in, to keep warm starts)",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(exitcodes.START_COLD)


def _setter() -> str:
    """The file whose code is setting the variable (a model module, not the measuring
    child that imported it): the innermost caller outside ``os`` and this module."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name == __file__ or name.endswith(("/os.py", "<frozen os>"))):
            return os.path.basename(name)
        frame = frame.f_back
    return os.path.basename(sys.argv[0])


def cold_reason(stderr: str) -> str | None:
    """Why a forked process asked to start again cold, from what it wrote to stderr
    (the line of :data:`COLD_MARK`), or ``None``.

    Example:
        >>> cold_reason("memfit: m.py sets TF_X='1' (...); memfit starts it again as a new "
        ...             "interpreter (...)")
        "m.py sets TF_X='1' (...)"
    """
    for line in reversed(stderr.splitlines()):
        if line.startswith(COLD_MARK) and "starts it again as a new interpreter" in line:
            return line[len(COLD_MARK):].split("; ", 1)[0]
    return None


def serve(requests: int, replies: int, modules: Sequence[str],
          tied_to: int | None = None) -> None:
    """The warm parent's main loop (:meth:`WarmParent.open` starts it; not for direct
    use): imports ``modules``, says it is ready, then forks a process for each request
    and reports its exit, until the request pipe closes.

    Args:
        requests: the descriptor requests are read from (one JSON object a line).
        replies: the descriptor replies are written to.
        modules: what to import first.
        tied_to: the pid of the process that started this one: die with it, and have
            each fork die with this one (``None``: outlive it, as ``memfit run``'s does).
    """
    import importlib

    if tied_to is not None:
        die_with_parent(tied_to)
    started = time.perf_counter()
    out = os.fdopen(replies, "wb", buffering=0)

    def reply(**fields: Any) -> None:
        out.write(json.dumps(fields).encode() + b"\n")

    try:
        for name in modules:
            importlib.import_module(name)
    except BaseException as e:          # the cold start will show the user the error
        reply(event="failed", error=f"importing {name} failed ({type(e).__name__}: {e})")
        raise SystemExit(3) from None
    reply(event="ready", modules=list(modules), seconds=round(time.perf_counter() - started, 3),
          threads=len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task")
          else None)
    source = os.fdopen(requests, "rb", buffering=0)
    me = os.getpid()
    for line in source:
        request = json.loads(line)
        sys.stdout.flush()              # nothing buffered here is written twice
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            source.close()
            out.close()
            if tied_to is not None:
                die_with_parent(me)
            raise SystemExit(_run(request))
        try:
            reply(event="forked", pid=pid)
            _, status = os.waitpid(pid, 0)
            reply(event="exited", pid=pid, returncode=os.waitstatus_to_exitcode(status))
        except BrokenPipeError:         # memfit run is gone: nothing left to serve
            break


def _run(request: dict[str, Any]) -> int:
    """In the forked child: become ``python script.py args`` (or ``python -m module
    args``) and run it; its exit code."""
    import runpy

    global _inherited, _who
    if request.get("output"):
        for fd, path in zip((1, 2), request["output"], strict=True):
            target = os.open(path, os.O_WRONLY | os.O_APPEND)
            os.dup2(target, fd)
            os.close(target)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for signum in request.get("ignored", ()):
        signal.signal(signum, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(request["env"])
    _inherited = dict(os.environ)
    _who = request.get("who") or _who
    sys.addaudithook(_watch_environment)
    os.chdir(request["cwd"])
    if "numpy" in sys.modules:          # as a new interpreter would: fresh entropy
        sys.modules["numpy"].random.seed()
    script, module = request.get("script"), request.get("module")
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(script) if script else os.getcwd()
    try:
        if script:
            _run_main(script)
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # as Python does: the traceback, then die by SIGINT
        # A terminal's Ctrl-C reaches this process twice (from the terminal, and passed on
        # by memfit run): the second one interrupted the printing of the first, and a
        # stranger saw three chained tracebacks through this module.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _print_script_traceback(e)
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 128 + signal.SIGINT
    except BaseException as e:
        _print_script_traceback(e)
        return 1
    return 0


def _print_script_traceback(e: BaseException) -> None:
    """The traceback ``python script.py`` prints for ``e``: from the script's own frames,
    without this module's, which a new interpreter does not have."""
    import traceback

    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb)


def _run_main(script: str) -> None:
    """Runs ``script`` as ``python script.py`` runs it: a new ``__main__`` module whose
    ``__file__`` is the absolute path, with ``sys.argv[0]`` left as given (which
    ``runpy.run_path`` would replace with the path)."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__builtins__ = builtins           # type: ignore[attr-defined]
    main.__cached__ = None                 # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    with open(script, "rb") as f:
        code = compile(f.read(), script, "exec")
    exec(code, main.__dict__)
