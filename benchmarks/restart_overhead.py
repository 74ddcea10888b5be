"""What a restart costs under ``memfit run``, side by side in one run.

Run from the repository root::

    .venv/bin/python benchmarks/restart_overhead.py            # ~5 min on 2 cores
    .venv/bin/python benchmarks/restart_overhead.py --quick    # ~2 min

The training is ``examples/supervised.py`` (a small CNN, Adam, on 32x32x3 uint8 images
packed with ``memfit.pack``), ``--epochs`` short epochs. In rounds, so that a noisy
neighbour on the CPU hits every side alike, it times:

- ``none``: ``memfit.run`` of the script with no restart (one process);
- ``every 1``: the same with ``restart_every=1`` (one process per epoch);
- ``baseline``: what the issue compares with, a fresh ``python -c "import tensorflow;
  import keras; keras.models.load_model(MODEL)"`` of the same model saved with its
  optimizer state (the least any restart must pay).

Per-restart overhead = (median ``every 1`` time - median ``none`` time) / restarts. The
table also splits a restart into its parts, from the runs' shared log: the child's exit
(checkpoint written to process gone), the gap from one process's exit to the next one's
``resume`` event (interpreter, imports, model build, weights and optimizer state
loaded), and the checkpoint write. The markdown table goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import memfit  # noqa: E402
from memfit.memory.log import read_log  # noqa: E402

GOAL = 1.5


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def timed_run(command: list[str], workdir: Path, restart_every: int | None) -> float:
    started = time.perf_counter()
    result = memfit.run(command, workdir=workdir, restart_every=restart_every, out=False)
    elapsed = time.perf_counter() - started
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="5 epochs, 1 round")
    args = p.parse_args()
    if args.quick:
        args.epochs, args.rounds = 5, 1

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
    times: dict[str, list[float]] = {"none": [], "every 1": [], "baseline": []}
    split: dict[str, list[float]] = {"exit": [], "start": [], "checkpoint": []}
    for round_ in range(args.rounds):
        for side in (("none", "every 1") if round_ % 2 == 0 else ("every 1", "none")):
            workdir = tmp / f"run-{round_}-{side.replace(' ', '')}"
            say(f"round {round_ + 1}/{args.rounds}: {side} ...")
            times[side].append(timed_run(script, workdir, 1 if side == "every 1" else None))
            say(f"  {times[side][-1]:.1f} s")
            if side == "every 1":
                for key, values in parts(workdir).items():
                    split[key].extend(values)
        for _ in range(3):
            times["baseline"].append(baseline(model_path))
        say(f"  baseline {statistics.median(times['baseline']):.2f} s")

    none, every, base = (statistics.median(times[k]) for k in ("none", "every 1", "baseline"))
    restarts = args.epochs - 1
    overhead = (every - none) / restarts
    ratio = overhead / base
    print(f"\n{args.epochs} epochs of {args.samples} samples (batch 64), {args.rounds} round(s); "
          f"medians.\n")
    print("| measure | seconds |")
    print("|---|---|")
    print(f"| training, no restart (`none`) | {none:.1f} |")
    print(f"| training, `--restart-every 1` ({restarts} restarts) | {every:.1f} |")
    print(f"| per-restart overhead = (every 1 − none) / {restarts} | {overhead:.2f} |")
    print(f"| `python -c \"import tensorflow; keras.models.load_model(…)\"` | {base:.2f} |")
    print(f"| **ratio: per-restart overhead ÷ (import + load)** (goal ≤ {GOAL}) | "
          f"**{ratio:.2f}×** {'met' if ratio <= GOAL else 'missed'} |")
    for key, label in (("exit", "of a restart: checkpoint written → process gone"),
                       ("start", "of a restart: process gone → next one resumed training"),
                       ("checkpoint", "checkpoint write (weights, optimizer, state)")):
        if split[key]:
            print(f"| {label} | {statistics.median(split[key]):.2f} |")
    print(f"\nkeras {keras.__version__}, memfit {memfit.__version__}; data in {tmp}")


if __name__ == "__main__":
    main()
