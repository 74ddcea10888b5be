"""Activations dominate: a convolution on 96x96 images at batch 64 keeps ~100 MiB for the
backward pass, against a few KiB of weights. The data is generated, not held in RAM."""
import keras
import tensorflow as tf

ds = (tf.data.Dataset.range(10_000)
      .map(lambda i: (tf.random.uniform((96, 96, 3)), tf.zeros((1,))))
      .batch(64))
model = keras.Sequential([keras.Input((96, 96, 3)),
                          keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                          keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1)])
model.compile("adam", "mse")
model.fit(ds, epochs=2, verbose=0)
