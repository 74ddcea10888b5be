"""TFRecord files of the recipe read three ways, samples/s, side by side (issue 30):

(a) the recipe's own pipeline: ``TFRecordDataset(files)`` → ``shuffle(3000)`` →
    ``map(parse_single_example + parse_tensor, 8)`` → ``batch(256)`` → ``prefetch(64)``;
(b) ``memfit.dataset(files, 256)``: the same files streamed in place;
(c) ``memfit.dataset(pack, 256)``: a pack of them (``memfit.pack(tfrecord=...)``, once);
(d), (e): the recipe with ``.repeat(E)`` and ``memfit.dataset(files, 256, epochs=E)``: one
    pass of ``--pass-epochs`` E epochs back to back, as ``model.fit`` runs a dataset given
    with ``steps_per_epoch`` (each epoch's read overlaps the last epoch's batches). (a)-(c)
    are one epoch a pass, as ``fit`` runs a finite dataset: a fresh iterator an epoch.

Each round reads one full epoch of each, in rotating order (so no pipeline always runs
first), after one warm-up epoch of each; the page cache holds the files (the files and
the pack are read once before timing). Prints a markdown table: median and min–max of
samples/s, and the ratios to (a) with their min–max over rounds; ``--json FILE`` also writes
them as JSON (every round's value beside the median, min and max).

    python benchmarks/tfrecord_stream.py --size-mb 200 --files 4 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import memfit  # noqa: E402

SHAPE = (64, 64)
BATCH = 256


def write_recipe(directory: Path, samples: int, files: int) -> list[str]:
    """The recipe's files: one Example a sample, ``data`` = serialize_tensor(x) bytes,
    ``label`` a float list, written with tf.io.TFRecordWriter."""
    rng = np.random.default_rng(0)
    paths, per = [], -(-samples // files)
    for f in range(files):
        path = str(directory / f"path{f + 1}.tfrecords")
        with tf.io.TFRecordWriter(path) as w:
            for _ in range(min(per, samples - f * per)):
                x = rng.standard_normal(SHAPE).astype(np.float32)
                example = tf.train.Example(features=tf.train.Features(feature={
                    "data": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[tf.io.serialize_tensor(x).numpy()])),
                    "label": tf.train.Feature(float_list=tf.train.FloatList(
                        value=[float(rng.random())])),
                }))
                w.write(example.SerializeToString())
        paths.append(path)
    return paths


def recipe(paths: list[str]) -> tf.data.Dataset:
    spec = {"data": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([1], tf.float32)}

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        return tf.io.parse_tensor(ex["data"], tf.float32), ex["label"]

    return (tf.data.TFRecordDataset(paths).shuffle(3000).map(parse, 8).batch(BATCH)
            .prefetch(64))


def one_epoch(ds, it_factory) -> float:
    """Samples/s of one full pass."""
    start, n = time.perf_counter(), 0
    for x, _ in it_factory(ds):
        n += int(x.shape[0])
    return n / (time.perf_counter() - start)


def spread(values: list[float]) -> dict:
    """Median, min, max and every round's value, for ``--json``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "per_round": values}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=200)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", default="256MiB")
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary dir)")
    ap.add_argument("--pass-epochs", type=int, default=6,
                    help="epochs in one pass for rows (d) and (e); 0 leaves them out")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    args = ap.parse_args()
    sample = 4 * SHAPE[0] * SHAPE[1]
    samples = int(args.size_mb * 2**20 // sample)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="tfrecord-stream-") as tmp:
        d = Path(tmp)
        t = time.perf_counter()
        paths = write_recipe(d, samples, args.files)
        written = time.perf_counter() - t
        t = time.perf_counter()
        memfit.pack(tfrecord=paths, output=d / "packed")
        packed_s = time.perf_counter() - t
        pipelines = {
            "(a) recipe: parse_single_example + parse_tensor": recipe(paths),
            "(b) memfit.dataset(files): in place": memfit.dataset(
                paths, BATCH, features=("data", "label"), memory_budget=args.budget),
            "(c) memfit.dataset(pack)": memfit.dataset(
                d / "packed", BATCH, features=("data", "label"), memory_budget=args.budget),
        }
        if args.pass_epochs:
            e = args.pass_epochs
            pipelines[f"(d) the recipe, .repeat({e}): {e} epochs a pass"] = \
                recipe(paths).repeat(e)
            pipelines[f"(e) memfit.dataset(files, epochs={e}): {e} epochs a pass"] = \
                memfit.dataset(paths, BATCH, features=("data", "label"),
                               memory_budget=args.budget, epochs=e)
        names = list(pipelines)
        for name in names:                              # warm-up: page cache, tracing
            one_epoch(pipelines[name], iter)
        rates: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                rates[name].append(one_epoch(pipelines[name], iter))
        print(f"{samples:,} samples of {SHAPE[0]}x{SHAPE[1]} float32 + a float label in "
              f"{args.files} files ({sum(os.path.getsize(p) for p in paths) / 2**20:.0f} MiB, "
              f"written in {written:.1f} s; packed in {packed_s:.1f} s); batch {BATCH}, "
              f"memory_budget {args.budget}, {args.rounds} rounds, {os.cpu_count()} cores\n")
        print(f"plan (b): {pipelines[names[1]].memfit_plan}\n")
        print("| pipeline | samples/s, median (min–max) | ÷ recipe, median (min–max) "
              "(d, e: ÷ (d)) |")
        print("| --- | --- | --- |")
        keys = dict(zip(names, ("recipe", "in_place", "packed", "recipe_pass", "in_place_pass"),
                        strict=False))
        figures = {"samples": samples, "files": args.files,
                   "file_bytes": sum(os.path.getsize(p) for p in paths),
                   "write_seconds": written, "pack_seconds": packed_s, "batch": BATCH,
                   "memory_budget": args.budget, "rounds": args.rounds,
                   "pass_epochs": args.pass_epochs,
                   "samples_per_s": {}, "ratio_to_recipe": {}}
        for name in names:
            # (d) and (e) against the recipe's pass of as many epochs, (a)-(c) against (a)
            base = rates[names[3]] if keys[name].endswith("_pass") else rates[names[0]]
            ratios = [a / b for a, b in zip(rates[name], base, strict=True)]
            figures["samples_per_s"][keys[name]] = spread(rates[name])
            figures["ratio_to_recipe"][keys[name]] = spread(ratios)
            print(f"| {name} | {statistics.median(rates[name]):,.0f} "
                  f"({min(rates[name]):,.0f}–{max(rates[name]):,.0f}) | "
                  f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) |")
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
