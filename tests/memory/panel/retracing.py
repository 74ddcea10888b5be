"""4. A tf.function called with a new Python float each step: it retraces every call."""

import tensorflow as tf
from common import run

tf.get_logger().setLevel("ERROR")
x = tf.ones((8, 8))


@tf.function
def scaled(t, scale):
    return tf.reduce_sum(tf.matmul(t, t) * scale)


calls = 0


def step(epoch):
    global calls
    for _ in range(150):
        calls += 1
        scaled(x, float(calls) / 7.0)


run(step)
