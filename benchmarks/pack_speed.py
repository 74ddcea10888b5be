"""How close ``memfit pack`` comes to the disk (issue 28): pack ÷ a plain write + fsync of as
many incompressible bytes, and pack ÷ the seed's per-sample ``TFRecordWriter`` loop, their
rounds interleaved in one run.

    .venv/bin/python benchmarks/pack_speed.py                          # 2 GiB, 5 rounds
    .venv/bin/python benchmarks/pack_speed.py --tree before=/tmp/before/src --tree src
    .venv/bin/python benchmarks/pack_speed.py --workers 1,2 --no-recipe

The source is ``benchmarks/stream.py``'s (32x32x3 float32 images and int64 labels, random,
as ``.npy`` files under ``--data-dir``, reused), its pages warm. One round times, one after
the other:

- each pack: ``memfit.pack({"x": x.npy, "y": y.npy}, out, progress=False)`` with the
  default options (or each ``--workers`` count), in a child process that imports memfit
  from a ``--tree`` (the import is not timed; the previous output is deleted untimed);
- ``plain``: a write of as many random bytes as the pack's shards hold, in 8 MiB pieces,
  one file, and its ``fsync`` (``benchmarks/pack_sources.py``'s ``write_fsync``);
- ``recipe``: ``benchmarks/stream.py``'s ``recipe_write`` (one ``tf.train.Example`` a
  sample, ``serialize_tensor``, ``tf.io.TFRecordWriter``) over the same source, in a child
  (the TensorFlow import is not timed).

A warm-up round comes first, untimed. Each ratio is taken within a round (the sides of a
round meet the same neighbours); the table gives the median over the rounds and their
spread. Prints a markdown table on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import pack_sources  # noqa: E402  (write_fsync)
import stream as bench  # noqa: E402  (the source and the recipe's writer)

from memfit.sizes import format_size, parse_size  # noqa: E402

PACK = r"""
import json, sys, time
from pathlib import Path
import memfit
src, out, workers = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
extra = {"workers": workers} if workers else {}
started = time.perf_counter()
res = memfit.pack(src, out, progress=False, **extra)
seconds = time.perf_counter() - started
shards = sum(p.stat().st_size for p in Path(out).iterdir() if p.suffix == ".tfrecord")
print(json.dumps({"seconds": seconds, "samples": res.samples, "bytes": shards,
                  "memfit": memfit.__file__}))
"""

RECIPE = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, sys.argv[1])
import tensorflow as tf
import stream
from pathlib import Path
started = time.perf_counter()
n = stream.recipe_write(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
print(json.dumps({"seconds": time.perf_counter() - started, "samples": n}))
"""


def child(code: str, *args: str, pythonpath: str | None = None) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(f"child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="2GiB", help="source size (2GiB)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (5)")
    p.add_argument("--tree", action="append", default=[],
                   help="NAME=SRC or SRC: a memfit source tree to pack with (repeatable; "
                        "default: this checkout's src)")
    p.add_argument("--workers", default="",
                   help="comma-separated worker counts to pack with (default: the default)")
    p.add_argument("--no-recipe", action="store_true", help="leave out the recipe's writer")
    p.add_argument("--data-dir", default=str(bench.REPO / "bench-data"),
                   help="where the source and outputs live (bench-data/)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1. Received: {args.rounds}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    n = parse_size(args.size) // bench.SAMPLE_BYTES
    src = bench.make_source(data_dir, n, with_id=False)
    trees = []
    for t in args.tree or [str(bench.REPO / "src")]:
        name, sep, path = t.partition("=")
        trees.append((name if sep else "pack", str(Path(path if sep else t).resolve())))
    counts = [int(w) for w in args.workers.split(",")] if args.workers else [0]
    packs = [(f"{name}" + (f" workers={w}" if w else ""), tree, w)
             for name, tree in trees for w in counts]
    sources = json.dumps({k: str(v) for k, v in src.items()})
    out = data_dir / "pack-speed-out"
    plain_file = data_dir / "pack-speed-plain.bin"
    recipe_dir = data_dir / "pack-speed-recipe"
    shard_bytes = 0
    seconds: dict[str, list[float]] = {side: [] for side, _, _ in packs}
    seconds["plain"] = []
    if not args.no_recipe:
        seconds["recipe"] = []
    samples = {}
    load = os.getloadavg()[0]
    bench.log(f"{n:,} samples ({format_size(n * bench.SAMPLE_BYTES)}), {os.cpu_count()} "
              f"cores, load {load:.2f}; sides: {', '.join(seconds)}")
    for r in range(args.rounds + 1):
        label = "warm-up" if r == 0 else f"round {r}/{args.rounds}"
        bench.warm(list(src.values()))
        for side, tree, w in packs:
            shutil.rmtree(out, ignore_errors=True)
            res = child(PACK, sources, str(out), str(w), pythonpath=tree)
            shard_bytes, samples[side] = res["bytes"], res["samples"]
            bench.log(f"{label} {side}: {res['seconds']:.2f} s "
                      f"({format_size(res['bytes'] / res['seconds'])}/s; {res['memfit']})")
            if r:
                seconds[side].append(res["seconds"])
        shutil.rmtree(out, ignore_errors=True)
        plain = pack_sources.write_fsync(plain_file, shard_bytes)
        bench.log(f"{label} plain: {plain:.2f} s ({format_size(shard_bytes / plain)}/s)")
        if r:
            seconds["plain"].append(plain)
        if not args.no_recipe:
            shutil.rmtree(recipe_dir, ignore_errors=True)
            recipe_dir.mkdir(parents=True)
            res = child(RECIPE, str(HERE), str(src["x"]), str(src["y"]),
                        str(recipe_dir / "train.tfrecord"))
            shutil.rmtree(recipe_dir)
            samples["recipe"] = res["samples"]
            bench.log(f"{label} recipe: {res['seconds']:.2f} s "
                      f"({bench.rate(res['samples'] / res['seconds'])})")
            if r:
                seconds["recipe"].append(res["seconds"])
    print(render(args, packs, seconds, samples, shard_bytes, load))


def _spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–" \
           f"{fmt.format(max(values))})"


def render(args: argparse.Namespace, packs: list[tuple[str, str, int]],
           seconds: dict[str, list[float]], samples: dict[str, int], shard_bytes: int,
           load: float) -> str:
    rows = ["| pack | seconds | pack ÷ plain write+fsync (goal ≥ 0.8) | "
            "pack ÷ recipe writer (goal ≥ 5) |", "|---|---|---|---|"]
    for side, _, _ in packs:
        vs_plain = [p / s for s, p in zip(seconds[side], seconds["plain"], strict=True)]
        vs_recipe = "—"
        if "recipe" in seconds:
            per = [(samples[side] / s) / (samples["recipe"] / q)
                   for s, q in zip(seconds[side], seconds["recipe"], strict=True)]
            vs_recipe = _spread(per) + "×"
        rows.append(f"| {side} | {_spread(seconds[side])} | {_spread(vs_plain)} | "
                    f"{vs_recipe} |")
    rows.append(f"| plain write+fsync | {_spread(seconds['plain'])} | — | — |")
    if "recipe" in seconds:
        rows.append(f"| recipe writer | {_spread(seconds['recipe'])} | — | — |")
    return "\n".join([
        *rows, "",
        f"{format_size(shard_bytes)} of shards, {samples[packs[0][0]]:,} samples; median "
        f"(min–max) of {args.rounds} interleaved rounds after a warm-up; load at the start "
        f"{load:.2f}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M')}. Command: "
        f"`.venv/bin/python benchmarks/pack_speed.py {' '.join(sys.argv[1:])}`"])


if __name__ == "__main__":
    main()
