"""What the four story scripts share: a small model, and a MemoryMonitor when asked.

A story script runs unchanged under ``memfit watch`` and ``memfit doctor``; with
``$STORY_MONITOR=DIR`` it also passes ``memfit.MemoryMonitor(DIR)`` to every ``fit``.
"""

import os
import time
from collections.abc import Iterator

import keras

EPOCHS = int(os.environ.get("STORY_EPOCHS", "6"))
MIN_SECONDS = float(os.environ.get("STORY_SECONDS", "8"))


def epochs(at_least: int = EPOCHS) -> Iterator[int]:
    """Epoch numbers: at least ``at_least`` of them, and for at least MIN_SECONDS after the
    first epoch, so that a watch from outside sees more steady time than it needs
    (memfit.memory.watch.MIN_STEADY, 5 s) however fast or busy the machine is. The first
    epoch is the warm-up (traces, the first run of every kernel): on a busy machine it
    takes seconds, and a budget counted from its start left too little after it (on a
    quiet 2-core machine six epochs of a story script take 1-3 s)."""
    epoch, warmed = 0, None
    while epoch < at_least or warmed is None or time.monotonic() - warmed < MIN_SECONDS:
        yield epoch
        if warmed is None:
            warmed = time.monotonic()
        epoch += 1


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
