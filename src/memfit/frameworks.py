"""The frameworks memfit can work without, and the one line that says which to install.

memfit's process tools (``watch``, ``run``, ``report``, ``share`` of any command) and its
packer (``pack``, ``inspect``, ``verify``) need no machine-learning framework. What runs
inside a training or traces a model does: ``memfit.dataset`` feeds ``tf.data``, the
estimator traces a TensorFlow graph, ``memfit.session`` and ``MemoryMonitor`` are Keras
callbacks. Each such entry point calls :func:`require` first, so that a missing framework
is one line naming the extra to install, not an ``ImportError`` from deep inside.

Example:
    >>> require("json", "memfit's JSON", "tensorflow")           # there: nothing happens
    >>> require("no_such_framework", "memfit.dataset", "tensorflow")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memfit.errors.FrameworkMissingError: memfit.dataset needs no_such_framework, ...
"""

from __future__ import annotations

import importlib.util

from memfit.errors import FrameworkMissingError

__all__ = ["require", "TENSORFLOW_EXTRA"]

TENSORFLOW_EXTRA = "tensorflow"


def require(module: str, what: str, extra: str) -> None:
    """Raises the one line that says how to install ``module`` where it is not installed.
    It looks for the module without importing it: a framework is imported where memfit
    keeps its start-up lines off the screen (:mod:`memfit.quiet`), not here.

    Args:
        module: a top-level module (``"tensorflow"``, ``"keras"``).
        what: the capability that needs it, as the user called it (``"memfit.dataset"``).
        extra: memfit's extra that installs it (``pip install 'memfit[EXTRA]'``).

    Raises:
        FrameworkMissingError: ``module`` is not installed (exit code 2 under ``memfit``).
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise FrameworkMissingError(
            f"{what} needs {module}, which is not installed: "
            f"pip install 'memfit[{extra}]'")
