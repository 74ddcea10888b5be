"""A small, healthy training: memfit doctor finds nothing to change here."""
import keras
import numpy as np

x = np.random.default_rng(0).random((2048, 16), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(1)])
model.compile("adam", "mse")
model.fit(x, y, batch_size=32, epochs=20, verbose=0)
print("clean: trained")
