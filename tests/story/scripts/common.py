"""What the four story scripts share: a small model, and a MemoryMonitor when asked.

A story script runs unchanged under ``memfit watch`` and ``memfit doctor``; with
``$STORY_MONITOR=DIR`` it also passes ``memfit.MemoryMonitor(DIR)`` to every ``fit``.
"""

import os

import keras

EPOCHS = int(os.environ.get("STORY_EPOCHS", "6"))


def model(shape):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input(shape), keras.layers.Flatten(), keras.layers.Dense(8),
                          keras.layers.Dense(1)])
    m.compile("sgd", "mse")
    return m


_MONITOR = []


def callbacks():
    """``[MemoryMonitor($STORY_MONITOR)]`` (one for the whole script), or ``[]``."""
    workdir = os.environ.get("STORY_MONITOR")
    if not workdir:
        return []
    if not _MONITOR:
        import memfit

        _MONITOR.append(memfit.MemoryMonitor(workdir, every_n_batches=0, verbose=1))
    return _MONITOR
