"""3. Models built in a loop without keras.backend.clear_session()."""

import keras
from common import run


def step(epoch):
    for _ in range(40):
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256),
                                  keras.layers.Dense(256), keras.layers.Dense(10)])
        model.compile("adam", "mse")


run(step)
