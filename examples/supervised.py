"""A Keras training that survives restarts: checkpoint every epoch, resume exactly.

Pack a dataset once, then run this script under ``memfit run``::

    python examples/supervised.py --make-data data/images      # 6,000 32x32x3 images
    memfit run --workdir runs/cnn --restart-every 2 -- \\
        python examples/supervised.py --data data/images --epochs 6
    memfit report runs/cnn                                     # restarts on the timeline

Run alone, it resumes from ``runs/cnn`` (``--workdir``) when started again. Under
``memfit run`` it is restarted every N epochs, at ``--max-rss``, or after a crash, and
ends with the weights an uninterrupted run would have (``--deterministic``: bit for bit).
"""

from __future__ import annotations

import argparse
import time

import keras
import numpy as np

import memfit


def build_model() -> keras.Model:
    """A small CNN for 32x32x3 images and 10 classes, compiled."""
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def make_data(path: str, samples: int = 6000) -> None:
    """Packs ``samples`` image-like uint8 samples whose class is learnable."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, samples).astype("int64")
    x = rng.integers(0, 128, (samples, 32, 32, 3), dtype=np.uint8)
    x[np.arange(samples), :, :, y % 3] += (y * 12).astype(np.uint8)[:, None, None]
    memfit.pack({"x": x, "y": y}, path, overwrite=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a dataset packed by memfit (see --make-data)")
    p.add_argument("--make-data", metavar="PATH", help="pack a generated dataset and exit")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workdir", help="default: $MEMFIT_WORKDIR (memfit run), else memfit-run")
    p.add_argument("--deterministic", action="store_true",
                   help="TensorFlow op determinism: resumes equal bit for bit")
    p.add_argument("--step-sleep", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.make_data:
        make_data(args.make_data)
        return
    if not args.data:
        p.error("give --data (a packed dataset), or --make-data PATH first")

    # The pattern: a session around an ordinary Keras script.
    with memfit.session(args.workdir, seed=0, deterministic=args.deterministic) as s:
        model = build_model()
        train = s.dataset(args.data, args.batch_size, features=("x", "y"))
        callbacks = [s.callback, memfit.MemoryMonitor(s.workdir.path, verbose=0)]
        if args.step_sleep:         # slows steps down, for demos of memory restarts
            callbacks.append(keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda batch, logs: time.sleep(args.step_sleep)))
        history = model.fit(train, epochs=args.epochs, callbacks=callbacks, verbose=2)
    print(f"accuracy by epoch: {[round(a, 3) for a in history.history['accuracy']]}")


if __name__ == "__main__":
    main()
