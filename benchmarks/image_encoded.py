"""Images packed decoded against kept encoded (``--keep-encoded``): shard bytes, pack
time, and stream throughput (samples/s) of one full epoch, rounds interleaved.

The folder: ``--count`` JPEGs of 256×256 (smooth random colour fields with a little
noise, quality 90) in 4 class folders, packed at 128×128. Each round streams one epoch of
each pack (``memfit.dataset(..., batch 64, memory_budget)``, after a warm-up epoch),
alternating which goes first. Prints a markdown table: median (min–max).

    python benchmarks/image_encoded.py --count 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402


def make_folder(root: Path, count: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for i in range(count):
        cls = root / f"class{i % 4}"
        cls.mkdir(parents=True, exist_ok=True)
        coarse = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
        smooth = np.asarray(coarse.resize((256, 256), Image.BILINEAR), np.int16)
        noisy = np.clip(smooth + rng.integers(-8, 9, smooth.shape), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).save(cls / f"img{i:05d}.jpg", quality=90)
    return root


def epoch(path: Path, budget: str) -> tuple[float, int]:
    import memfit

    ds = memfit.dataset(path, 64, features=("image", "label"), memory_budget=budget,
                        epochs=1)
    start, n = time.perf_counter(), 0
    for x, _ in ds:
        n += int(x.shape[0])
    return n / (time.perf_counter() - start), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", default="256MiB")
    ap.add_argument("--dir", default="/tmp/memfit-image-encoded")
    args = ap.parse_args()

    import memfit

    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    photos = make_folder(work / "photos", args.count)
    files = sum(p.stat().st_size for p in photos.rglob("*.jpg"))
    packs, pack_s = {}, {}
    for keep in (False, True):
        out = work / ("encoded" if keep else "decoded")
        t = time.perf_counter()
        r = memfit.pack(images=photos, image_size=(128, 128), output=out, progress=False,
                        keep_encoded=keep)
        pack_s[keep] = time.perf_counter() - t
        packs[keep] = (out, r.manifest.bytes)
    rates: dict[bool, list[float]] = {False: [], True: []}
    for keep in (False, True):
        epoch(packs[keep][0], args.budget)                      # warm-up, page cache
    for r in range(args.rounds):
        for keep in ((False, True) if r % 2 == 0 else (True, False)):
            rate, n = epoch(packs[keep][0], args.budget)
            assert n == args.count, n
            rates[keep].append(rate)
    plan = memfit.dataset(packs[True][0], 64, memory_budget=args.budget).memfit_plan
    print(f"{args.count} JPEGs of 256x256 ({files / 2**20:.1f} MiB on disk) packed at "
          f"128x128; batch 64, memory_budget {args.budget}, {args.rounds} rounds; "
          f"{os.cpu_count()} cores\n")
    print("| pack | shard bytes | pack time | stream samples/s, median (min–max) |")
    print("| --- | --- | --- | --- |")
    for keep in (False, True):
        v = rates[keep]
        print(f"| {'--keep-encoded' if keep else 'decoded (default)'} | "
              f"{packs[keep][1] / 2**20:.1f} MiB | {pack_s[keep]:.1f} s | "
              f"{statistics.median(v):,.0f} ({min(v):,.0f}–{max(v):,.0f}) |")
    ratio = [e / d for e, d in zip(rates[True], rates[False], strict=True)]
    print(f"\nencoded ÷ decoded throughput per round: median {statistics.median(ratio):.2f} "
          f"({min(ratio):.2f}–{max(ratio):.2f}); shards {packs[False][1] / packs[True][1]:.1f}× "
          f"smaller\n\nplan: {plan}")


if __name__ == "__main__":
    main()
