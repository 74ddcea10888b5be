"""Restarts that skip the import: a warm parent that forks each training process.

A restart under ``memfit run`` used to pay a new interpreter and ``import tensorflow``
(3-6 s on a 2-core machine) before it could load a checkpoint. With a warm start,
``memfit run`` first starts a small *warm parent*: the command's own Python, which
imports the frameworks the script imports (``keras``, ``tensorflow``, ``jax``; no op
run, no model built), then waits. Each training process is a ``fork`` of it that runs
the script as ``python train.py`` would, so a restart pays only the model build, the
checkpoint load and the first step's trace.

When is that fork safe? Measured on TensorFlow 2.21 / Keras 3 (docs/supervise.md):
after the imports, TensorFlow's eager context is not initialised (no device, no
thread pool, oneDNN untouched until the first op) and the only threads besides the main
one are OpenBLAS's pools (NumPy's; SciPy's under JAX), which OpenBLAS stops before a
fork and restarts after it. Python's ``random`` reseeds itself in a forked child;
NumPy's global generator is reseeded here, so each process draws fresh entropy as a new
interpreter would. :func:`plan` starts warm only where that holds and the script
cannot change what the parent imported:

- the command is ``python [-u] script.py args...`` (a script, not ``-m`` or ``-c``);
- the script imports ``keras``, ``tensorflow`` or ``jax`` (else nothing is worth
  keeping warm).

A script may still set a variable the frameworks read when imported (``KERAS_BACKEND``,
``TF_*``, ``CUDA_*``, ``XLA_*``...) before it imports them. In a forked process an audit
hook sees every ``os.environ`` change: one that gives such a variable a value other than
the one the warm parent imported under (for ``KERAS_BACKEND``: other than the backend
Keras loaded) stops the process at once, before it uses the frameworks, with
``memfit.exitcodes.START_COLD`` (76); the supervisor starts it again as a new
interpreter, and every later one so. ``memfit.session()`` checks the same once more
(:func:`changed_environment`). Setting the same value, or a TensorFlow log level, is
fine. Where any condition fails the plain restart stays, and ``memfit run`` says which
one ran and why.

Example:
    >>> plan(["python", "-c", "pass"])
    'the command is not `python script.py ...` (a warm start runs a script file)'
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from memfit import exitcodes
from memfit.memory.process import running, start

__all__ = ["Plan", "plan", "WarmParent", "WarmChild", "WarmStartError", "changed_environment",
           "IMPORT_TIME_PREFIXES", "FRAMEWORKS", "serve"]

FRAMEWORKS = ("keras", "tensorflow", "jax")     # what a warm parent imports, if the script does
# Environment variables read when those frameworks are imported (or their libraries
# loaded): a script that gives one a new value itself must start as a new interpreter.
# (XLA_FLAGS is not one: XLA reads it when a backend first starts, which the warm parent
# never does; memfit's deterministic sessions set it.)
IMPORT_TIME_PREFIXES = ("KERAS_", "TF_", "TENSORFLOW_", "JAX_", "CUDA_", "NVIDIA_",
                        "OMP_", "OPENBLAS_", "MKL_", "KMP_")
# ... except TensorFlow's C++ log levels, which change only how much it prints (and
# memfit run filters its start-up lines anyway).
_LOG_ONLY = ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE")
_FLAGS = ("-u", "-B")                           # interpreter options a warm start keeps


@dataclasses.dataclass(frozen=True)
class Plan:
    """How to start a command warm.

    Attributes:
        python: the interpreter (the command's first word).
        flags: its options that the warm parent takes too (``-u``, ``-B``).
        script: the script's absolute path.
        argv: ``sys.argv`` for the script (its path as given, then its arguments).
        modules: what the warm parent imports, in order.
    """

    python: str
    flags: tuple[str, ...]
    script: str
    argv: tuple[str, ...]
    modules: tuple[str, ...]


def plan(command: Sequence[str]) -> Plan | str:
    """How ``command`` can start warm, or why it cannot (one line).

    Args:
        command: the checked command (``["python", "train.py", "--epochs", "3"]``).

    Example:
        >>> plan(["bash", "train.sh"])
        'bash is not a Python interpreter'
    """
    program = shutil.which(command[0]) or command[0]
    name = os.path.basename(program)
    if not (name.startswith("python") or _same_file(program, sys.executable)):
        return f"{command[0]} is not a Python interpreter"
    rest = list(command[1:])
    flags: list[str] = []
    while rest and rest[0] in _FLAGS:
        flags.append(rest.pop(0))
    if not rest or rest[0].startswith("-") or not os.path.isfile(rest[0]):
        return "the command is not `python script.py ...` (a warm start runs a script file)"
    script = rest[0]
    try:
        tree = ast.parse(Path(script).read_bytes(), filename=script)
    except (OSError, SyntaxError, ValueError) as e:
        return f"{script} could not be read ahead ({type(e).__name__})"
    # What the script imports whatever it is given; else Keras where it is imported
    # later (a function, a branch), which brings the backend the environment names.
    modules = tuple(m for m in FRAMEWORKS if m in _imported_roots(tree, top=True)) or \
        tuple(m for m in FRAMEWORKS[:1] if m in _imported_roots(tree, top=False))
    if not modules:
        return f"{script} imports none of {', '.join(FRAMEWORKS)}: nothing to keep warm"
    return Plan(python=command[0], flags=tuple(flags), script=os.path.abspath(script),
                argv=tuple(rest), modules=modules)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _imported_roots(tree: ast.Module, top: bool) -> set[str]:
    """The top packages imported anywhere (``top``: unconditionally, by the module's own
    statements or a ``try`` among them)."""
    nodes: list[ast.AST] = []
    if top:
        for statement in tree.body:
            nodes += statement.body if isinstance(statement, ast.Try) else [statement]
    else:
        nodes = list(ast.walk(tree))
    roots = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


class WarmStartError(Exception):
    """The warm parent could not start, or stopped answering; the run goes on cold."""


class WarmChild:
    """A training process forked by the :class:`WarmParent`, seen as a
    :class:`subprocess.Popen` (``pid``, ``poll``, ``wait``, ``send_signal``,
    ``returncode``): it is the warm parent's child, not this process's, so its exit
    status comes from the warm parent.
    """

    def __init__(self, pid: int, parent: WarmParent):
        self.pid = pid
        self.args = list(parent.plan.argv)
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
    """The warm parent of one ``memfit run``: started by :meth:`open`, it forks a
    training process for each :meth:`start`, and exits when :meth:`close` closes its pipe.

    Example:
        >>> p = plan(["python", "train.py"])                         # doctest: +SKIP
        >>> with WarmParent(p, env) as parent:                       # doctest: +SKIP
        ...     child = parent.start(env)                            # a WarmChild
        ...     child.wait()

    Args:
        plan: what :func:`plan` answered.
        env: variables added to this process's environment for the warm parent (the
            training's environment: each child gets the same, as given to ``start``).
        stdout, stderr: open files for the training's output, or ``None`` (this one's).
    """

    def __init__(self, plan: Plan, env: Mapping[str, str], *, stdout: IO | None = None,
                 stderr: IO | None = None):
        self.plan = plan
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
                "try:\n    from memfit.supervise.warm import serve\n"
                "except ImportError:\n    raise SystemExit(3)\n"
                f"serve({to_child}, {from_child}, {list(self.plan.modules)!r})\n")
        try:
            self.proc = start([self.plan.python, *self.plan.flags, "-c", code], self.env,
                              stdout=self.stdout, stderr=self.stderr,
                              pass_fds=(to_child, from_child))
        finally:
            os.close(to_child)
            os.close(from_child)
        self._to = os.fdopen(from_parent, "wb", buffering=0)
        self._from = os.fdopen(to_parent, "rb", buffering=0)
        message = self._read(timeout, interrupted)
        if message is None or message.get("event") != "ready":
            self.close()
            why = message.get("error") if message else None
            code = self.proc.poll()
            if why is None and code == 3:           # the ImportError above
                why = (f"{self.plan.python} cannot import memfit: it is not the Python that "
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

    def start(self, env: Mapping[str, str]) -> WarmChild:
        """Forks one training process with ``env`` added to the warm parent's
        environment.

        Raises:
            WarmStartError: the warm parent is gone or did not answer.
        """
        # A signal memfit run ignores (its shell's `&` in a script: SIGINT) stays ignored
        # in the training, as it does in a new interpreter (forward_signals keeps it).
        ignored = [int(s) for s in (signal.SIGINT, signal.SIGTERM)
                   if signal.getsignal(s) == signal.SIG_IGN]
        request = {"argv": list(self.plan.argv), "script": self.plan.script,
                   "env": {**os.environ, **env}, "cwd": os.getcwd(), "ignored": ignored}
        try:
            assert self._to is not None
            self._to.write(json.dumps(request).encode() + b"\n")
        except (OSError, AssertionError) as e:
            raise WarmStartError(f"the warm parent is gone ({e})") from None
        message = self._read(60.0, ())
        if message is None or message.get("event") != "forked":
            raise WarmStartError("the warm parent did not fork the training process")
        return WarmChild(int(message["pid"]), self)

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
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---- the warm parent's side ------------------------------------------------------------

_inherited: dict[str, str] | None = None     # set in a forked child: its environment then


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
    print(f"memfit: {os.path.basename(sys.argv[0])} sets {problem}; memfit run starts it "
          f"again as a new interpreter (set it before memfit run to keep warm starts)",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(exitcodes.START_COLD)


def serve(requests: int, replies: int, modules: Sequence[str]) -> None:
    """The warm parent's main loop (``memfit run`` starts it; not for direct use):
    imports ``modules``, says it is ready, then forks a training process for each
    request and reports its exit, until the request pipe closes.

    Args:
        requests: the descriptor requests are read from (one JSON object a line).
        replies: the descriptor replies are written to.
        modules: what to import first.
    """
    import importlib

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
    for line in source:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            source.close()
            out.close()
            raise SystemExit(_run_script(request))
        try:
            reply(event="forked", pid=pid)
            _, status = os.waitpid(pid, 0)
            reply(event="exited", pid=pid, returncode=os.waitstatus_to_exitcode(status))
        except BrokenPipeError:         # memfit run is gone: nothing left to serve
            break


def _run_script(request: dict[str, Any]) -> int:
    """In the forked child: become ``python script.py args`` and run it; its exit code."""
    import runpy
    import traceback

    global _inherited
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for signum in request.get("ignored", ()):
        signal.signal(signum, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(request["env"])
    _inherited = dict(os.environ)
    sys.addaudithook(_watch_environment)
    os.chdir(request["cwd"])
    if "numpy" in sys.modules:          # as a new interpreter would: fresh entropy
        sys.modules["numpy"].random.seed()
    script = request["script"]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(script)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:       # as Python does: the traceback, then die by SIGINT
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 128 + signal.SIGINT
    except BaseException:
        traceback.print_exc()
        return 1
    return 0
