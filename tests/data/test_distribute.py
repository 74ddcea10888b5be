"""tf.distribute: run in a child process, since logical CPU devices must be set up before
TensorFlow initialises (and the test process already has)."""

import subprocess
import sys
import textwrap

import numpy as np

import memfit


def test_mirrored_strategy_with_input_context(tmp_path):
    rng = np.random.default_rng(0)
    memfit.pack({"x": rng.random((512, 4), dtype=np.float32), "y": rng.random(512)},
                tmp_path / "ds", shards=4, samples_per_record=8, progress=False)
    script = textwrap.dedent(f"""
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras, memfit
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        def make(ctx):
            return memfit.dataset({str(tmp_path / "ds")!r}, ctx.get_per_replica_batch_size(64),
                                  features=("x", "y"), input_context=ctx)
        dist = strategy.distribute_datasets_from_function(make)
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        h = model.fit(dist, epochs=2, steps_per_epoch=8, verbose=0)
        print("REPLICAS", strategy.num_replicas_in_sync, "EPOCHS", len(h.history["loss"]))
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REPLICAS 2 EPOCHS 2" in out.stdout
