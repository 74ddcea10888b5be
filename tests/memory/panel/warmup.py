"""5. Warm-up then flat: a cache filled in the first epochs, then level."""

import numpy as np
from common import run

cache = {}


def step(epoch):
    if epoch < 3:
        cache[epoch] = np.ones(32 * 2**20, np.uint8) * epoch      # 32 MiB per early epoch
    else:
        scratch = np.ones(4 * 2**20, np.uint8)                     # used and freed
        del scratch


run(step)
