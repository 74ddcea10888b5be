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
import json
import os
import sys

from memfit.errors import FrameworkMissingError, MemfitError

__all__ = ["require", "require_for_data", "require_for_training", "keras_backend",
           "TENSORFLOW_EXTRA", "KERAS_EXTRA"]

TENSORFLOW_EXTRA = "tensorflow"
KERAS_EXTRA = "jax"             # keras comes with memfit's jax extra (keras + jax)


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


def keras_backend() -> str:
    """The backend Keras runs on (``"tensorflow"``, ``"jax"``, ``"torch"``), read without
    importing Keras or TensorFlow: ``keras.backend.backend()`` once Keras is imported,
    else what Keras will read when it is: ``KERAS_BACKEND``, else the ``"backend"`` of
    ``keras.json`` in ``KERAS_HOME`` (``~/.keras``, or ``/tmp/.keras`` when the home
    directory cannot be written), else ``"tensorflow"``.

    Example:
        >>> keras_backend() in ("tensorflow", "jax", "torch", "numpy", "openvino")
        True
    """
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "backend"):
        return str(keras.backend.backend())
    backend = "tensorflow"
    home = os.environ.get("KERAS_HOME")
    if home is None:
        base = os.path.expanduser("~")
        home = os.path.join(base if os.access(base, os.W_OK) else "/tmp", ".keras")
    try:
        with open(os.path.expanduser(os.path.join(home, "keras.json"))) as f:
            config = json.load(f)
        if isinstance(config, dict) and isinstance(config.get("backend"), str):
            backend = config["backend"]
    except (OSError, ValueError):
        pass
    return os.environ.get("KERAS_BACKEND") or backend


def require_for_data(what: str) -> str:
    """Raises the one line that says what ``what`` (``memfit.dataset``) needs on Keras's
    backend and is not installed: TensorFlow on the TensorFlow backend (``tf.data``); on
    any other only Keras (and JAX on JAX), since it is fed by a ``keras.utils.PyDataset``.

    Example:
        >>> require_for_data("memfit.dataset") == keras_backend()
        True

    Returns:
        The backend (:func:`keras_backend`).
    """
    backend = keras_backend()
    if backend == "tensorflow":
        require("tensorflow", f"{what} (it feeds tf.data)", TENSORFLOW_EXTRA)
        return backend
    if backend == "jax":
        require("jax", f"{what} on Keras's JAX backend", KERAS_EXTRA)
    require("keras", f"{what} on Keras's {backend} backend", KERAS_EXTRA)
    return backend


def require_for_training(what: str) -> str:
    """Raises the one line that says what ``what`` (``memfit find-batch-size``), which
    builds and trains a model, needs on Keras's backend and is not installed: TensorFlow
    on the TensorFlow backend, JAX and Keras on JAX.

    Example:
        >>> require_for_training("memfit calibrate") == keras_backend()
        True

    Returns:
        The backend (:func:`keras_backend`).
    """
    backend = keras_backend()
    if backend == "tensorflow":
        require("tensorflow", what, TENSORFLOW_EXTRA)
        return backend
    if backend != "jax":
        # said before Keras is imported: KERAS_BACKEND=torch without torch was a 59-line
        # traceback from inside Keras
        raise MemfitError(f"{what} runs on Keras's TensorFlow or JAX backend, and Keras is "
                          f"set to run on {backend} here: set KERAS_BACKEND=tensorflow or "
                          f"KERAS_BACKEND=jax. Received: KERAS_BACKEND={backend}")
    require("jax", f"{what} on Keras's JAX backend", KERAS_EXTRA)
    require("keras", f"{what} on Keras's {backend} backend", KERAS_EXTRA)
    return backend
