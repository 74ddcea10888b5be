"""A tiny Keras training for the Ray tests and benchmark: resumable, deterministic.

    python train.py DATA OUT [--epochs 3] [--units 16]

Trains a small dense model on the packed dataset DATA under ``memfit.session`` (its
workdir is ``$MEMFIT_WORKDIR``, set by memfit share), checkpointing every 4 steps, and
writes OUT/final.npz (the weights) at the end. Knobs (environment):
    LEAK_MIB=N      keep N MiB more anonymous memory after every step (a job that lies
                    about its need)
    STEP_SLEEP=S    sleep S seconds after every step (time to act mid-run)
    HOLD_MIB=N      hold N MiB from the start (a job with a larger need)
"""

import argparse
import os
import time
from pathlib import Path

import keras
import numpy as np

import memfit

MIB = 2**20
p = argparse.ArgumentParser()
p.add_argument("data")
p.add_argument("out", type=Path)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--units", type=int, default=16)
args = p.parse_args()
args.out.mkdir(parents=True, exist_ok=True)

held = [np.ones(int(float(os.environ.get("HOLD_MIB", "0")) * MIB) // 8)]
leak = int(float(os.environ.get("LEAK_MIB", "0")) * MIB)
pause = float(os.environ.get("STEP_SLEEP", "0"))


class Knobs(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if leak:
            held.append(np.ones(leak // 8))
        if pause:
            time.sleep(pause)


with memfit.session(seed=11, checkpoint_every=4, deterministic=True, verbose=0) as s:
    model = keras.Sequential([keras.Input((8,)),
                              keras.layers.Dense(args.units, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    train = s.dataset(args.data, 32, features=("x", "y"))
    model.fit(train, epochs=args.epochs, callbacks=[Knobs(), s.callback], verbose=0)

np.savez(args.out / "final.npz", *[w.numpy() for w in model.weights])
print(f"train.py: done, {args.epochs} epochs", flush=True)
