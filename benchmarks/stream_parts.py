"""Where the block reader's time goes: the parts behind the read rows of ``stream.py``.

    .venv/bin/python benchmarks/stream_parts.py            # ~3 min on the 2-core machine

Prints a markdown table (progress on stderr), each row measured side by side in this run:

1. window builders alone (``BlockReader.window`` called from 1 and 2 Python threads, no
   tf.data): samples/s and milliseconds per window, wall and CPU; one builder with
   memfit's C loop (``memfit.data.format.cwindow``) and without it, taking turns;
2. a new iterator and its first batch, stream vs the in-memory pipeline (medians of 10
   full passes: the first window of each pass was built ahead at the end of the last);
3. the stream and the in-memory pipeline alone in one process, passes interleaved;
4. the same with one-batch windows (a small ``memory_budget``), against default windows.

Uses the 25,000-sample data of ``stream.py`` (``bench-data/``; made if missing).
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stream as bench  # noqa: E402  (the data helpers of the main benchmark)

import memfit  # noqa: E402
from memfit.data.format import records  # noqa: E402
from memfit.data.read.blocks import block_reader as blocks  # noqa: E402

PASSES = 8


def one_pass(ds: Any) -> tuple[float, float, float]:
    """samples/s of a pass, ms to create its iterator, ms to its first batch."""
    t0 = time.perf_counter()
    it = iter(ds)
    t1 = time.perf_counter()
    x, _ = next(it)
    t2 = time.perf_counter()
    n = int(x.shape[0])
    for x, _ in it:
        n += int(x.shape[0])
    return n / (time.perf_counter() - t0), 1000 * (t1 - t0), 1000 * (t2 - t1)


def builders(reader: blocks.BlockReader, threads: int) -> tuple[float, float, float]:
    """samples/s of ``threads`` threads building 4 epochs of windows; ms/window wall, CPU."""
    per: list[tuple[float, float]] = []
    jobs = list(range(reader.windows)) * 4

    def work(ws: list[int]) -> None:
        for w in ws:
            t, c = time.perf_counter(), time.thread_time()
            reader.window(1, w)
            per.append((time.perf_counter() - t, time.thread_time() - c))

    started = time.perf_counter()
    pool = [threading.Thread(target=work, args=(jobs[i::threads],)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    seconds = time.perf_counter() - started
    return (len(jobs) * reader.window_samples / seconds,
            1000 * statistics.mean(p[0] for p in per), 1000 * statistics.mean(p[1] for p in per))


def interleaved(sides: dict[str, Any]) -> dict[str, list[tuple[float, float, float]]]:
    for ds in sides.values():
        one_pass(ds)                                    # warm-up
    out: dict[str, list[tuple[float, float, float]]] = {k: [] for k in sides}
    for p in range(PASSES):
        for name, ds in sides.items():
            out[name].append(one_pass(ds))
            bench.log(f"pass {p + 1}/{PASSES} {name}: {bench.rate(out[name][-1][0])}")
    return out


def main() -> None:
    import tensorflow as tf

    data = bench.REPO / "bench-data"
    src = bench.make_source(data, 25000, with_id=False)
    pack = bench.ensure_pack(src, data / "pack-xy-25000").path
    bench.warm(memfit.Manifest.load(pack).files() + list(src.values()))

    stream = memfit.dataset(pack, bench.BATCH, features=("x", "y"), memory_budget="256MiB")
    window = stream.memfit_plan.window_samples
    x, y = np.load(src["x"]), np.load(src["y"])
    memory = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(window).batch(bench.BATCH)
              .prefetch(tf.data.AUTOTUNE))
    small = memfit.dataset(pack, bench.BATCH, features=("x", "y"), memory_budget="40MiB")

    reader = next(o for o in gc.get_objects() if isinstance(o, blocks.BlockReader)
                  and o.window_samples == window)
    reader.window(1, 0)
    alone = {t: builders(reader, t) for t in (1, 2, 1, 2)}   # the second of each counts
    bench.log(f"builders alone: {alone}")
    # One builder with memfit's C loop and without it (the NumPy gather), taking turns.
    ways: dict[str, list[tuple[float, float, float]]] = {"C loop": [], "gather": []}
    native = records.NATIVE
    manifest = memfit.Manifest.load(pack)
    try:
        records.NATIVE = None                           # decided when a reader is made
        gathering = blocks.BlockReader(
            manifest, manifest.split("train").shards,
            dataclasses.replace(reader.plan, window=window, batch_size=bench.BATCH,
                                builders=1, outputs_alive=4),
            on_corrupt="raise")
        gathering.window(1, 0)
    finally:
        records.NATIVE = native
    if native is not None:
        for _ in range(3):
            ways["C loop"].append(builders(reader, 1))
            records.NATIVE = None
            try:
                ways["gather"].append(builders(gathering, 1))
            finally:
                records.NATIVE = native
        bench.log(f"one builder, C loop vs gather: {ways}")
    two = interleaved({"stream": stream, "in-memory": memory})
    windows = interleaved({"default windows": stream, "one-batch windows": small})

    def med(runs: list[tuple[float, float, float]], i: int) -> float:
        return statistics.median(r[i] for r in runs)

    rows = ["| measure | memfit | baseline | ratio |", "|---|---|---|---|"]
    b1, b2 = alone[1], alone[2]
    rows.append(f"| window builders alone, 2 threads ÷ 1 (ms/window wall / CPU: "
                f"{b2[1]:.1f} / {b2[2]:.1f} vs {b1[1]:.1f} / {b1[2]:.1f}) | "
                f"{bench.rate(b2[0])} | {bench.rate(b1[0])} | {b2[0] / b1[0]:.2f}× |")
    if ways["C loop"]:
        c, g = (statistics.median(r[0] for r in ways[k]) for k in ("C loop", "gather"))
        cm, gm = (statistics.median(r[2] for r in ways[k]) for k in ("C loop", "gather"))
        rows.append(f"| one window builder: memfit's C loop ÷ without it (NumPy gather; "
                    f"ms/window CPU {cm:.1f} vs {gm:.1f}) | {bench.rate(c)} | "
                    f"{bench.rate(g)} | {c / g:.2f}× |")
    else:
        rows.append("| one window builder: memfit's C loop ÷ without it | not built | | |")
    for i, what in ((1, "new iterator, ms"), (2, "first batch, ms")):
        rows.append(f"| {what}: stream ÷ in-memory | {med(two['stream'], i):.1f} | "
                    f"{med(two['in-memory'], i):.1f} | "
                    f"{med(two['stream'], i) / med(two['in-memory'], i):.2f}× |")
    s, m = med(two["stream"], 0), med(two["in-memory"], 0)
    rows.append(f"| read, the two pipelines alone in one process: stream ÷ in-memory | "
                f"{bench.rate(s)} | {bench.rate(m)} | {s / m:.2f}× |")
    d, o = med(windows["default windows"], 0), med(windows["one-batch windows"], 0)
    rows.append(f"| read: one-batch windows (`memory_budget=\"40MiB\"`) ÷ windows of "
                f"{window:,} | {bench.rate(o)} | {bench.rate(d)} | {o / d:.2f}× |")
    spread = "; ".join(f"{k} {min(r[0] for r in v):,.0f}–{max(r[0] for r in v):,.0f}"
                       for part in (two, windows) for k, v in part.items())
    print("\n".join(rows))
    print(f"\nCommand: `.venv/bin/python benchmarks/stream_parts.py`; medians of {PASSES} "
          f"interleaved passes after a warm-up pass; spread (samples/s): {spread}.")


if __name__ == "__main__":
    main()
