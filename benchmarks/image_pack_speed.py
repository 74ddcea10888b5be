"""``memfit pack --images`` against the decode limit (issue 30: goal ≥ 0.8).

The folder: ``--count`` photo-like images in 4 class folders, made here (never
downloaded): mixed sizes (each side 300–640 px), smooth random colour fields plus a
gradient plus a little noise, so that JPEG sizes are realistic (about 20–60 KiB); every
``--png-every``-th one a PNG, the rest JPEG at quality 85–92. It is kept in ``--dir`` and
reused by later runs with the same options.

Each round times, each in a child process, from the parent (interpreter start included):

- **pack**: ``python -m memfit pack --images FOLDER --image-size 128,128 -o OUT --quiet``
  (OUT removed before the round, outside the timing);
- **decode limit**: a ``multiprocessing`` pool of ``os.cpu_count()`` processes that opens
  every file with Pillow, converts it to RGB and resizes it to 128×128 (Pillow's
  ``BILINEAR``), discarding the result: what decoding and resizing the same files costs
  on all cores, with nothing written. Pillow's ``BILINEAR`` antialiases when it shrinks
  (every source pixel is read); Keras's resize, which memfit reproduces, reads four
  pixels for each output pixel;
- **decode alone**: the same pool without the resize: the most either could reach.

The three alternate (A, B, C, C, B, A, ...) for ``--rounds`` rounds after one untimed
warm-up of each (page cache warm). Prints a markdown table: samples/s of each, median (min–max), and
the per-round ratios pack ÷ decode limit and pack ÷ decode alone; ``--json FILE`` also
writes them as JSON (every round's value beside the median, min and max).

    PYTHONPATH=src .venv/bin/python benchmarks/image_pack_speed.py --count 3000 --rounds 5

``--profile`` instead packs once in this process under cProfile and prints where the
time goes (the calling thread's; the decode threads' work shows up as waits).
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

import numpy as np

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
SIZE = (128, 128)

# The decode limit, in a child: argv = a JSON list of files, height, width.
LIMIT = r"""
import json, multiprocessing, os, sys
from PIL import Image

def one(path):
    with Image.open(path) as im:
        im.seek(0)
        rgb = im.convert("RGB")
        if H:
            rgb.resize((W, H), Image.BILINEAR)
    return 1

files = json.load(open(sys.argv[1]))
H, W = int(sys.argv[2]), int(sys.argv[3])     # 0, 0: decode only
with multiprocessing.get_context("fork").Pool(os.cpu_count()) as pool:
    n = sum(pool.imap_unordered(one, files, chunksize=16))
assert n == len(files), n
"""


def photo(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A photo-like uint8 image: a smooth random colour field, a gradient, some noise."""
    from PIL import Image

    coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize((width, height), Image.BICUBIC), np.float32)
    ramp = np.linspace(-40, 40, width, dtype=np.float32)[None, :, None] \
        * rng.uniform(-1, 1, 3).astype(np.float32)
    noise = rng.normal(0, 6, (height, width, 3)).astype(np.float32)
    return np.clip(smooth + ramp + noise, 0, 255).astype(np.uint8)


def make_folder(root: Path, count: int, png_every: int, seed: int = 0) -> Path:
    """The folder of images (reused when a previous run made the same one)."""
    from PIL import Image

    stamp = root / ".made"
    key = json.dumps({"count": count, "png_every": png_every, "seed": seed, "v": 1})
    if stamp.exists() and stamp.read_text() == key:
        return root
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        cls = root / f"class{i % 4}"
        cls.mkdir(parents=True, exist_ok=True)
        h, w = (int(v) for v in rng.integers(300, 641, 2))
        img = Image.fromarray(photo(rng, h, w))
        if png_every and i % png_every == png_every - 1:
            img.save(cls / f"img{i:05d}.png", optimize=False)
        else:
            img.save(cls / f"img{i:05d}.jpg", quality=int(rng.integers(85, 93)))
    stamp.write_text(key)
    return root


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{cmd[:4]} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return took


def profile(folder: Path, out: Path) -> None:
    import cProfile
    import pstats

    import memfit

    shutil.rmtree(out, ignore_errors=True)
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    memfit.pack(images=folder, image_size=SIZE, output=out, progress=False)
    prof.disable()
    print(f"pack: {time.perf_counter() - start:.2f} s (under cProfile)")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


def spread(values: list[float]) -> dict:
    """Median, min, max and every round's value, for ``--json``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "per_round": values}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--png-every", type=int, default=10, help="every Nth image a PNG")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/tmp/memfit-image-pack")
    ap.add_argument("--profile", action="store_true", help="profile one pack instead")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    args = ap.parse_args()

    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    folder = make_folder(work / "photos", args.count, args.png_every)
    print(f"folder ready in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    out = work / "packed"
    if args.profile:
        profile(folder, out)
        return

    from memfit.data.sources.image_source import list_images

    _, files = list_images(folder)
    listing = work / "files.json"
    listing.write_text(json.dumps([p for p, _ in files]))
    disk = sum(os.path.getsize(p) for p, _ in files)
    pngs = sum(p.endswith(".png") for p, _ in files)

    def pack() -> float:
        shutil.rmtree(out, ignore_errors=True)
        return timed([sys.executable, "-m", "memfit", "pack", "--images", str(folder),
                      "--image-size", f"{SIZE[0]},{SIZE[1]}", "-o", str(out), "--quiet"])

    def limit() -> float:
        return timed([sys.executable, "-c", LIMIT, str(listing), str(SIZE[0]), str(SIZE[1])])

    def decode() -> float:
        return timed([sys.executable, "-c", LIMIT, str(listing), "0", "0"])

    sides = {"pack": pack, "limit": limit, "decode": decode}
    for name, run in sides.items():                              # warm-up: page cache
        print(f"warm-up {name}: {run():.2f} s", file=sys.stderr)
    secs: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]     # A B C, C B A, ...
        for name in order:
            secs[name].append(sides[name]())
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in secs.items()),
              file=sys.stderr)

    n = len(files)
    rate = {name: [n / s for s in v] for name, v in secs.items()}
    ratio = [p / q for p, q in zip(rate["pack"], rate["limit"], strict=True)]
    bare = [p / q for p, q in zip(rate["pack"], rate["decode"], strict=True)]
    load = os.getloadavg()[0]
    print(f"{n:,} images ({n - pngs:,} JPEG, {pngs:,} PNG; 300–640 px a side; "
          f"{disk / 2**20:.1f} MiB on disk) in 4 classes, to 128x128; {args.rounds} rounds "
          f"interleaved, each side a child timed from the parent; {os.cpu_count()} cores, "
          f"load {load:.1f} at the end\n")
    print("| side | samples/s, median (min–max) | seconds, median |")
    print("| --- | --- | --- |")
    names = {"pack": "`memfit pack --images … --image-size 128,128`",
             "limit": "decode limit: Pillow open + RGB + resize 128×128, a pool on all cores",
             "decode": "decode alone: Pillow open + RGB, the same pool, no resize"}
    for name in sides:
        v = rate[name]
        print(f"| {names[name]} | {statistics.median(v):,.0f} ({min(v):,.0f}–{max(v):,.0f}) "
              f"| {statistics.median(secs[name]):.2f} |")
    print(f"\npack ÷ decode limit, per round: median {statistics.median(ratio):.2f} "
          f"({min(ratio):.2f}–{max(ratio):.2f}); goal ≥ 0.8\n"
          f"pack ÷ decode alone, per round: median {statistics.median(bare):.2f} "
          f"({min(bare):.2f}–{max(bare):.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "images": n, "png": pngs, "disk_bytes": disk, "size": SIZE, "rounds": args.rounds,
            "samples_per_s": {name: spread(v) for name, v in rate.items()},
            "pack_to_limit": spread(ratio), "pack_to_decode": spread(bare)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
