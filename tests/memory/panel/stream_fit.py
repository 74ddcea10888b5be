"""7. model.fit from memfit.dataset with validation, a new pass every epoch: stable.

tf.data starts new threads for every pass; without memfit's cap on glibc arenas each
new thread's arena kept its freed buffers and RSS grew for the first ~10 epochs."""

import json
import sys
from pathlib import Path

import keras
import numpy as np

import memfit

work = Path(sys.argv[1])
rng = np.random.default_rng(0)
x = rng.integers(0, 256, (6000, 16, 16, 3), dtype=np.uint8)
y = rng.integers(0, 10, 6000)
memfit.pack({"x": x, "y": y}, work / "data", split="train=0.9,val=0.1", progress=False)
train = memfit.dataset(work / "data", 64, split="train", features=("x", "y"))
val = memfit.dataset(work / "data", 256, split="val", features=("x", "y"), shuffle=False)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((16, 16, 3), dtype="uint8"),
                          keras.layers.Rescaling(1 / 255),
                          keras.layers.Conv2D(8, 3, activation="relu"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
monitor = memfit.MemoryMonitor(work, every_n_batches=0, trim="epoch", verbose=0)
model.fit(train, validation_data=val, epochs=10, callbacks=[monitor], verbose=0)
v = monitor.verdict
print(json.dumps({"verdict": v.kind, "slope": v.slope, "growth": v.growth,
                  "released": v.released, "values": monitor.epoch_values,
                  "arena_limit": train.memfit_plan.arena_limit}))
