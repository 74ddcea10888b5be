"""A small Keras training job for `memfit share` (see examples/jobs.toml).

It calls memfit.configure_device() first: under `memfit share` on a GPU that caps
TensorFlow at the job's need; on the CPU it does nothing and says so. Then it trains an
MLP on random data and prints the final loss. `build_model` is what `need = "auto"`
estimates (model = "examples/share/train.py:build_model").

    python examples/share/train.py --width 256 --epochs 3
"""

import argparse

import memfit


def build_model(width: int = 64, features: int = 32):
    """The model: Dense(width) → Dense(1), Adam, mean squared error."""
    import keras

    model = keras.Sequential([keras.Input((features,)),
                              keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2048)
    args = parser.parse_args()

    print(memfit.configure_device().message, flush=True)   # before any TensorFlow op
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.samples, 32)).astype("float32")
    y = (x @ rng.normal(size=(32, 1))).astype("float32")
    model = build_model(args.width)
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=0)
    print(f"width {args.width}: loss {history.history['loss'][-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
