"""The real GPU memory of a capped TensorFlow process, and four capped trainings under share.

A per-process cap (``LogicalDeviceConfiguration(memory_limit=...)``) bounds TensorFlow's
allocator, not the process: the CUDA context, cuBLAS/cuDNN handles and workspaces come on
top. For caps of 1, 2 and 4 GiB this starts one fresh process per cap that calls
``memfit.configure_device(memory_limit=cap)`` and trains a small CNN for a few steps
(so that cuDNN and cuBLAS are loaded), while this process samples the memory NVML
charges to it. The overhead is NVML's peak minus the cap. Then it runs four capped
trainings together under ``memfit share`` on ``gpu:0``, each charged its cap plus the
overhead measured at 1 GiB, and prints both tables (markdown, with the date) for
docs/share.md.

    .venv/bin/python benchmarks/share_gpu.py             # ~2 min on one GPU
    .venv/bin/python benchmarks/share_gpu.py --caps 1    # one cap, then the share

Without a GPU (NVML sees none) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memfit.share import ShareResult

CHILD = r"""
import json, sys, time
import memfit
config = memfit.configure_device(memory_limit=int(sys.argv[1]))
import numpy as np, keras, tensorflow as tf
model = keras.Sequential([keras.Input((32, 32, 3)),
                          keras.layers.Conv2D(32, 3, activation="relu"),
                          keras.layers.Conv2D(64, 3, activation="relu"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
model.compile(optimizer="adam",
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x = np.random.rand(512, 32, 32, 3).astype("float32")
y = np.random.randint(0, 10, 512)
model.fit(x, y, batch_size=64, epochs=2, verbose=0)
info = tf.config.experimental.get_memory_info("GPU:0")
print(json.dumps({"applied": config.applied, "tf_peak": int(info["peak"])}), flush=True)
time.sleep(1.0)                      # hold still for the parent's last samples
"""

MIB = 2**20


def _gpu() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:               # noqa: BLE001 - no package, no driver, no GPU
        return None


def measure_cap(cap: int) -> dict:
    """NVML's peak for one capped process (sampled every 50 ms from here)."""
    from memfit.memory.probe import nvml_memory

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "0"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(cap)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    peak = 0
    while proc.poll() is None:
        value = nvml_memory(proc.pid)
        if value is not None:
            peak = max(peak, value)
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"the child for a cap of {cap // MIB} MiB failed:\n{err[-2000:]}")
    report = json.loads(out.strip().splitlines()[-1])
    return {"cap": cap, "nvml_peak": peak, "overhead": peak - cap, **report}


def share_four(cap: int, overhead: int, workdir: Path) -> ShareResult:
    """Four capped trainings (examples/share/train.py) together under memfit share."""
    import memfit

    train = str(Path(__file__).resolve().parent.parent / "examples" / "share" / "train.py")
    jobs = [{"name": f"mlp-{w}", "command": ["python", train, "--width", str(w),
                                             "--epochs", "3", "--batch-size", "256"],
             "need": cap} for w in (64, 256, 1024, 4096)]
    budget = 4 * (cap + overhead) + 64 * MIB
    return memfit.share_jobs(jobs, budget=budget, device="gpu:0", overhead=overhead,
                        workdir=workdir, interval=0.2, out=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--caps", default="1,2,4", help="caps in GiB (default: 1,2,4)")
    args = parser.parse_args()
    gpu = _gpu()
    if gpu is None:
        print("share_gpu: no GPU is visible (NVML reports none): nothing measured. Run this "
              "on a machine with an NVIDIA GPU.")
        return 0
    import tensorflow as tf

    caps = [int(float(c) * 2**30) for c in args.caps.split(",")]
    rows = [measure_cap(cap) for cap in caps]
    date = datetime.date.today().isoformat()
    print(f"\nGPU: {gpu}; TensorFlow {tf.__version__}; {date}\n")
    print("| cap (memory_limit) | NVML peak of the process | overhead above the cap | "
          "TF allocator peak |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['cap'] // MIB:,} MiB | {r['nvml_peak'] // MIB:,} MiB | "
              f"{r['overhead'] // MIB:,} MiB | {r['tf_peak'] // MIB:,} MiB |")
    with tempfile.TemporaryDirectory() as tmp:
        result = share_four(caps[0], rows[0]["overhead"], Path(tmp) / "share")
    print(f"\nfour trainings capped at {caps[0] // MIB:,} MiB under memfit share, each "
          f"charged {caps[0] // MIB:,} MiB + {rows[0]['overhead'] // MIB:,} MiB:\n")
    print("| job | state | NVML peak | share | took |")
    print("|---|---|---|---|---|")
    for j in result.jobs:
        peak = "-" if j.peak is None else f"{j.peak // MIB:,} MiB"
        print(f"| {j.name} | {j.state} | {peak} | {j.share // MIB:,} MiB | "
              f"{j.duration or 0:.1f} s |")
    print(f"\nmakespan {result.makespan:.1f} s, one after another {result.serial:.1f} s; most "
          f"in use at once {result.max_in_use // MIB:,} MiB of {result.plan.budget // MIB:,} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
