"""2. A real leak: a global list keeps one batch of arrays per epoch."""

import numpy as np
from common import run

kept = []


def step(epoch):
    batch = np.random.default_rng(epoch).random((512, 32, 32, 3), dtype=np.float32)  # 6 MiB
    kept.append(batch * 2)
    kept.append(batch + 1)


run(step)
