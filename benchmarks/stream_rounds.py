"""Issue 28's goal, measured as ratios side by side: the block-reader stream against the
in-memory pipeline and against the raw bytes, each pipeline in its own process.

    .venv/bin/python benchmarks/stream_rounds.py                  # 5 rounds, ~2 min
    .venv/bin/python benchmarks/stream_rounds.py --rounds 7 \\
        --before /tmp/before/src                                  # + the code before

Each round starts one child process per pipeline, all alive at once, and they take
turns pass by pass (A, B, C, A, B, C, ...; the others wait on a pipe meanwhile), so a
noisy neighbour on the CPU hits every side of a round alike:
``memfit.dataset(pack, 256, features=("x", "y"))`` under a 256 MiB budget;
``from_tensor_slices((x, y)).shuffle(B).batch(256).prefetch(AUTOTUNE)`` of the same
arrays in RAM, ``B`` = the stream's shuffle window; ``np.fromfile`` of every shard file
(the bytes the stream reads, no checks, no order); and with ``--before SRC`` the stream
again with ``PYTHONPATH=SRC`` (another source tree, with its own built C extension).
Each child makes its pipeline and runs one untimed warm-up pass; a round's figure for
a side is the median of its ``--passes`` timed passes (a new iterator each, as Keras
makes one per epoch). Prints per-round ratios and their median, minimum and maximum
(markdown), and each side's CPU time per sample (all its threads): the work a sample
costs, which a busy neighbour changes much less than the rate.

Uses the 25,000-sample data of ``stream.py`` (``bench-data/``; made if missing), page
cache warm.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stream as bench  # noqa: E402  (the data helpers of the main benchmark)

import memfit  # noqa: E402

CHILD = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
kind, pack, src, window = sys.argv[1:5]
if kind == "raw":
    import memfit
    files = memfit.Manifest.load(pack).files()
    samples = memfit.Manifest.load(pack).split("train").samples

    def one_pass():
        for f in files:
            np.fromfile(f, dtype=np.uint8)
        return samples
else:
    import tensorflow as tf
    if kind == "stream":
        import memfit
        ds = memfit.dataset(pack, 256, features=("x", "y"), memory_budget="256MiB")
    else:
        x, y = np.load(f"{src}/x.npy"), np.load(f"{src}/y.npy")
        ds = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(int(window)).batch(256)
              .prefetch(tf.data.AUTOTUNE))

    def one_pass():
        n = 0
        for xb, yb in ds:
            n += int(xb.shape[0])
        return n
one_pass()                                          # warm-up
print("ready", flush=True)
for line in sys.stdin:                              # one timed pass per "go"
    started, cpu = time.perf_counter(), time.process_time()
    n = one_pass()
    print(json.dumps({"rate": n / (time.perf_counter() - started),
                      "cpu_us": 1e6 * (time.process_time() - cpu) / n}), flush=True)
"""


class Child:
    """One pipeline in its own process, timing one pass each time it is asked."""

    def __init__(self, kind: str, pack: Path, src: Path, window: int,
                 pythonpath: str | None):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, kind, str(pack), str(src), str(window)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        self._expect("ready")

    def _expect(self, prefix: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line
        raise SystemExit(f"the {self.kind} child failed (exit {self.proc.wait()})")

    def one_pass(self) -> tuple[float, float]:
        """samples/s of one pass, and the process's CPU time per sample (µs, all threads)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        out = json.loads(self._expect("{"))
        return float(out["rate"]), float(out["cpu_us"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--passes", type=int, default=9,
                   help="timed passes per child, taking turns with the other children")
    p.add_argument("--before", default=None,
                   help="a source tree (its src/) to stream with as well, for before ÷ after")
    args = p.parse_args(argv)

    data = bench.REPO / "bench-data"
    src = bench.make_source(data, 25000, with_id=False)
    pack = bench.ensure_pack(src, data / "pack-xy-25000").path
    bench.warm(memfit.Manifest.load(pack).files() + list(src.values()))
    window = memfit.dataset(pack, bench.BATCH, features=("x", "y"),
                            memory_budget="256MiB").memfit_plan.window_samples
    sides = {"stream": None, "in-memory": None, "raw": None}
    if args.before:
        sides["before"] = args.before
    rounds: dict[str, list[float]] = {k: [] for k in sides}
    cpu: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(args.rounds):
        children = {side: Child("stream" if side == "before" else side, pack,
                                src["x"].parent, window, path)
                    for side, path in sides.items()}
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
        for _ in range(args.passes):                # passes taking turns, A B C A B C ...
            for side, c in children.items():
                got[side].append(c.one_pass())
        for side, c in children.items():
            c.close()
            rounds[side].append(statistics.median(g[0] for g in got[side]))
            cpu[side].append(statistics.median(g[1] for g in got[side]))
        bench.log(f"round {r + 1}/{args.rounds}: "
                  + ", ".join(f"{k} {bench.rate(v[-1])}" for k, v in rounds.items()))

    def row(what: str, ours: str, theirs: str) -> str:
        ratios = [a / b for a, b in zip(rounds[ours], rounds[theirs], strict=True)]
        return (f"| {what} | {statistics.median(rounds[ours]):,.0f} | "
                f"{statistics.median(rounds[theirs]):,.0f} | {statistics.median(ratios):.2f}× | "
                f"{min(ratios):.2f}–{max(ratios):.2f}× | "
                f"{', '.join(f'{x:.2f}' for x in ratios)} |")

    print("| ratio, each side in its own process | samples/s | baseline samples/s | median "
          "| min–max | rounds |")
    print("|---|---|---|---|---|---|")
    print(row("stream ÷ in-memory (`from_tensor_slices.shuffle.batch.prefetch`)",
              "stream", "in-memory"))
    print(row("stream ÷ raw `np.fromfile` of the shards", "stream", "raw"))
    if args.before:
        print(row(f"stream of `{args.before}` ÷ in-memory", "before", "in-memory"))
        print(row(f"stream ÷ stream of `{args.before}`", "stream", "before"))
    print("\nCPU time per sample (µs, the child's process time over a pass, all its "
          "threads; median of rounds, min–max): "
          + "; ".join(f"{k} {statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})"
                      for k, v in cpu.items()) + ".")
    print(f"\nCommand: `benchmarks/stream_rounds.py --rounds {args.rounds} --passes "
          f"{args.passes}{' --before ' + args.before if args.before else ''}`; a round's "
          f"figure is the median of a child's {args.passes} timed passes (after a "
          f"warm-up pass), the children of a round taking turns pass by pass; "
          f"load average at the end {os.getloadavg()[0]:.2f}.")


if __name__ == "__main__":
    main()
