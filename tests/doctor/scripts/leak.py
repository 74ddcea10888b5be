"""A leak: a callback keeps 2 MiB more after every batch (as a list of predictions would)."""
import keras
import numpy as np

KEPT = []


class KeepSomething(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        KEPT.append(b"x" * (2 * 2**20))          # bytes, filled: resident


x = np.random.default_rng(0).random((4096, 16), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(1)])
model.compile("adam", "mse")
model.fit(x, y, batch_size=32, epochs=10, verbose=0, callbacks=[KeepSomething()])
