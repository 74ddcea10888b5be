"""The training that benchmarks/faults.py kills: a small Keras run under memfit.session.

    python benchmarks/fault_train.py DATA OUT --config divides [--epochs 3] [--backend jax]

DATA holds the packed sets `cls` (16 features, 4 classes) and `img` (8x8x1 images,
4 classes), each with a `train` and a `val` split. OUT gets `final.npz` (weights) and
`history.json` when training ends, and two files the campaign reads to aim and score
its kills:

- `phase`: one fixed-size record, rewritten in place at every phase change:
  `PHASE PID ITERATIONS` (ITERATIONS: the optimizer's step count, which counts trained
  steps only, not skipped ones);
- `phases.log`: one line per change, `TIME PID PHASE ITERATIONS`.

With `--config callbacks` the run also has EarlyStopping, ReduceLROnPlateau,
ModelCheckpoint (best only, and every 7 batches), CSVLogger, TensorBoard, a
LearningRateScheduler, TerminateOnNaN and a user callback with get_state/set_state, and OUT
gets `callbacks.json` (their end states) and `log.csv`, which the campaign compares too.

With `--backend jax` it runs on Keras's JAX backend without importing TensorFlow: the data
are DATA's `cls.npz`/`img.npz`/`noise.npz` arrays (the first 80 % to train, given to `fit`
with `shuffle=True`; the rest to validate), TensorBoard is left out, and `mirrored`
(tf.distribute) is refused.

Phases: import (interpreter start to the session), build (model and data), restore
(fit's start: the checkpoint is loaded, the done steps are skipped), step (a training
step), epoch-end (after an epoch's last step: validation, callbacks, the epoch's
checkpoint), checkpoint (inside a checkpoint write), finish (after fit).
"""

import os
import sys
import time

OUT = sys.argv[2] if len(sys.argv) > 2 else "."
os.makedirs(OUT, exist_ok=True)
_PHASE_FD = os.open(os.path.join(OUT, "phase"), os.O_RDWR | os.O_CREAT, 0o644)
_LOG_FD = os.open(os.path.join(OUT, "phases.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                  0o644)
_now = ["import", 0]


def phase(name: str, iterations: int | None = None) -> None:
    """Records the phase this process is in (cheap: one pwrite, one append)."""
    if iterations is not None:
        _now[1] = iterations
    _now[0] = name
    record = f"{name} {os.getpid()} {_now[1]}".ljust(63) + "\n"
    os.pwrite(_PHASE_FD, record.encode(), 0)
    os.write(_LOG_FD, f"{time.time():.6f} {os.getpid()} {name} {_now[1]}\n".encode())


phase("import")

import argparse  # noqa: E402
import json  # noqa: E402

CONFIGS = {
    # checkpoint_every divides the 20 steps of an epoch; validation and metrics
    "divides": {"data": "cls", "every": 5, "validation": True, "metrics": True},
    # it does not divide them; no validation, no metrics
    "uneven": {"data": "cls", "every": 7, "validation": False, "metrics": False},
    # Dropout, BatchNormalization and augmentation layers (seed generators, moving stats)
    "augment": {"data": "img", "every": 6, "validation": True, "metrics": True},
    # tf.distribute.MirroredStrategy over two logical CPU devices
    "mirrored": {"data": "cls", "every": 5, "validation": True, "metrics": True,
                 "mirrored": True},
    # the callbacks people use beside memfit, on noise labels so that validation stalls:
    # ReduceLROnPlateau lowers the rate and EarlyStopping ends the run early (at least
    # 12 epochs are asked for); their state must survive every kill
    "callbacks": {"data": "noise", "every": 6, "validation": True, "metrics": False,
                  "callbacks": True, "min_epochs": 12},
}

p = argparse.ArgumentParser()
p.add_argument("data")
p.add_argument("out")
p.add_argument("--config", choices=sorted(CONFIGS), default="divides")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--backend", choices=("tensorflow", "jax"), default="tensorflow")
args = p.parse_args()
config = CONFIGS[args.config]
JAX = args.backend == "jax"
if JAX and config.get("mirrored"):
    p.error("--config mirrored is tf.distribute's: TensorFlow only")
os.environ["KERAS_BACKEND"] = args.backend

if not JAX:
    import tensorflow as tf

    if config.get("mirrored"):
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import memfit  # noqa: E402
from memfit.supervise.checkpoint import CheckpointStore  # noqa: E402

_write = CheckpointStore.write
MODEL: list = []


def write_marked(self, state, fill):
    before = _now[0]
    phase("checkpoint", iterations(MODEL[0]) if MODEL else None)
    try:
        return _write(self, state, fill)
    finally:
        phase(before)


CheckpointStore.write = write_marked


def iterations(model) -> int:
    return int(np.asarray(model.optimizer.iterations.numpy()))


class Before(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        phase("restore")

    def on_train_batch_begin(self, batch, logs=None):
        phase("step")


class After(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        phase("restored", iterations(self.model))

    def on_train_batch_end(self, batch, logs=None):
        last = self.params.get("steps") and batch + 1 == self.params["steps"]
        phase("epoch-end" if last else "step", iterations(self.model))


class Counter(keras.callbacks.Callback):
    """A user's stateful callback, with memfit's get_state/set_state protocol."""

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


def common_callbacks(out: str) -> tuple[list, dict]:
    named = {
        "stop": keras.callbacks.EarlyStopping(patience=3, restore_best_weights=True),
        "plateau": keras.callbacks.ReduceLROnPlateau(patience=1, factor=0.5),
        "best": keras.callbacks.ModelCheckpoint(os.path.join(out, "best.weights.h5"),
                                                save_best_only=True, save_weights_only=True),
        "every": keras.callbacks.ModelCheckpoint(os.path.join(out, "every.weights.h5"),
                                                 save_weights_only=True, save_freq=7),
        "csv": keras.callbacks.CSVLogger(os.path.join(out, "log.csv")),
        # TensorBoard writes through tf.summary: left out on JAX (no TensorFlow there)
        **({} if JAX else {"board": keras.callbacks.TensorBoard(os.path.join(out, "tb"),
                                                                update_freq=5)}),
        "schedule": keras.callbacks.LearningRateScheduler(
            lambda epoch, lr: lr * 0.9 if epoch % 2 else lr),
        "nan": keras.callbacks.TerminateOnNaN(),
        "counter": Counter(),
    }
    return list(named.values()), named


def callback_summary(named: dict) -> dict:
    return {"stopped_epoch": named["stop"].stopped_epoch,
            "best_epoch": named["stop"].best_epoch, "best": float(named["best"].best),
            "plateau_best": float(named["plateau"].best),
            "every_seen": named["every"]._batches_seen_since_last_saving,
            "train_batch": named["board"]._global_train_batch if "board" in named else None,
            "test_batch": named["board"]._global_test_batch if "board" in named else None,
            "counter": named["counter"].get_state()}


def build(kind: str) -> keras.Model:
    if kind in ("cls", "noise"):
        model = keras.Sequential([
            keras.Input((16,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(4, activation="softmax"),
        ])
    else:
        model = keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.RandomFlip("horizontal"),
            keras.layers.RandomTranslation(0.1, 0.1),
            keras.layers.Conv2D(8, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(4, activation="softmax"),
        ])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"] if config["metrics"] else None)
    return model


data = os.path.join(args.data, config["data"])
with memfit.session(seed=7, checkpoint_every=config["every"], deterministic=True,
                    verbose=1) as s:
    phase("build")
    if JAX:
        model = build(config["data"])
    else:
        strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
                    if config.get("mirrored") else tf.distribute.get_strategy())
        with strategy.scope():
            model = build(config["data"])
    MODEL.append(model)
    extra, named = common_callbacks(OUT) if config.get("callbacks") else ([], {})
    # The session's callback sits among the others, not at either end.
    callbacks = [Before(), *extra[:2], s.callback, *extra[2:], After()]
    epochs = max(args.epochs, config.get("min_epochs", 0))
    if JAX:
        # In-memory NumPy arrays, shuffled by fit from NumPy's global generator (the
        # TF-free memfit.dataset feed for JAX is not there yet): the session puts that
        # generator back as each epoch began, so a resumed epoch draws the same order.
        with np.load(os.path.join(args.data, f"{config['data']}.npz")) as arrays:
            x, y = arrays["x"], arrays["y"]
        cut = len(x) * 4 // 5
        history = model.fit(x[:cut], y[:cut], batch_size=32, shuffle=True,
                            validation_data=(x[cut:], y[cut:]) if config["validation"]
                            else None, epochs=epochs, callbacks=callbacks, verbose=0)
    else:
        train = s.dataset(data, 32, split="train", features=("x", "y"))
        val = (memfit.dataset(data, 32, split="val", features=("x", "y"), shuffle=False)
               if config["validation"] else None)
        history = model.fit(train, validation_data=val, epochs=epochs,
                            callbacks=callbacks, verbose=0)
    phase("finish")

tmp = os.path.join(OUT, ".tmp-final.npz")
with open(tmp, "wb") as f:
    np.savez(f, *[np.asarray(w.numpy()) for w in model.weights])
os.replace(tmp, os.path.join(OUT, "final.npz"))
with open(os.path.join(OUT, "history.json"), "w") as f:
    json.dump(history.history, f)
if named:
    with open(os.path.join(OUT, "callbacks.json"), "w") as f:
        json.dump(callback_summary(named), f)
