import warnings

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


def test_fit_a_model_on_named_inputs_and_an_autoencoder(tmp_path):
    # features as a nesting of names: the dict a model built on named Inputs takes, and
    # one feature in two places (an autoencoder's (x, x)), which a flat tuple refuses.
    rng = np.random.default_rng(2)
    table = rng.random((256, 8), dtype=np.float32)
    image = rng.random((256, 6, 6, 2), dtype=np.float32)
    price = (table.sum(axis=1, keepdims=True) + image.mean(axis=(1, 2, 3))[:, None])
    memfit.pack({"table": table, "image": image, "price": price.astype(np.float32)},
                tmp_path / "ds", samples_per_record=16, progress=False)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ds = memfit.dataset(tmp_path / "ds", 32, features=({"table": "table", "image": "image"},
                                                           "price"))
    assert not [str(w.message) for w in said]                 # no tf.data noise either
    x, y = next(iter(ds))
    assert sorted(x) == ["image", "table"] and tuple(x["image"].shape) == (32, 6, 6, 2)
    assert tuple(y.shape) == (32, 1)
    assert ds.memfit_plan.steps_per_epoch == 8
    inputs = {"table": keras.Input((8,), name="table"), "image": keras.Input((6, 6, 2),
                                                                          name="image")}
    h = keras.layers.Concatenate()([inputs["table"],
                                    keras.layers.GlobalAveragePooling2D()(inputs["image"])])
    keras.utils.set_random_seed(0)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(keras.optimizers.Adam(0.05), "mse")
    history = model.fit(ds, epochs=4, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]

    auto = memfit.dataset(tmp_path / "ds", 32, features=("table", "table"), shuffle=False)
    a, b = next(iter(auto))
    np.testing.assert_array_equal(a.numpy(), b.numpy())          # the same rows, twice
    rows = {r.tobytes() for r in table}
    assert all(r.tobytes() in rows for r in a.numpy())
