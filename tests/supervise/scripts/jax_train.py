"""A supervised training on the JAX backend, for tests/supervise/test_jax_session.py.

    KERAS_BACKEND=jax python jax_train.py OUT [--data arrays|pydataset] [--epochs 12]
        [--checkpoint-every N] [--kill-at S] [--monitor]

The data are in memory (NumPy arrays given to ``fit`` with ``shuffle=True``, or a
``keras.utils.PyDataset`` whose order is a function of ``(seed, epoch)``, positioned at
``s.epoch``), or packed shards streamed by ``s.dataset`` (memfit's feed for JAX): no
TensorFlow is imported. The labels are noise, so validation stalls:
ReduceLROnPlateau(patience=1) lowers the rate and EarlyStopping(patience=3) ends the run
before --epochs. The model has Dropout and BatchNormalization (seed generators, moving
statistics) and a metric; beside the session's callback run ModelCheckpoint (every 7
batches), CSVLogger, LearningRateScheduler, TerminateOnNaN and a user callback with
get_state/set_state. Writes OUT/final.npz, OUT/history.json and OUT/summary.json (the
callbacks' end states, and whether TensorFlow was imported).
--kill-at S: SIGKILL itself after its S-th trained step, once per OUT (a marker remembers).
--monitor: add memfit.MemoryMonitor (every 4 batches) to the callbacks.
"""

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import keras
import numpy as np

import memfit

p = argparse.ArgumentParser()
p.add_argument("out", type=Path)
p.add_argument("--data", choices=("arrays", "pydataset", "memfit"), default="arrays")
p.add_argument("--epochs", type=int, default=12)
p.add_argument("--checkpoint-every", type=int)
p.add_argument("--kill-at", type=int, default=0)
p.add_argument("--monitor", action="store_true")
args = p.parse_args()
args.out.mkdir(parents=True, exist_ok=True)
assert keras.backend.backend() == "jax", keras.backend.backend()

rng = np.random.default_rng(3)
X = rng.normal(size=(640, 16)).astype("float32")
Y = rng.normal(size=(640, 1)).astype("float32")          # noise: validation stalls
TRAIN, VAL = slice(0, 512), slice(512, 640)


class Batches(keras.utils.PyDataset):
    """Batches in an order that is a pure function of (seed, epoch)."""

    def __init__(self, x, y, batch_size, seed, epoch):
        super().__init__()
        self.x, self.y, self.batch_size, self.seed, self.epoch = x, y, batch_size, seed, epoch
        self._order = self._permutation()

    def _permutation(self):
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.x))

    def __len__(self):
        return len(self.x) // self.batch_size

    def __getitem__(self, index):
        rows = self._order[index * self.batch_size:(index + 1) * self.batch_size]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        self.epoch += 1
        self._order = self._permutation()


class Counter(keras.callbacks.Callback):
    """A user's stateful callback, with the protocol."""

    def __init__(self):
        super().__init__()
        self.batches, self.epochs = 0, []

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)

    def get_state(self):
        return {"batches": self.batches, "epochs": list(self.epochs)}

    def set_state(self, state):
        self.batches, self.epochs = state["batches"], list(state["epochs"])


class Killer(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        done = int(np.asarray(self.model.optimizer.iterations.numpy()))
        marker = args.out / "killed"
        if args.kill_at and done == args.kill_at and not marker.exists():
            marker.write_text("1")
            os.kill(os.getpid(), signal.SIGKILL)


with memfit.session(seed=11, checkpoint_every=args.checkpoint_every, deterministic=True,
                    verbose=0) as s:
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.BatchNormalization(),
                              keras.layers.Dropout(0.2), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(3e-2), loss="mse", metrics=["mae"])
    stop = keras.callbacks.EarlyStopping(patience=3, restore_best_weights=True)
    plateau = keras.callbacks.ReduceLROnPlateau(patience=1, factor=0.5)
    every7 = keras.callbacks.ModelCheckpoint(str(args.out / "every.weights.h5"),
                                             save_weights_only=True, save_freq=7)
    counter = Counter()
    callbacks = [stop, counter, s.callback, plateau, every7,
                 keras.callbacks.CSVLogger(str(args.out / "log.csv")),
                 keras.callbacks.LearningRateScheduler(
                     lambda epoch, lr: lr * 0.9 if epoch % 2 else lr),
                 keras.callbacks.TerminateOnNaN(), Killer()]
    if args.monitor:
        callbacks.append(memfit.MemoryMonitor(every_n_batches=4, verbose=0))
    if args.data == "arrays":
        history = model.fit(X[TRAIN], Y[TRAIN], batch_size=32, shuffle=True,
                            validation_data=(X[VAL], Y[VAL]), epochs=args.epochs,
                            callbacks=callbacks, verbose=0)
    elif args.data == "memfit":     # packed shards, streamed by memfit's feed for JAX
        packed = args.out / "packed"
        if not (packed / "manifest.json").exists():
            memfit.pack({"x": X[TRAIN], "y": Y[TRAIN]}, packed, shards=4,
                        samples_per_record=8, progress=False)
        history = model.fit(s.dataset(str(packed), 32, features=("x", "y")),
                            validation_data=(X[VAL], Y[VAL]), epochs=args.epochs,
                            callbacks=callbacks, verbose=0)
    else:
        history = model.fit(Batches(X[TRAIN], Y[TRAIN], 32, s.seed, s.epoch),
                            validation_data=(X[VAL], Y[VAL]), epochs=args.epochs,
                            callbacks=callbacks, verbose=0)

np.savez(args.out / "final.npz", *[np.asarray(w.numpy()) for w in model.weights])
(args.out / "history.json").write_text(json.dumps(history.history))
(args.out / "summary.json").write_text(json.dumps({
    "stopped_epoch": stop.stopped_epoch, "best_epoch": stop.best_epoch,
    "plateau_best": float(plateau.best),
    "every_seen": every7._batches_seen_since_last_saving,
    "counter": counter.get_state(), "tensorflow": "tensorflow" in sys.modules}))
