"""What a CPU kernel allocates beyond its inputs and results, one op at a time: the
working buffers :func:`memfit.estimate.kernels.workspace` and ``widening`` play.

Each op (a forward and gradient, in a ``tf.function``) runs once to warm up; then the CPU
allocator's stats are reset, it runs again, and "extra" is the allocator's peak over what
it held before, minus the results. With oneDNN on (TensorFlow's default on x86) the CPU
allocator is oneDNN's pool, which has stats; with ``TF_ENABLE_ONEDNN_OPTS=0`` it has none
and this prints nothing useful. Only buffers of 256 KiB or more are in the pool.

    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python benchmarks/onednn_kernels.py
"""

from __future__ import annotations

MiB = 2**20


def main() -> None:
    import tensorflow as tf

    def measure(name: str, fn, *args) -> None:
        f = tf.function(fn)
        f(*args)
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        outs = f(*args)
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
        results = sum(o.numpy().nbytes for o in tf.nest.flatten(outs))
        print(f"| {name} | {sum(a.numpy().nbytes for a in args) / MiB:.1f} | "
              f"{results / MiB:.1f} | {(peak - before - results) / MiB:.1f} |", flush=True)

    def grads(forward):
        def step(*args):
            *inputs, dy = args
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                y = forward(*inputs)
            return tape.gradient(y, inputs, output_gradients=dy)
        return step

    def normal(*shape, dtype=tf.float32):
        return tf.cast(tf.random.normal(shape), dtype)

    conv = grads(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"))
    print("| op | inputs MiB | results MiB | extra MiB |\n| --- | ---: | ---: | ---: |")
    for b, h, cin, cout in [(256, 28, 1, 32), (256, 14, 32, 64), (64, 32, 32, 64),
                            (64, 64, 64, 64)]:
        measure(f"conv 3x3 gradient, float32, {b}x{h}x{h}x{cin} -> {cout}", conv,
                normal(b, h, h, cin), normal(3, 3, cin, cout), normal(b, h, h, cout))
    for dtype in (tf.bfloat16, tf.float16):
        measure(f"conv 3x3 gradient, {dtype.name}, 64x64x64x32 -> 64", conv,
                normal(64, 64, 64, 32, dtype=dtype), normal(3, 3, 32, 64, dtype=dtype),
                normal(64, 64, 64, 64, dtype=dtype))
    measure("conv stride 2 gradient, float32", grads(lambda x, w: tf.nn.conv2d(x, w, 2, "SAME")),
            normal(64, 64, 64, 32), normal(3, 3, 32, 64), normal(64, 32, 32, 64))
    measure("conv 1x9 gradient (Conv1D), float32, 32x1x16000x16 -> 32", conv,
            normal(32, 1, 16000, 16), normal(1, 9, 16, 32), normal(32, 1, 16000, 32))
    measure("conv2d_transpose gradient, float32",
            grads(lambda x, w: tf.nn.conv2d_transpose(x, w, [64, 128, 128, 16], 2, "SAME")),
            normal(64, 64, 64, 32), normal(3, 3, 16, 32), normal(64, 128, 128, 16))
    measure("depthwise 3x3 gradient, float32",
            grads(lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME")),
            normal(64, 64, 64, 32), normal(3, 3, 32, 1), normal(64, 64, 64, 32))
    for dtype in (tf.float32, tf.float16):
        measure(f"max pool 2x2 gradient, {dtype.name}",
                grads(lambda x: tf.nn.max_pool2d(x, 2, 2, "VALID")),
                normal(64, 64, 64, 32, dtype=dtype), normal(64, 32, 32, 32, dtype=dtype))
    measure("avg pool 2x2 gradient, float32", grads(lambda x: tf.nn.avg_pool2d(x, 2, 2, "VALID")),
            normal(64, 64, 64, 32), normal(64, 32, 32, 32))
    measure("fused batch norm gradient, float32",
            grads(lambda x, s, o: tf.compat.v1.nn.fused_batch_norm(x, s, o, is_training=True)[0]),
            normal(64, 64, 64, 32), tf.ones([32]), tf.zeros([32]), normal(64, 64, 64, 32))
    for dtype in (tf.float32, tf.float16):
        measure(f"MatMul {dtype.name}, 4096x2048 @ 2048x2048", lambda a, b: tf.matmul(a, b),
                normal(4096, 2048, dtype=dtype), normal(2048, 2048, dtype=dtype))
    measure("MatMul float16, 32x8192 @ 8192x8192", lambda a, b: tf.matmul(a, b),
            normal(32, 8192, dtype=tf.float16), normal(8192, 8192, dtype=tf.float16))
    measure("BatchMatMul float16, 64x8x256x64 @ (64x8x256x64)T",
            lambda a, b: tf.matmul(a, b, transpose_b=True),
            normal(64, 8, 256, 64, dtype=tf.float16), normal(64, 8, 256, 64, dtype=tf.float16))
    for dtype in (tf.float32, tf.float16):
        measure(f"Einsum {dtype.name}, BTNH,BSNH->BNTS (64, 256, 8, 64)",
                lambda a, b: tf.einsum("BTNH,BSNH->BNTS", a, b),
                normal(64, 256, 8, 64, dtype=dtype), normal(64, 256, 8, 64, dtype=dtype))


if __name__ == "__main__":
    main()
