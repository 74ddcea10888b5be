"""A true leak: a global list keeps 24 MiB more of the data every epoch.

It trains at least STORY_EPOCHS epochs and at least 5 s, so that a watch from outside
sees the growth over several of its time slices however fast the machine is (on a quiet
2-core machine six epochs take under 2 s)."""

import time

import numpy as np
from common import EPOCHS, callbacks, model

MIN_SECONDS = 5.0
KEPT = []
m = model((64,))
x = np.random.default_rng(0).random((16384, 64), dtype=np.float32)   # 512 steps an epoch
y = x.sum(axis=1, keepdims=True)
started = time.monotonic()
epoch = 0
while epoch < EPOCHS or time.monotonic() - started < MIN_SECONDS:
    KEPT.append(np.random.default_rng(epoch).random((3 * 2**20,)) + epoch)   # 24 MiB
    m.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=callbacks())
    epoch += 1
print(f"leak: trained {epoch} epochs")
