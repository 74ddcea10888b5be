"""Watch the memory of a Keras training run with memfit.MemoryMonitor (about 20 s on a CPU).

    python examples/monitor_fit.py
    memfit report runs/monitor-example      # redraw the report from the log at any time
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import memfit  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(4096, 32, 32, 3)).astype("float32")      # stand-in for your data
y = rng.integers(0, 10, size=4096)

model = keras.Sequential([
    keras.Input((32, 32, 3)),
    keras.layers.Conv2D(16, 3, activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(32, 3, activation="relu"),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(10),
])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))

# Samples this process every 100 batches and at each epoch end into
# runs/monitor-example/memory.jsonl; after the warm-up epoch it classifies the growth
# (stable, warm-up, leak, allocator-retention) and, with report=True, writes the report.
monitor = memfit.MemoryMonitor("runs/monitor-example", budget="4GiB", report=True)
model.fit(x, y, batch_size=64, epochs=5, callbacks=[monitor], verbose=2)

print(monitor.verdict)                           # headline, explanation and fix
print(f"report: {monitor.workdir.report}")      # open it in a browser
