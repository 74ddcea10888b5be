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
