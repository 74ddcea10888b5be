"""A big shuffle buffer: shuffle(2000) on 48 KiB records holds ~94 MiB, before the first
batch. The records are made by a map, so the data itself is not in RAM."""
import keras
import tensorflow as tf

ds = (tf.data.Dataset.range(2000)
      .map(lambda i: (tf.fill((64, 64, 3), tf.cast(i, tf.float32)), tf.zeros((1,))))
      .shuffle(2000)
      .batch(32))
model = keras.Sequential([keras.Input((64, 64, 3)), keras.layers.Flatten(),
                          keras.layers.Dense(1)])
model.compile("adam", "mse")
model.fit(ds, epochs=3, verbose=0)
