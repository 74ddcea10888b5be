"""Random number generator states a resumed training needs to continue exactly.

Captured: Python's ``random``, NumPy's global generator (``np.random.*``), Keras's global
seed generator (``keras.random.*`` without a seed) and, through the model, each layer's
own seed generator (``Dropout``, ``RandomFlip``...: those are variables that Keras's
weight files leave out). TensorFlow op-level seeds need no state: they follow from the
global seed that :func:`seed_everything` sets.

On the JAX (and PyTorch) backend every Keras random op draws from those seed generators
(JAX's own PRNG is functional: it has no hidden state to capture), so the states above
are all there is. There :func:`seed_everything` does not import TensorFlow to seed it, as
``keras.utils.set_random_seed`` does whenever TensorFlow is installed (seconds of start-up
and hundreds of MiB for a framework the training does not use): it seeds TensorFlow only
when the script has imported it already (a ``tf.data`` input pipeline).

Example:
    >>> state = capture()
    >>> import random; a = random.random()
    >>> restore(state); random.random() == a
    True
"""

from __future__ import annotations

import random
import sys
from typing import Any

import numpy as np

__all__ = ["seed_everything", "capture", "restore"]


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy, TensorFlow and Keras (``keras.utils.set_random_seed``); on a
    backend other than TensorFlow, TensorFlow only if it is imported already."""
    import keras

    if keras.backend.backend() == "tensorflow" or "tensorflow" in sys.modules:
        keras.utils.set_random_seed(seed)
        return
    # keras.utils.set_random_seed less its `import tensorflow` (Keras 3.15 does these
    # things, then seeds TensorFlow; tests/supervise/test_jax_session.py fails if that
    # changes).
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator
    from keras.src.utils import rng_utils

    global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, seed)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
    random.seed(seed)
    np.random.seed(seed)
    if keras.backend.backend() == "torch":
        import torch

        torch.manual_seed(seed)


def _keras_global_generator() -> Any:
    """Keras's global seed generator if the process has made one, else ``None``."""
    try:
        from keras.src.backend.common import global_state
    except ImportError:         # a Keras without it: nothing to capture
        return None
    return global_state.get_global_attribute("global_seed_generator")


def capture() -> dict:
    """The process-wide RNG states, as JSON-able data."""
    # First: the first import of Keras draws from Python's generator.
    generator = _keras_global_generator()
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }
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
