"""A supervised training with the callbacks people use beside memfit, for the callback-state
tests (tests/supervise/test_callbacks.py).

    python callbacks_train.py DATA OUT [--epochs 12] [--checkpoint-every N] [--kill-at S]

The data are noise, so validation stops improving: ReduceLROnPlateau(patience=1) lowers the
rate and EarlyStopping(patience=3) ends the run before --epochs. Also ModelCheckpoint
(save_best_only, and every 7 batches), CSVLogger, TensorBoard (per batch), a
LearningRateScheduler, TerminateOnNaN and a user callback with get_state/set_state. Writes
OUT/final.npz, OUT/history.json and OUT/summary.json (the callbacks' end states).
--kill-at S: SIGKILL itself after its S-th trained step, once per OUT (a marker remembers).
"""

import argparse
import json
import os
import signal
from pathlib import Path

import keras
import numpy as np

import memfit

p = argparse.ArgumentParser()
p.add_argument("data")
p.add_argument("out", type=Path)
p.add_argument("--epochs", type=int, default=12)
p.add_argument("--checkpoint-every", type=int)
p.add_argument("--kill-at", type=int, default=0)
p.add_argument("--unknown", action="store_true", help="add a stateful callback without "
               "get_state/set_state")
args = p.parse_args()
args.out.mkdir(parents=True, exist_ok=True)


class Counter(keras.callbacks.Callback):
    """A user's stateful callback, with the protocol."""

    def __init__(self):
        super().__init__()
        self.batches = 0
        self.epochs = []

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)

    def get_state(self):
        return {"batches": self.batches, "epochs": list(self.epochs)}

    def set_state(self, state):
        self.batches = state["batches"]
        self.epochs = list(state["epochs"])


class Unknown(keras.callbacks.Callback):
    """A stateful callback memfit cannot save."""

    def __init__(self):
        super().__init__()
        self.seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1


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
                              keras.layers.Dropout(0.2), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(3e-2), loss="mse")
    train = s.dataset(args.data, 32, split="train", features=("x", "y"))
    val = memfit.dataset(args.data, 64, split="val", features=("x", "y"), shuffle=False)
    stop = keras.callbacks.EarlyStopping(patience=3, restore_best_weights=True)
    plateau = keras.callbacks.ReduceLROnPlateau(patience=1, factor=0.5)
    best = keras.callbacks.ModelCheckpoint(str(args.out / "best.weights.h5"),
                                           save_best_only=True, save_weights_only=True)
    every7 = keras.callbacks.ModelCheckpoint(str(args.out / "every.weights.h5"),
                                             save_weights_only=True, save_freq=7)
    board = keras.callbacks.TensorBoard(str(args.out / "tb"), update_freq=5)
    counter = Counter()
    callbacks = [stop, counter, s.callback, plateau, best, every7,
                 keras.callbacks.CSVLogger(str(args.out / "log.csv")), board,
                 keras.callbacks.LearningRateScheduler(
                     lambda epoch, lr: lr * 0.9 if epoch % 2 else lr),
                 keras.callbacks.TerminateOnNaN(), Killer()]
    if args.unknown:
        callbacks.append(Unknown())
    history = model.fit(train, validation_data=val, epochs=args.epochs,
                        callbacks=callbacks, verbose=0)

np.savez(args.out / "final.npz", *[w.numpy() for w in model.weights])
(args.out / "history.json").write_text(json.dumps(history.history))
(args.out / "summary.json").write_text(json.dumps({
    "stopped_epoch": stop.stopped_epoch, "best_epoch": stop.best_epoch,
    "best": float(best.best), "plateau_best": float(plateau.best),
    "every_seen": every7._batches_seen_since_last_saving,
    "train_batch": board._global_train_batch, "test_batch": board._global_test_batch,
    "counter": counter.get_state()}))
