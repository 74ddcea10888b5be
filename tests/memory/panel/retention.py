"""1. The list-of-tuples retention: arrays freed each epoch, small survivors pin the heap."""

import sys

import numpy as np
from common import run

survivors = []


def step(epoch):
    tuples = []
    for i in range(2000 * (epoch + 1)):                   # a bigger list every epoch
        tuples.append((np.ones(6000, np.float32), np.ones((20, 20), np.int32)))
        if i % 50 == 0:
            survivors.append(bytearray(64))               # pins the heap between them
    del tuples


run(step, trim=sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "none" else None)
