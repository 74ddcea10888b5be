"""What TensorFlow itself holds at a training step's peak, against the estimator's play.

TensorFlow's CPU allocator is plain ``malloc`` unless ``TF_CPU_ALLOCATOR_USE_BFC=true``
makes it its BFC allocator, which counts the bytes of every tensor it hands out (kernel
buffers included) and feeds ``tf.profiler``'s memory profile. This script runs a few
training steps of a model that way and prints, per step, the bytes TensorFlow held at the
peak above what it held before the step, next to the step peak ``memfit.estimate`` plays
for the same model, batch and policy. With ``--tensors`` it also lists the tensors alive
at the peak of one profiled step (op, shape, dtype). It is how the play's kernel buffers,
executor threads and LSTM accumulators were checked (docs/estimate.md).

    .venv/bin/python benchmarks/estimate_tf_allocator.py lstm -b 32,128,512
    .venv/bin/python benchmarks/estimate_tf_allocator.py small_cnn -b 64 --tensors
    .venv/bin/python benchmarks/estimate_tf_allocator.py path/to/model.py:build -b 64

MODEL is a name from ``benchmarks/estimate_accuracy.py``'s panel or ``module:function``.
The BFC allocator rounds each tensor up to its bins, so its figures run a little above the
tensors' own sizes.
"""

from __future__ import annotations

import os

os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"       # before TensorFlow is imported
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

MIB = 2**20
HERE = Path(__file__).resolve().parent


def _source(model: str) -> tuple[str, tuple[int, ...] | None]:
    sys.path.insert(0, str(HERE))
    import estimate_accuracy as panel

    shapes = {name: shape for name, _, shape in panel.PANEL}
    if model in shapes:
        return f"{panel.SOURCE}:{model}", shapes[model]
    return model, None


def _held(model, x, y, steps: int) -> list[float]:
    import tensorflow as tf

    out = []
    for _ in range(steps):
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        model.train_on_batch(x, y)
        out.append((tf.config.experimental.get_memory_info("CPU:0")["peak"] - before) / MIB)
    return out


def _tensors_at_peak(model, x, y) -> list[tuple[float, str, str, str]]:
    import tensorflow as tf
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin as plugin

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        model.train_on_batch(x, y)
        tf.profiler.experimental.stop()
        path = sorted(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True))[-1]
        data = plugin.xspace_to_tools_data([path], "memory_profile")
    raw = data[0] if isinstance(data, tuple) else data
    profile = json.loads(raw)["memoryProfilePerAllocator"]
    rows = []
    for allocator in profile.values():
        snapshots = allocator["memoryProfileSnapshots"]
        for active in allocator["activeAllocations"]:
            index = int(active["snapshotIndex"])
            if index < 0:
                continue
            meta = snapshots[index]["activityMetadata"]
            size = int(meta.get("allocationBytes", 0)) / MIB
            if size >= 1:
                rows.append((size, meta.get("tfOpName", ""), meta.get("tensorShape", ""),
                             meta.get("dataType", "")))
    return sorted(rows, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a panel name or module:function")
    parser.add_argument("-b", "--batch-sizes", default="32", help="comma-separated")
    parser.add_argument("--dtype-policy", default="float32")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per batch size")
    parser.add_argument("--tensors", action="store_true",
                        help="list the tensors alive at the peak of one profiled step")
    args = parser.parse_args()
    import keras
    import numpy as np

    from memfit.estimate import Estimator
    from memfit.estimate.training import prepare

    source, shape = _source(args.model)
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        keras.backend.clear_session()
        setup = prepare(source, dtype_policy=args.dtype_policy, input_shape=shape)
        model = setup.model
        xs = [np.zeros((batch, *s), d) for s, d in setup.inputs]
        ys = [np.zeros((batch, *s), d) for s, d in setup.targets]
        x, y = (xs[0] if len(xs) == 1 else xs), (ys[0] if len(ys) == 1 else ys)
        model.train_on_batch(x, y)                    # trace and warm up
        held = _held(model, x, y, args.steps)
        played = Estimator(source, dtype_policy=args.dtype_policy, input_shape=shape,
                           allocator="fixed").features(batch)["peak"] / MIB
        print(f"{args.model} {args.dtype_policy} batch {batch}: TensorFlow held "
              f"{', '.join(f'{h:.1f}' for h in held)} MiB above the step's start; "
              f"the estimate plays {played:.1f} MiB of step tensors", flush=True)
        if args.tensors:
            for size, op, tensor_shape, dtype in _tensors_at_peak(model, x, y):
                print(f"  {size:8.1f} MiB  {op}  {tensor_shape} {dtype}")


if __name__ == "__main__":
    main()
