"""memfit end to end on built-in data: make an image dataset on disk, pack it, verify it,
and train a small CNN from the stream under a memory budget, supervised by `memfit run`
(restarted once halfway, resuming exactly) with a MemoryMonitor in each process, then
write the memory report (timeline PNG + HTML) with the restart on it.

Run with `make demo` (or `python examples/demo.py --workdir DIR --samples N`).
Nothing is downloaded: the images are generated (class-dependent patterns plus noise).
`python examples/demo.py train ...` is the training process that `memfit run` starts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

import memfit
from memfit.quiet import quieted

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def make_images(workdir: Path, samples: int, seed: int = 0) -> dict[str, str]:
    """Writes images.npy (uint8, N×32×32×3) and labels.npy in chunks, never all in RAM."""
    rng = np.random.default_rng(seed)
    patterns = rng.integers(0, 256, (10, 32, 32, 3)).astype(np.float32)
    x = np.lib.format.open_memmap(workdir / "images.npy", "w+", np.uint8, (samples, 32, 32, 3))
    y = np.lib.format.open_memmap(workdir / "labels.npy", "w+", np.int64, (samples,))
    for start in range(0, samples, 4096):
        n = min(4096, samples - start)
        labels = rng.integers(0, 10, n)
        noise = rng.normal(0, 60, (n, 32, 32, 3)).astype(np.float32)
        x[start:start + n] = np.clip(0.6 * patterns[labels] + noise + 50, 0, 255)
        y[start:start + n] = labels
    x.flush()
    y.flush()
    return {"x": str(workdir / "images.npy"), "y": str(workdir / "labels.npy")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", nargs="?", choices=("demo", "train"), default="demo")
    parser.add_argument("--workdir", default="demo-workdir")
    parser.add_argument("--samples", type=int, default=40_000)
    parser.add_argument("--budget", default="64MiB", help="memory budget of the input pipeline")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode == "train":
        train(args)
        return
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    print(f"1. generating {args.samples:,} 32×32×3 images on disk in {workdir}/ ...")
    arrays = make_images(workdir, args.samples)
    size = sum(os.path.getsize(p) for p in arrays.values())
    budget = memfit.parse_size(args.budget)
    print(f"   {memfit.format_size(size)} of arrays; the input pipeline gets "
          f"{memfit.format_size(budget)}")

    print("2. memfit.pack: seeded shuffle, 90/10 split, checksummed shards")
    with memfit.measure() as packing:
        result = memfit.pack(arrays, workdir / "data", split="train=0.9,val=0.1",
                             overwrite=True)
    print(f"   {result}")
    print(f"   pack memory: anonymous RSS +{memfit.format_size(packing.peak_delta)} at peak "
          f"(arrays are memory-mapped; file pages are page cache, not a leak)")
    print("3. memfit verify")
    print(f"   {memfit.verify(workdir / 'data')}")
    print(memfit.inspect(workdir / "data"))

    run = workdir / "run"
    shutil.rmtree(run, ignore_errors=True)              # one run per report
    restart_every = max(1, args.epochs // 2)
    print(f"4. training a small CNN from the stream under memfit run, restarted every "
          f"{restart_every} epochs")
    started = time.perf_counter()
    # As `memfit run` does on the command line: the training's output, without
    # TensorFlow's start-up lines (memfit.quiet).
    with quieted():
        outcome = memfit.run([sys.executable, __file__, "train", "--data",
                              str(workdir / "data"), "--budget", args.budget, "--epochs",
                              str(args.epochs)], workdir=run, restart_every=restart_every)
    seconds = time.perf_counter() - started
    if not outcome.finished:
        raise SystemExit(f"the training did not finish: {outcome.stop_reason}")
    from memfit.report import write_report

    report = write_report(run)
    seen = args.epochs * int(0.9 * args.samples)
    print(f"   {seen / seconds:,.0f} samples/s over the whole run, restart included")
    print(f"done: dataset in {workdir / 'data'} ({memfit.format_size(result.bytes)}); "
          f"memory report: {report.html}")


def train(args: argparse.Namespace) -> None:
    """The training process: a session (checkpoints, exact resume) around a plain fit."""
    import keras

    budget = memfit.parse_size(args.budget)
    with memfit.session(seed=0) as s:           # the workdir comes from memfit run
        # epochs=N: one pass yields every epoch from s.epoch on, so Keras keeps one
        # iterator for the whole fit (with steps_per_epoch); each epoch's order is still a
        # function of (seed, epoch), so the resumed process sees the same batches.
        train = s.dataset(args.data, 128, split="train", features=("x", "y"),
                          memory_budget=budget, epochs=args.epochs)
        val = memfit.dataset(args.data, 256, split="val", features=("x", "y"),
                             shuffle=False, memory_budget=budget)
        if not s.resumed:
            print(f"   {train.memfit_plan}")
        model = keras.Sequential([
            keras.Input((32, 32, 3), dtype="uint8"),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        # trim="epoch": glibc keeps the buffers the pipeline frees in per-thread arenas;
        # giving them back at each epoch end keeps RSS level (without it the monitor
        # reports allocator-retention, and says so).
        monitor = memfit.MemoryMonitor(every_n_batches=20, trim="epoch", warmup_epochs=1)
        with memfit.measure() as training:
            history = model.fit(train, validation_data=val, epochs=args.epochs, verbose=2,
                                steps_per_epoch=train.memfit_plan.steps_per_epoch,
                                callbacks=[s.callback, monitor])
    print(f"   val_accuracy by epoch (all processes): "
          f"{[round(a, 3) for a in history.history['val_accuracy']]}")
    print(f"   this process: anonymous RSS grew by "
          f"{memfit.format_size(training.peak_delta)} at peak (TensorFlow runtime, model, "
          f"and a pipeline bounded by {memfit.format_size(budget)}); memory verdict: "
          f"{monitor.verdict.headline if monitor.verdict else 'n/a'}")

if __name__ == "__main__":
    main()
