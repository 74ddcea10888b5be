import keras
import numpy as np

import memfit


def test_model_fit_with_validation_and_early_stopping(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1200, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    memfit.pack({"x": x, "y": y}, tmp_path / "ds", split="train=0.8,val=0.2",
                samples_per_record=16, progress=False)
    train = memfit.dataset(tmp_path / "ds", 32, split="train", features=("x", "y"))
    val = memfit.dataset(tmp_path / "ds", 64, split="val", features=("x", "y"), shuffle=False)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1)
    history = model.fit(train, validation_data=val, epochs=30, callbacks=[stop], verbose=0)
    assert len(history.history["loss"]) < 30              # early stopping stopped it
    assert history.history["val_accuracy"][-1] > 0.9      # and it learned from the stream
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_fit_with_steps_per_epoch_over_an_epochs_dataset(tmp_path):
    rng = np.random.default_rng(1)
    memfit.pack({"x": rng.random((300, 4), dtype=np.float32), "y": rng.random(300)},
                tmp_path / "ds", progress=False)
    ds = memfit.dataset(tmp_path / "ds", 50, features=("x", "y"), epochs=3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    h = model.fit(ds, epochs=3, steps_per_epoch=ds.memfit_plan.steps_per_epoch, verbose=0)
    assert len(h.history["loss"]) == 3
