"""A small supervised training, driven by the supervise tests.

    python train.py DATA OUT --epochs 6 [--checkpoint-every N]

Writes OUT/final.npz (weights) and OUT/history.json at the end. Fault knobs (env):
    KILL_IN_CHECKPOINT=K   SIGKILL itself while writing its K-th checkpoint (files written,
                           not yet renamed), once per OUT (a marker file remembers)
    CRASH_AT_EPOCH=E       raise at the start of epoch E, every time
    LEAK_PER_STEP=BYTES    keep BYTES more anonymous memory after every step
    STEP_SLEEP=SECONDS     sleep after every step (to give kills time to land)
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import keras
import numpy as np

import memfit
from memfit.supervise import checkpoint

p = argparse.ArgumentParser()
p.add_argument("data")
p.add_argument("out", type=Path)
p.add_argument("--epochs", type=int, default=6)
p.add_argument("--checkpoint-every", type=int)
p.add_argument("--units", type=int, default=32)
args = p.parse_args()
args.out.mkdir(parents=True, exist_ok=True)

kill_at = int(os.environ.get("KILL_IN_CHECKPOINT", "0"))
if kill_at:
    marker = args.out / "killed-in-checkpoint"
    original = checkpoint._fsync_tree
    calls = [0]

    def fsync_then_die(directory):
        calls[0] += 1
        original(directory)
        if calls[0] == kill_at and not marker.exists():
            marker.write_text(str(os.getpid()))      # who killed itself, for the test
            os.kill(os.getpid(), signal.SIGKILL)

    checkpoint._fsync_tree = fsync_then_die

kept = []


class Faults(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == int(os.environ.get("CRASH_AT_EPOCH", "-1")):
            raise RuntimeError(f"deliberate failure at epoch {epoch}")

    def on_train_batch_end(self, batch, logs=None):
        leak = int(os.environ.get("LEAK_PER_STEP", "0"))
        if leak:
            kept.append(np.ones(leak // 8))
        time.sleep(float(os.environ.get("STEP_SLEEP", "0")))


with memfit.session(seed=7, checkpoint_every=args.checkpoint_every, deterministic=True,
                    verbose=1) as s:
    model = keras.Sequential([
        keras.Input((16,)),
        keras.layers.Dense(args.units, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
    train = s.dataset(args.data, 32, features=("x", "y"))
    history = model.fit(train, epochs=args.epochs, callbacks=[Faults(), s.callback],
                        verbose=0)

np.savez(args.out / "final.npz", *[w.numpy() for w in model.weights])
(args.out / "history.json").write_text(json.dumps(history.history))
print(f"train.py: done, {len(history.history['loss'])} epochs", file=sys.stderr)
