"""The data set in RAM: fit() is given 128 MiB of NumPy arrays (Keras copies them again)."""
import keras
import numpy as np

x_train = np.random.default_rng(0).random((8192, 4096), dtype=np.float32)    # 128 MiB
y_train = np.zeros((8192, 1), np.float32)
model = keras.Sequential([keras.Input((4096,)), keras.layers.Dense(1)])
model.compile("adam", "mse")
model.fit(x_train, y_train, batch_size=64, epochs=5, verbose=0)
