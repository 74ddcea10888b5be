"""The import hook that ``memfit doctor`` puts into the command's Python processes.

Loaded at interpreter start by the ``sitecustomize.py`` that :mod:`memfit.doctor.site`
writes (by file path, so that nothing but the standard library is imported before the
script runs). It waits for ``keras`` to be imported; only then does it import memfit's
probe (:mod:`memfit.doctor.fit_probe`), which patches ``keras.Model.fit``. A script that
never imports Keras is left alone. Given a time limit (the shim passes the value of
:data:`memfit.env.DOCTOR_SECONDS_ENV`) it also starts the wall-clock deadline, counted
from the interpreter's start. It reads no environment variable itself: the shim, whose
text is written with the names of :mod:`memfit.env`, decides whether to load it at all.

Example:
    >>> import sys
    >>> finder = install("120.0")       # doctest: +SKIP
    >>> finder in sys.meta_path         # doctest: +SKIP
    True
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import threading
import time
from typing import Any

__all__ = ["install", "KerasFinder"]

STARTED = time.time()            # the interpreter's start, near enough: the deadline's origin
_WARNED: list[bool] = []


def _warn(message: str) -> None:
    if not _WARNED:
        _WARNED.append(True)
        sys.stderr.write(f"memfit doctor: {message}\n")


def _probe() -> Any:
    """memfit's probe module, adding memfit's own directory to ``sys.path`` if needed."""
    try:
        from memfit.doctor import fit_probe
    except ImportError:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if root not in sys.path:
            sys.path.append(root)
        from memfit.doctor import fit_probe
    return fit_probe


def _keras_loaded(module: Any) -> None:
    for finder in [f for f in sys.meta_path if isinstance(f, KerasFinder)]:
        sys.meta_path.remove(finder)                # once is enough
    try:
        _probe().attach(module, started=STARTED)
    except Exception as e:      # noqa: BLE001 - never break the user's script
        _warn(f"the in-process probe could not attach to Keras ({type(e).__name__}: {e}); "
              f"only the process's memory from outside is diagnosed")


class _Loader(importlib.abc.Loader):
    """Runs the real loader of ``keras``, then attaches the fit_probe."""

    def __init__(self, loader: Any):
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        _own_tracebacks()           # from here on a traceback may hold the probe's frames
        self._loader.exec_module(module)
        _keras_loaded(module)

    def __getattr__(self, name: str) -> Any:     # get_resource_reader, get_source...
        return getattr(self._loader, name)


class KerasFinder(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` entry that notices the import of ``keras`` (``tf.keras`` too)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "keras":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                # Stay in sys.meta_path until Keras is loaded: TensorFlow calls
                # find_spec("keras") once only to see whether it is installed.
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def _deadline(seconds: float) -> None:
    def fire() -> None:
        try:
            _probe().deadline_passed()
        except Exception as e:      # noqa: BLE001
            _warn(f"could not stop the command at its deadline ({type(e).__name__}: {e})")

    timer = threading.Timer(max(0.0, STARTED + seconds - time.time()), fire)
    timer.daemon = True
    timer.name = "memfit-doctor-deadline"
    timer.start()


def _own_frame(filename: str) -> bool:
    """A frame of the doctor's probe (this directory) or of its ``sitecustomize`` shim:
    frames ``python script.py`` would not have."""
    return (os.path.dirname(os.path.abspath(filename)) == _HERE
            or os.path.basename(filename) == "sitecustomize.py" and ".doctor" in filename)


def _memfits(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_MEMFIT)


def _stdlib(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_STDLIB) and "-packages" not in filename


def _without_own_frames(te: Any, seen: set[int]) -> None:
    """Leaves the probe's frames out of ``te`` (a ``traceback.TracebackException``) and of
    the exceptions chained to it; an exception raised inside the probe's own work (a
    Ctrl-C while its callback logs a step) ends at the frame that called the probe."""
    import traceback

    if id(te) in seen:
        return
    seen.add(id(te))
    frames = list(te.stack)
    end = len(frames)
    while end and (_memfits(frames[end - 1].filename) or _stdlib(frames[end - 1].filename)):
        end -= 1
    tail = [i for i in range(end, len(frames)) if _memfits(frames[i].filename)]
    if tail and _own_frame(frames[tail[0]].filename) and end:
        frames = frames[:tail[0]]
    te.stack = traceback.StackSummary.from_list(
        [f for f in frames if not _own_frame(f.filename)])
    for chained in (te.__cause__, te.__context__):
        if chained is not None:
            _without_own_frames(chained, seen)


def _own_tracebacks() -> None:
    """Prints uncaught exceptions without the probe's frames (:func:`_excepthook`), unless
    the script's own site set another hook. ``traceback`` is imported here, not in the
    hook: an import while Python prints an uncaught ``KeyboardInterrupt`` loses its exit
    by SIGINT (status 1 instead of 130)."""
    import traceback  # noqa: F401 - loaded now, used by _excepthook

    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _excepthook


def _excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    """The traceback ``python script.py`` prints, without the probe's frames (a stranger's
    Ctrl-C under the doctor showed ``fit_probe`` and ``hook`` frames in the middle)."""
    import signal
    import traceback

    # A Ctrl-C reaches this process twice (the terminal's, and the one memfit doctor
    # passes on): the second must not cut the printing of the first.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        te = traceback.TracebackException(kind, value, tb)
        _without_own_frames(te, set())
        sys.stderr.write("".join(te.format()))
    except Exception:       # noqa: BLE001 - never lose the user's traceback
        sys.__excepthook__(kind, value, tb)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_DFL)      # Python then dies by SIGINT


_HERE = os.path.dirname(os.path.abspath(__file__))
_MEMFIT = os.path.dirname(_HERE) + os.sep
_STDLIB = os.path.dirname(os.__file__) + os.sep


def install(seconds: str | None = None) -> KerasFinder:
    """Installs the hook, and the deadline when ``seconds`` is given.

    Args:
        seconds: the time limit as the shim read it from the environment (a string of a
            number of seconds), or ``None``/``""`` for none.
    """
    finder = KerasFinder()
    if "keras" in sys.modules:                      # imported already (unusual): attach now
        _keras_loaded(sys.modules["keras"])
    else:
        sys.meta_path.insert(0, finder)
    if seconds:
        try:
            _deadline(float(seconds))
        except ValueError:
            _warn(f"ignoring the time limit {seconds!r}: not a number of seconds")
    return finder
