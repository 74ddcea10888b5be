"""Random number generator states a resumed training needs to continue exactly.

Captured: Python's ``random``, NumPy's global generator (``np.random.*``), Keras's global
seed generator (``keras.random.*`` without a seed) and, through the model, each layer's
own seed generator (``Dropout``, ``RandomFlip``...: those are variables that Keras's
weight files leave out). TensorFlow op-level seeds need no state: they follow from the
global seed that :func:`seed_everything` sets.

Example:
    >>> state = capture()
    >>> import random; a = random.random()
    >>> restore(state); random.random() == a
    True
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

__all__ = ["seed_everything", "capture", "restore"]


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy, TensorFlow and Keras (``keras.utils.set_random_seed``)."""
    import keras

    keras.utils.set_random_seed(seed)


def _keras_global_generator() -> Any:
    """Keras's global seed generator if the process has made one, else ``None``."""
    try:
        from keras.src.backend.common import global_state
    except ImportError:         # a Keras without it: nothing to capture
        return None
    return global_state.get_global_attribute("global_seed_generator")


def capture() -> dict:
    """The process-wide RNG states, as JSON-able data."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }
    generator = _keras_global_generator()
    if generator is not None:
        state["keras_global"] = np.asarray(generator.state.numpy()).tolist()
    return state


def restore(state: dict) -> None:
    """Puts back what :func:`capture` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "keras_global" in state:
        from keras.src.random.seed_generator import global_seed_generator

        generator = global_seed_generator()
        generator.state.assign(np.asarray(state["keras_global"],
                                          dtype=generator.state.dtype))
