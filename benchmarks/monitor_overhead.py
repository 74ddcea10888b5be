"""Overhead of ``memfit.MemoryMonitor`` on the step time of ``model.fit``, in one run.

Run from the repository root::

    .venv/bin/python benchmarks/monitor_overhead.py            # full run (~3 min on 2 cores)
    .venv/bin/python benchmarks/monitor_overhead.py --quick    # smoke run (~1 min)

One small CNN (two 3x3 convolutions on 32x32x3 float32 inputs, 15-50 ms a step at batch 64
on 2 CPU cores) is trained with ``model.fit`` on random in-memory data, with four
callback lists:

- ``none``: no callback;
- ``default``: ``memfit.MemoryMonitor(workdir=tmp, verbose=0)`` (``every_n_batches=100``);
- ``every 1``: the same with ``every_n_batches=1`` (a sample after every batch: the worst
  case);
- ``no-op``: a reference, not memfit: a callback whose ``on_train_batch_end`` does nothing.
  Any callback that overrides it makes Keras call it synchronously after every step
  (instead of on its background thread), so this row separates that cost from the
  monitor's own work.

Each pass is a fresh ``model.fit`` of ``--epochs`` epochs of ``--steps`` steps on the same
model object (a fresh monitor and workdir each time, so its per-fit costs are counted).
After one untimed warm-up pass of each, the passes run in rounds of one pass of each
side, the order rotated by one from round to round (none, default, every 1, no-op;
default, every 1, no-op, none; ...), so that neither a noisy neighbour on the CPU nor the
position in a round favours a side. Passes are short (a few seconds) and many: on a
shared 2-core machine the speed changes from one few-second stretch to the next.

Time per step = the wall time from the first callback's ``on_train_begin`` to the last
one's ``on_train_end`` / steps: the monitor's own begin/end work is inside; Keras's setup
and teardown of ``fit`` around it (building the input iterator, 0.1-0.3 s; tearing it
down, 0.01 s or 0.6-0.9 s at random here, with or without callbacks) are not. That
teardown also happens between epochs, hence one epoch per ``fit`` by default. Two ratios
are given: of the medians over the passes, and the median of the per-round ratios (each
pass ÷ the ``none`` pass of its round), which cancels slow drifts. Then the cost of one
sample (``memfit.memory.probe.extended_record()``, and that plus writing its log line) is
timed in a loop.

The markdown table goes to stdout, progress lines to stderr.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import memfit

IMAGE = (32, 32, 3)
GOAL = 1.02
_STARTED = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - _STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64, help="batch size (64)")
    p.add_argument("--steps", type=int, help="steps per epoch (default 100)")
    p.add_argument("--epochs", type=int, help="epochs per pass (default 1)")
    p.add_argument("--passes", type=int, help="timed passes per side (default 16; 4 with --quick)")
    p.add_argument("--calls", type=int, default=2000,
                   help="calls per timing of one sample (2000; the median of 5 timings)")
    p.add_argument("--quick", action="store_true", help="4 passes instead of 16, for a smoke test")
    args = p.parse_args(argv)
    args.steps = args.steps or 100
    args.epochs = args.epochs or 1
    args.passes = args.passes or (4 if args.quick else 16)
    if min(args.batch, args.steps, args.epochs, args.passes, args.calls) < 1:
        p.error(f"every number must be >= 1. Received: batch={args.batch}, steps={args.steps}, "
                f"epochs={args.epochs}, passes={args.passes}, calls={args.calls}")
    return args


def build_model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input(IMAGE),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def measure_steps(args: argparse.Namespace, tmp: Path) -> dict[str, list[float]]:
    """Seconds per step of each side, one entry per timed pass."""
    import keras

    rng = np.random.default_rng(0)
    n = args.batch * args.steps
    x = rng.normal(size=(n, *IMAGE)).astype(np.float32)
    y = rng.integers(0, 10, n)
    model = build_model()
    runs = itertools.count()

    class NoOp(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    class Clock(keras.callbacks.Callback):
        """Reads the clocks in ``on_train_begin`` (put it first in the list) or in
        ``on_train_end`` (put it last), so the monitor's own begin/end work is inside the
        interval. It defines no batch hook, so Keras's async batch dispatch is unchanged."""

        times: dict[str, tuple[float, float]] = {}          # hook -> (wall, CPU)

        def __init__(self, hook: str):
            super().__init__()
            self.hook = hook

        def _read(self, hook: str) -> None:
            if hook == self.hook:
                self.times[hook] = (time.perf_counter(), time.process_time())

        def on_train_begin(self, logs=None):
            self._read("on_train_begin")

        def on_train_end(self, logs=None):
            self._read("on_train_end")

    def monitor(every: int) -> list:
        workdir = tmp / f"run-{next(runs)}"
        return [memfit.MemoryMonitor(workdir=workdir, every_n_batches=every, verbose=0)]

    sides: dict[str, Callable[[], list]] = {
        "none": list,
        "default": lambda: monitor(100),
        "every 1": lambda: monitor(1),
        "no-op": lambda: [NoOp()],
    }
    total = args.epochs * args.steps
    per_step: dict[str, list[float]] = {side: [] for side in sides}
    names = list(sides)
    for p in range(args.passes + 1):
        for side in names[p % len(names):] + names[:p % len(names)]:   # rotated each round
            callbacks = sides[side]
            cbs = [Clock("on_train_begin"), *callbacks(), Clock("on_train_end")]
            started = time.perf_counter()
            model.fit(x, y, batch_size=args.batch, epochs=args.epochs, shuffle=True,
                      callbacks=cbs, verbose=0)
            whole = time.perf_counter() - started
            (t0, c0), (t1, c1) = Clock.times["on_train_begin"], Clock.times["on_train_end"]
            seconds = t1 - t0
            label = "warm-up" if p == 0 else f"pass {p}/{args.passes}"
            log(f"fit: {label} {side}: {total} steps in {seconds:.2f} s = "
                f"{seconds / total * 1e3:.2f} ms/step (CPU {(c1 - c0) / total * 1e3:.2f} "
                f"ms/step; whole fit call {whole:.2f} s)")
            if p:
                per_step[side].append(seconds / total)
    return per_step


def time_calls(fn: Callable[[], object], calls: int) -> list[float]:
    """Microseconds per call of ``fn``: 5 timings of ``calls`` calls after a warm-up."""
    for _ in range(min(calls, 200)):
        fn()
    out = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - started) / calls * 1e6)
    return out


def measure_sample(args: argparse.Namespace, tmp: Path) -> dict[str, list[float]]:
    from memfit.memory.log import MemoryLog
    from memfit.memory.probe import extended_record

    probe = time_calls(extended_record, args.calls)
    log(f"sample: extended_record(): {statistics.median(probe):.1f} µs/call")
    with MemoryLog(tmp / "sample.jsonl", source="benchmark") as memory_log:
        logged = time_calls(lambda: memory_log.write("batch", **extended_record()), args.calls)
    log(f"sample: extended_record() + log line: {statistics.median(logged):.1f} µs/call")
    return {"probe": probe, "logged": logged}


def render(args: argparse.Namespace, versions: str, load: float, per_step: dict[str, list[float]],
           sample: dict[str, list[float]], elapsed: float) -> str:
    med = {side: statistics.median(v) for side, v in per_step.items()}
    probe, logged = (statistics.median(sample[k]) for k in ("probe", "logged"))
    base = med["none"]
    total = args.epochs * args.steps

    def samples_per_fit(every: int) -> int:
        return 2 + args.epochs * (1 + args.steps // every)      # begin/end + epochs + batches

    def row(side: str, label: str, goal: str, every: int | None) -> str:
        ratio = med[side] / base
        paired = statistics.median(a / b for a, b in zip(per_step[side], per_step["none"],
                                                          strict=True))
        v = per_step[side]
        spread = f"{min(v) * 1e3:.2f}–{max(v) * 1e3:.2f}"
        if every is None:
            predicted = "—"
        else:
            predicted = f"{1 + samples_per_fit(every) * logged * 1e-6 / (total * base):.3f}×"
        met = "—" if goal == "—" else ("yes" if paired <= GOAL else "**no**")
        ratios = "— | —" if side == "none" else f"{paired:.3f}× | {ratio:.3f}×"
        return (f"| {label} | {med[side] * 1e3:.2f} ms | {spread} | {ratios} | {predicted} "
                f"| {goal} | {met} |")

    rows = [
        "| `model.fit` callbacks | time per step (median) | spread of the passes (ms) "
        "| ÷ none (median of per-round ratios) | ÷ none (ratio of medians) "
        "| predicted from the sample cost | goal | met? |",
        "|---|---|---|---|---|---|---|---|",
        row("none", "none", "—", None),
        row("default", "`MemoryMonitor(workdir, verbose=0)` (every_n_batches=100)",
            f"≤ {GOAL}", 100),
        row("every 1", "`MemoryMonitor(workdir, every_n_batches=1, verbose=0)` (worst case)",
            "—", 1),
        row("no-op", "reference: a callback whose `on_train_batch_end` does nothing", "—", None),
        "",
        f"| one sample | µs per call (median of 5 × {args.calls:,}) | spread |",
        "|---|---|---|",
        f"| `memfit.memory.probe.extended_record()` | {probe:.1f} µs | "
        f"{min(sample['probe']):.1f}–{max(sample['probe']):.1f} |",
        f"| `extended_record()` + writing its log line (what the monitor does per sample) | "
        f"{logged:.1f} µs | {min(sample['logged']):.1f}–{max(sample['logged']):.1f} |",
    ]
    python = os.path.relpath(sys.executable) \
        if Path(sys.executable).is_relative_to(Path.cwd()) else sys.executable
    command = shlex.join([python, os.path.relpath(__file__), *sys.argv[1:]])
    mode = "--quick smoke run" if args.quick else "full run"
    notes = [
        "",
        f"Command: `{command}` ({mode}, {elapsed / 60:.1f} min, {time.strftime('%Y-%m-%d')})",
        "",
        f"- Setup: {versions}, {os.cpu_count()} CPU cores, 1-min load average {load:.2f} at "
        f"start. A CNN (Conv2D 16 → MaxPool → Conv2D 32 → GlobalAveragePooling → Dense 10, "
        f"Adam) on random 32×32×3 float32 images in RAM, batch {args.batch}, {args.steps} "
        f"steps × {args.epochs} epoch(s) per `fit` ({total} steps); median of {args.passes} "
        f"interleaved passes (rounds of one pass of each side, the order rotated by one "
        f"from round to round) after one warm-up pass of each; time per step = wall time from "
        f"the first callback's `on_train_begin` to the last one's `on_train_end` / {total}, "
        f"so the monitor's per-`fit` work (opening the log, `train_begin`/`train_end` "
        f"samples, the verdict) is counted, and Keras's setup and teardown of `fit` (the "
        f"same with or without callbacks; tearing down the input iterator takes 0.01 s or "
        f"0.6–0.9 s at random here) are not. \"met?\" judges the median of the "
        f"per-round ratios (each pass ÷ the `none` pass of its round).",
        f"- Samples per `fit`: default {samples_per_fit(100)}, every 1 "
        f"{samples_per_fit(1)}. \"Predicted\" = 1 + samples × (µs per sample with its log "
        f"line) / (steps × time per step of `none`): the cost of sampling alone.",
    ]
    return "\n".join(rows + notes)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    load = os.getloadavg()[0]
    versions = f"TensorFlow {tf.__version__}, Keras {keras.__version__}"
    log(f"{versions}, {os.cpu_count()} cores, load {load:.2f}; batch {args.batch}, "
        f"{args.steps} steps × {args.epochs} epoch(s), {args.passes} passes")
    with tempfile.TemporaryDirectory(prefix="memfit-monitor-bench-") as tmp:
        per_step = measure_steps(args, Path(tmp))
        sample = measure_sample(args, Path(tmp))
    elapsed = time.perf_counter() - _STARTED
    print(render(args, versions, load, per_step, sample, elapsed))
    log(f"done in {elapsed:.0f} s")


if __name__ == "__main__":
    main()
