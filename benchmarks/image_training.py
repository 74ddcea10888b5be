"""Training throughput from packed images against ``image_dataset_from_directory``
(issue 30: goal ≥ 2), same folder, same model, same batch.

The folder: ``--count`` photo-like JPEGs and PNGs of 300–640 px a side in 4 classes, made
by ``benchmarks/image_pack_speed.py``'s generator (reused when already made), packed once
at 128×128 (``memfit.pack``, untimed). The model, the same on every side: ``Rescaling(1/255)``
→ 3 × (``Conv2D(16/32/64, 3, relu)`` → ``MaxPooling2D``) → ``GlobalAveragePooling2D`` →
``Dense(4)``, Adam, sparse cross-entropy from logits, batch 64, 128×128×3.

Sides, each round each in its own child process (``model.fit(epochs=2)``; the first epoch
is the warm-up: tracing, page cache, and for the cached side filling the cache; the
second is timed by a callback):

- **memfit**: ``memfit.dataset(packed, 64, features=("image", "label"))`` (uint8 images,
  int64 labels; ``memory_budget`` 256 MiB);
- **keras**: ``keras.utils.image_dataset_from_directory(folder, image_size=(128, 128),
  batch_size=64).prefetch(AUTOTUNE)``, as its guide suggests (it decodes and resizes every
  file every epoch);
- **keras + cache** (unless ``--no-cache``): the same ``.cache().prefetch(AUTOTUNE)``:
  the decoded float32 images kept in RAM after the first epoch (``--count`` × 192 KiB:
  what a data set larger than RAM cannot do);
- **in RAM** (unless ``--no-ram``): the packed uint8 images read into NumPy arrays first
  (untimed), then ``from_tensor_slices(...).shuffle(all).batch(64).prefetch(AUTOTUNE)``:
  the model's own speed on this machine, the ceiling of any input pipeline.

With ``--model none`` no model is built or trained: each child iterates its pipeline for a
warm-up epoch and 3 timed ones (the ratio a model that costs nothing would see).

Rounds interleave the sides (A, B, C, D, D, C, B, A, ...). Prints a markdown table: samples/s of
each, median (min–max), and the per-round ratios; ``--json FILE`` also writes them as JSON
(every round's value beside the median, min and max).

    PYTHONPATH=src .venv/bin/python benchmarks/image_training.py --count 1200 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from image_pack_speed import make_folder, spread  # noqa: E402

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
BATCH = 64
SIZE = (128, 128)

# One side's epochs, in a child: argv = side, folder, packed, classes, model. Prints JSON.
CHILD = r"""
import json, sys, time
side, folder, packed, classes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with_model = sys.argv[5] == "cnn"
import keras
import tensorflow as tf

H, W, B = 128, 128, 64
if side == "memfit":
    import memfit
    ds = memfit.dataset(packed, B, features=("image", "label"))
elif side == "ram":
    import numpy as np
    import memfit
    pairs = list(memfit.dataset(packed, B, features=("image", "label"), shuffle=False))
    x = np.concatenate([a.numpy() for a, _ in pairs])
    y = np.concatenate([b.numpy() for _, b in pairs])
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).batch(B)
    ds = ds.prefetch(tf.data.AUTOTUNE)
else:
    ds = keras.utils.image_dataset_from_directory(folder, image_size=(H, W), batch_size=B)
    if side == "keras-cache":
        ds = ds.cache()
    ds = ds.prefetch(tf.data.AUTOTUNE)

keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((H, W, 3)),
    keras.layers.Rescaling(1 / 255),
    keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(classes)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Clock(keras.callbacks.Callback):
    def __init__(self):
        self.seconds, self.batches = [], 0
    def on_epoch_begin(self, epoch, logs=None):
        self.start, self.batches = time.perf_counter(), 0
    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.start)


clock = Clock()
if with_model:
    model.fit(ds, epochs=2, verbose=0, callbacks=[clock])
else:                           # the input pipeline alone: a warm-up pass, then 3 timed
    for epoch in range(4):
        clock.on_epoch_begin(epoch)
        for batch in ds:
            clock.on_train_batch_end(0)
        clock.on_epoch_end(epoch)
    clock.seconds = [clock.seconds[0], sum(clock.seconds[1:]) / 3]
print(json.dumps({"seconds": clock.seconds, "batches": clock.batches}))
"""


def run_side(side: str, folder: Path, packed: Path, classes: int, model: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, side, str(folder), str(packed),
                           str(classes), model], env=ENV, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{side} failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1200)
    ap.add_argument("--png-every", type=int, default=10, help="every Nth image a PNG")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-cache", action="store_true", help="leave out the cached side")
    ap.add_argument("--no-ram", action="store_true", help="leave out the in-RAM side")
    ap.add_argument("--model", choices=("cnn", "none"), default="cnn",
                    help="none: iterate the input pipelines alone, no model")
    ap.add_argument("--dir", default="/tmp/memfit-image-training")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    args = ap.parse_args()

    import memfit

    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    folder = make_folder(work / "photos", args.count, args.png_every)
    packed = work / "packed"
    memfit.pack(images=folder, image_size=SIZE, output=packed, progress=False,
                overwrite=True)
    print(f"folder and pack ready in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    classes = len([d for d in folder.iterdir() if d.is_dir()])
    sides = ["memfit", "keras"] + ([] if args.no_cache else ["keras-cache"]) \
        + ([] if args.no_ram else ["ram"])
    rate: dict[str, list[float]] = {s: [] for s in sides}
    first: dict[str, list[float]] = {s: [] for s in sides}
    steps = -(-args.count // BATCH)
    for r in range(args.rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            out = run_side(side, folder, packed, classes, args.model)
            assert out["batches"] == steps, (side, out, steps)
            rate[side].append(args.count / out["seconds"][1])
            first[side].append(args.count / out["seconds"][0])
        print(f"round {r + 1}: " + ", ".join(f"{s} {v[-1]:,.0f}/s" for s, v in rate.items()),
              file=sys.stderr)

    def shown(v: list[float], fmt: str) -> str:
        return f"{statistics.median(v):{fmt}} ({min(v):{fmt}}–{max(v):{fmt}})"

    names = {"memfit": "`memfit.dataset(packed, 64)`",
             "keras": "`image_dataset_from_directory(...).prefetch(AUTOTUNE)`",
             "keras-cache": "`image_dataset_from_directory(...).cache().prefetch(AUTOTUNE)`",
             "ram": "in RAM: `from_tensor_slices(uint8 arrays)` (the model's ceiling)"}
    what = "the small CNN, epoch 2 of model.fit timed" if args.model == "cnn" else \
        "no model: the pipeline iterated, 3 epochs timed after a warm-up one"
    print(f"{args.count:,} images (300–640 px a side, every {args.png_every}th a PNG) in "
          f"{classes} classes at 128x128, batch {BATCH}; {what}; {args.rounds} rounds "
          f"interleaved, each side a child; {os.cpu_count()} "
          f"cores, load {os.getloadavg()[0]:.1f} at the end\n")
    print("| input | samples/s, timed epoch | memfit ÷ it, per round | first epoch samples/s |")
    print("| --- | --- | --- | --- |")
    figures = {"images": args.count, "classes": classes, "batch": BATCH, "model": args.model,
               "rounds": args.rounds, "samples_per_s": {}, "first_epoch_samples_per_s": {},
               "memfit_to": {}}
    for side in sides:
        ratio = [m / o for m, o in zip(rate["memfit"], rate[side], strict=True)]
        print(f"| {names[side]} | {shown(rate[side], ',.0f')} | "
              f"{shown(ratio, '.2f') if side != 'memfit' else '—'} | "
              f"{shown(first[side], ',.0f')} |")
        figures["samples_per_s"][side] = spread(rate[side])
        figures["first_epoch_samples_per_s"][side] = spread(first[side])
        if side != "memfit":
            figures["memfit_to"][side] = spread(ratio)
    print("\ngoal: memfit ÷ image_dataset_from_directory (prefetch) ≥ 2")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
