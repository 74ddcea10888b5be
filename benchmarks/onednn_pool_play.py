"""The played oneDNN pool against the real one: for each case, four real training steps in
a child process report the pool's peak bytes in use per step
(``tf.config.experimental.get_memory_info("CPU:0")``, reset before each step), beside the
peak in use of the pool the estimate plays (:mod:`memfit.estimate.pool`) for the same
model and batch size.

Needs oneDNN on (TensorFlow's default on x86): without it the CPU has no allocator stats.

    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python benchmarks/onednn_pool_play.py
    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python benchmarks/onednn_pool_play.py vgg_tiny:64 \
        mlp_8192:32:mixed_float16          # MODEL:BATCH[:DTYPE POLICY]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = HERE / "estimate_family_models.py"
#: One or two models per family, at a batch size of the family panel.
CASES = ["vgg_tiny:64", "resnet_cifar:64", "separable_net:32", "unet_96:8",
         "conv_autoencoder:64", "bigru_text:64", "cross_attention:128", "audio_conv1d:16",
         "bag_of_words:256", "two_input:64", "mlp_8192:32"]
MiB = 2**20

CHILD = r"""
import json, sys
import numpy as np, tensorflow as tf
sys.path.insert(0, sys.argv[1])
from estimate_family_models import FAMILIES
from memfit.estimate import Estimator
from memfit.estimate.training import make_batch, prepare
from memfit.memory.allocator import FIXED_MMAP_THRESHOLD
name, b, policy = sys.argv[2], int(sys.argv[3]), sys.argv[4]
shape = {n: s for cases in FAMILIES.values() for n, _, s in cases}[name]
source = f"{sys.argv[1]}/estimate_family_models.py:{name}"
setup = prepare(source, input_shape=shape, dtype_policy=policy)
x, y = make_batch(setup, b)
real = []
for _ in range(4):
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    setup.model.train_on_batch(x, y)
    real.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - before)
est = Estimator(source, input_shape=shape, allocator="fixed", onednn=True,
                dtype_policy=policy)
played = est.step.peak(b, FIXED_MMAP_THRESHOLD, pool=True, kept=est.kept,
                       step_inputs=[est.per_sample_input])
print("RESULT " + json.dumps({"real": real, "played": played.pool_in_use,
                              "touched": played.pool_bytes, "live": played.bytes}))
"""


def run(case: str) -> dict:
    """One case in its own process: the real pool's step peaks and the played pool's."""
    name, batch, *policy = case.split(":")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")}
    out = subprocess.run([sys.executable, "-c", CHILD, str(HERE), name, batch,
                          *(policy or ["float32"])], env=env,
                         capture_output=True, text=True, timeout=900)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"error": (out.stderr or out.stdout)[-400:]}
    return json.loads(line.removeprefix("RESULT "))


def main() -> None:
    cases = sys.argv[1:] or CASES
    print("| case | real pool, peak in use per step (MiB) | played pool, peak in use | "
          "played ÷ real (steps 2-4) | played pages written | play's live peak |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    ratios = []
    for case in cases:
        r = run(case)
        if "error" in r:
            print(f"| {case} | failed: {r['error'].splitlines()[-1] if r['error'] else '?'} "
                  "| | | | |", flush=True)
            continue
        real = max(r["real"][1:])
        ratios.append(r["played"] / real)
        steps = ", ".join(f"{v / MiB:.1f}" for v in r["real"])
        print(f"| {case} | {steps} | {r['played'] / MiB:.1f} | {r['played'] / real:.3f} | "
              f"{r['touched'] / MiB:.1f} | {r['live'] / MiB:.1f} |", flush=True)
    if ratios:
        print(f"\n{len(ratios)} cases: played ÷ real from {min(ratios):.3f} to "
              f"{max(ratios):.3f}; within 10 % on {sum(abs(x - 1) <= 0.10 for x in ratios)}.")


if __name__ == "__main__":
    main()
