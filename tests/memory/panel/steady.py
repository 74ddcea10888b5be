"""6. A steady small-model training under model.fit with the monitor: stable."""

import json
import sys

import keras
import numpy as np

import memfit

rng = np.random.default_rng(0)
x = rng.standard_normal((4096, 32)).astype(np.float32)
y = rng.integers(0, 10, 4096)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(10)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
monitor = memfit.MemoryMonitor(sys.argv[1], every_n_batches=20, verbose=0)
model.fit(x, y, batch_size=64, epochs=8, callbacks=[monitor], verbose=0)
v = monitor.verdict
print(json.dumps({"verdict": v.kind, "slope": v.slope, "growth": v.growth,
                  "released": v.released, "values": monitor.epoch_values}))
