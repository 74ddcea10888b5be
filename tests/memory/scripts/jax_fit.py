"""A small Keras training on the JAX backend, for tests/memory/test_jax_memory.py.

    KERAS_BACKEND=jax python jax_fit.py [--epochs 7] [--monitor WORKDIR]

In-memory NumPy data, no TensorFlow imported (asserted at the end). --monitor adds
memfit.MemoryMonitor(WORKDIR) and prints its verdict's kind on the last line of stdout.
"""

import argparse
import sys

import keras
import numpy as np

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=7)
p.add_argument("--monitor")
args = p.parse_args()
assert keras.backend.backend() == "jax", keras.backend.backend()

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 32)).astype("float32")
y = rng.normal(size=(512, 1)).astype("float32")
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
callbacks = []
if args.monitor:
    import memfit

    monitor = memfit.MemoryMonitor(args.monitor, every_n_batches=5, verbose=0)
    callbacks.append(monitor)
model.fit(x, y, batch_size=32, epochs=args.epochs, callbacks=callbacks, verbose=0)
assert "tensorflow" not in sys.modules, "TensorFlow was imported"
if args.monitor:
    print(monitor.verdict.kind)
