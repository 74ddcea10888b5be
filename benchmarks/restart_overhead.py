"""What a restart costs under ``memfit run``, side by side in one run.

Run from the repository root::

    .venv/bin/python benchmarks/restart_overhead.py            # ~7 min on 2 cores
    .venv/bin/python benchmarks/restart_overhead.py --quick    # ~1.5 min

The training is ``examples/supervised.py`` (a small CNN, Adam, on 32x32x3 uint8 images
packed with ``memfit.pack``), ``--epochs`` short epochs. In rounds (each side first in
turn), so that a noisy neighbour on the CPU hits every side alike, it times:

- ``none``: ``memfit.run`` of the script with no restart (one process);
- ``cold``: the same with ``restart_every=1, start="cold"`` (a new interpreter per epoch);
- ``warm``: ``restart_every=1, start="warm"`` (each process forked from a warm parent
  that imported Keras and TensorFlow once: :mod:`memfit.supervise.warm`);
- ``baseline``: what the issue compares with, a fresh ``python -c "import tensorflow;
  import keras; keras.models.load_model(MODEL)"`` of the same model saved with its
  optimizer state (what a restart that imports must pay at least).

Per-restart overhead = (``cold`` or ``warm`` time - ``none`` time) / restarts, and its
ratio to the baseline, within each round; the table gives the median and the spread
over the rounds. It also splits a restart into its parts, from the runs' shared log: the
child's exit (checkpoint written to process gone), the gap from one process's exit to
the next one's ``resume`` event (interpreter or fork, imports, model build, weights and
optimizer state loaded), and the checkpoint write; and the warm parent's own memory.
The markdown table goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import memfit  # noqa: E402
from memfit.memory.log import read_log  # noqa: E402

GOAL = 0.5                  # issue 28: per-restart overhead ÷ (import + load)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def timed_run(command: list[str], workdir: Path, restart_every: int | None,
              start: str = "cold") -> float:
    sys.stdout.flush()
    kept = os.dup(1)                    # the training's own output would bury the table
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        started = time.perf_counter()
        result = memfit.run(command, workdir=workdir, restart_every=restart_every,
                            start=start, out=False)
        elapsed = time.perf_counter() - started
    finally:
        os.dup2(kept, 1)
        os.close(kept)
        os.close(devnull)
    if not result.finished:
        raise SystemExit(f"the training did not finish: {result}")
    return elapsed


def baseline(model_path: Path) -> float:
    code = ("import tensorflow, keras; "
            f"keras.models.load_model({str(model_path)!r})")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - started


def parts(workdir: Path) -> dict[str, list[float]]:
    """Seconds of each part of every restart in one run's log."""
    records = list(read_log(workdir / "memory.jsonl"))
    exits = [r for r in records if r["event"] == "exit" and r.get("cause") == "restart"]
    resumes = {r["pid"]: r["t"] for r in records if r["event"] == "resume"}
    checkpoints = [r for r in records if r["event"] == "checkpoint"]
    out: dict[str, list[float]] = {"exit": [], "start": [], "checkpoint": []}
    order = [r["pid"] for r in records if r["event"] == "resume"]
    for record in exits:
        last = max((c["t"] for c in checkpoints if c["pid"] == record["pid"]), default=None)
        if last is not None:
            out["exit"].append(record["t"] - last)
        following = order[order.index(record["pid"]) + 1] if record["pid"] in order else None
        if following in resumes:
            out["start"].append(resumes[following] - record["t"])
    out["checkpoint"] = [c["seconds"] for c in checkpoints]
    return out


def warm_parent_memory(workdir: Path, stop: threading.Event, seen: dict[str, float]) -> None:
    """While a warm run goes on: the warm parent's largest RSS and USS (its own pages,
    not shared with the training processes it forked), from /proc/PID/smaps_rollup."""
    pid = None
    while not stop.wait(0.5):
        if pid is None:
            try:
                pid = next((r["pid"] for r in read_log(workdir / "memory.jsonl")
                            if r["event"] == "warm"), None)
            except (OSError, ValueError):
                pid = None
            continue
        try:
            fields = {}
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
                key, value = line.split(":")
                fields[key] = int(value.split()[0]) * 1024
        except (OSError, ValueError):
            continue
        own = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
        seen["rss"] = max(seen.get("rss", 0), fields.get("Rss", 0))
        seen["uss"] = max(seen.get("uss", 0), own)


def spread(values: list[float], digits: int = 2) -> str:
    return (f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–"
            f"{max(values):.{digits}f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="4 epochs, 1 round")
    args = p.parse_args()
    if args.quick:
        args.epochs, args.rounds = 4, 1

    import keras
    import numpy as np
    import supervised

    tmp = Path(tempfile.mkdtemp(prefix="memfit-restart-bench-"))
    data = tmp / "data"
    say(f"packing {args.samples} images into {data}")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, args.samples).astype("int64")
    x = rng.integers(0, 255, (args.samples, 32, 32, 3), dtype=np.uint8)
    memfit.pack({"x": x, "y": y}, data, progress=False)
    model = supervised.build_model()
    model.fit(x[:64], y[:64], epochs=1, verbose=0)      # optimizer state to load, too
    model_path = tmp / "model.keras"
    model.save(model_path)

    script = [sys.executable, str(ROOT / "examples" / "supervised.py"), "--data", str(data),
              "--epochs", str(args.epochs)]
    sides = ("none", "cold", "warm")
    times: dict[str, list[float]] = {side: [] for side in (*sides, "baseline")}
    ratios: dict[str, list[float]] = {"cold": [], "warm": []}
    split: dict[str, dict[str, list[float]]] = {
        side: {"exit": [], "start": [], "checkpoint": []} for side in ("cold", "warm")}
    memory: dict[str, float] = {}
    restarts = args.epochs - 1
    for round_ in range(args.rounds):
        order = sides[round_ % 3:] + sides[:round_ % 3]         # each side first in turn
        for side in order:
            workdir = tmp / f"run-{round_}-{side}"
            say(f"round {round_ + 1}/{args.rounds}: {side} ...")
            stop = threading.Event()
            watcher = threading.Thread(target=warm_parent_memory, args=(workdir, stop, memory))
            if side == "warm":
                watcher.start()
            times[side].append(timed_run(script, workdir, None if side == "none" else 1,
                                         "cold" if side == "none" else side))
            stop.set()
            if side == "warm":
                watcher.join()
            say(f"  {times[side][-1]:.1f} s")
            if side != "none":
                for key, values in parts(workdir).items():
                    split[side][key].extend(values)
        base = [baseline(model_path) for _ in range(3)]
        times["baseline"] += base
        for side in ("cold", "warm"):
            overhead = (times[side][-1] - times["none"][-1]) / restarts
            ratios[side].append(overhead / statistics.median(base))
        say(f"  baseline {statistics.median(base):.2f} s; per-restart overhead ÷ baseline: "
            f"cold {ratios['cold'][-1]:.2f}, warm {ratios['warm'][-1]:.2f}")

    print(f"\n{args.epochs} epochs of {args.samples} samples (batch 64), {restarts} restarts "
          f"a run, {args.rounds} interleaved round(s); median (min–max) over the rounds, each "
          f"ratio taken within its round.\n")
    print("| measure | seconds |")
    print("|---|---|")
    print(f"| training, no restart (`none`) | {spread(times['none'], 1)} |")
    for side in ("cold", "warm"):
        print(f"| training, `--restart-every 1 --start {side}` | {spread(times[side], 1)} |")
    for side in ("cold", "warm"):
        per = [(t - n) / restarts for t, n in zip(times[side], times["none"], strict=True)]
        print(f"| per-restart overhead, {side} = ({side} − none) / {restarts} | {spread(per)} |")
    print(f"| `python -c \"import tensorflow, keras; keras.models.load_model(…)\"` | "
          f"{spread(times['baseline'])} |")
    for side in ("cold", "warm"):
        goal = f"goal ≤ {GOAL}" if side == "warm" else "issue 28's goal is for warm"
        met = "met" if statistics.median(ratios[side]) <= GOAL else "not met"
        print(f"| **ratio: per-restart overhead ÷ (import + load), {side}** ({goal}) | "
              f"**{spread(ratios[side])}×** {met if side == 'warm' else ''} |")
    for side in ("cold", "warm"):
        for key, label in (("exit", "checkpoint written → process gone"),
                           ("start", "process gone → next one resumed training"),
                           ("checkpoint", "checkpoint write (weights, optimizer, state)")):
            if split[side][key]:
                print(f"| {side}: {label} | {spread(split[side][key])} |")
    if memory:
        print(f"\nThe warm parent while training processes ran: RSS up to "
              f"{memory['rss'] / 2**20:.0f} MiB, of which up to {memory['uss'] / 2**20:.0f} MiB "
              f"its own (not shared with the process it forked).")
    print(f"\nkeras {keras.__version__}, memfit {memfit.__version__}; data in {tmp}")


if __name__ == "__main__":
    main()
