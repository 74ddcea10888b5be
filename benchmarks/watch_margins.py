"""How far the outside judge's verdicts are from flipping, with and without a busy neighbour.

Runs each story script (``tests/story/scripts``: seed, leak, data_in_ram, streamed) under
``memfit watch`` (every 0.1 s), with no hog, with a CPU hog beside it (``beside``: the hog
pinned to one CPU, the script free) and with the hog on its CPU (``same``: both pinned to
one CPU), and prints a markdown table: the verdict, the seconds of steady time judged, and
the trend over the steady time as a multiple of the noise threshold (a leak needs more
than 1; the level scripts should stay far below, the leak far above).

Example:
    .venv/bin/python benchmarks/watch_margins.py --rounds 2
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

import memfit
from memfit.memory.watch import watch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from busy_neighbour import start_hog, stop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "story" / "scripts"
NAMES = ("seed", "leak", "data_in_ram", "streamed")


def margin(result) -> float | None:
    """The classifier's trend over the steady time ÷ its noise threshold, or ``None``."""
    v = result.verdict
    if not v.noise or v.epochs < 3:
        return None
    return v.slope * (v.epochs - 2) / v.noise        # epochs - 1 values after the warm-up


def run(name: str, mode: str, packed: Path, work: Path):
    cpu = max(os.sched_getaffinity(0))
    allowed = os.sched_getaffinity(0)
    hog = None if mode == "none" else start_hog(cpu, 600)
    stdout = os.dup(1)
    try:
        if mode == "same":
            os.sched_setaffinity(0, {cpu})      # the watch and the script it starts
        sys.stdout.flush()
        with open(os.devnull, "w") as devnull:   # the script's own output, not the table's
            os.dup2(devnull.fileno(), 1)
        return watch([sys.executable, str(SCRIPTS / f"{name}.py"), str(packed)],
                     interval=0.1, workdir=work, status=io.StringIO(),
                     env={"TF_CPP_MIN_LOG_LEVEL": "2", "STORY_EPOCHS": "6"})
    finally:
        os.dup2(stdout, 1)
        os.close(stdout)
        os.sched_setaffinity(0, allowed)
        if hog is not None:
            stop(hog)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--modes", default="none,beside,same")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="watch-margins-") as tmp:
        work = Path(tmp)
        rng = np.random.default_rng(0)
        memfit.pack({"x": rng.random((8192, 48, 64), dtype=np.float32),
                     "y": rng.random((8192, 1), dtype=np.float32)}, work / "data",
                    progress=False)
        print("| script | hog | verdict | steady s | trend ÷ noise |\n"
              "| --- | --- | --- | --- | --- |")
        for i in range(args.rounds):
            for mode in args.modes.split(","):
                for name in NAMES:
                    r = run(name, mode, work, work / f"{name}-{mode}-{i}")
                    m = margin(r)
                    steady = "—" if r.steady is None else f"{r.steady:.1f}"
                    print(f"| {name} | {mode} | {r.verdict.kind} | {steady} | "
                          f"{'—' if m is None else f'{m:.2f}'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
