"""Is TensorFlow's CPU allocator a pool here? Three steps of a 3×3 convolution gradient
on a 64×64×64×32 input, then what the process keeps and what
``tf.config.experimental.get_memory_info("CPU:0")`` says.

With oneDNN on (TensorFlow's default on x86 CPUs with AVX-512 VNNI), allocations of
256 KiB or more come from oneDNN's BFC pool, which reports stats and keeps what it grew
to; with ``TF_ENABLE_ONEDNN_OPTS=0`` there are no stats. Run it both ways:

    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python benchmarks/onednn_pool.py
    TF_ENABLE_ONEDNN_OPTS=0 TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python benchmarks/onednn_pool.py
"""

from __future__ import annotations

import os

import psutil
import tensorflow as tf

MIB = 2**20


def main() -> None:
    process = psutil.Process()
    before = process.memory_full_info().uss
    x = tf.random.normal([64, 64, 64, 32])
    k = tf.random.normal([3, 3, 32, 32])
    for _ in range(3):
        with tf.GradientTape() as tape:
            tape.watch(k)
            y = tf.nn.conv2d(x, k, 1, "SAME")
            z = tf.reduce_sum(y * y)
        tape.gradient(z, k)
        del y, z
    kept = (process.memory_full_info().uss - before) / MIB
    try:
        info = tf.config.experimental.get_memory_info("CPU:0")
        stats = f"current {info['current'] / MIB:.0f} MiB, peak {info['peak'] / MIB:.0f} MiB"
    except ValueError:
        stats = "no allocator stats (not a pool)"
    print(f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', '(unset)')}: "
          f"the process kept +{kept:.0f} MiB after 3 steps; CPU allocator: {stats}")


if __name__ == "__main__":
    main()
