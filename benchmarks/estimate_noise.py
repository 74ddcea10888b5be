"""How repeatable is a measured training peak? The experiment behind the allocator policy.

    .venv/bin/python benchmarks/estimate_noise.py              # ~25 min on the 2-core machine
    .venv/bin/python benchmarks/estimate_noise.py --cases 1 --steps 2   # smoke test

Measures cases of the accuracy panel (``estimate_accuracy.py``) twice under each allocator
policy (``default``: glibc as it comes; ``fixed``: mmap threshold 128 KiB), ``--steps``
steps each, in fresh children (:func:`memfit.estimate.measure.measure_training`), and prints
a markdown table: per policy, the mean and largest run-to-run spread
(``|a - b| / mean(a, b)``) and the step after which the peak stops growing.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from memfit.estimate.measure import measure_training
from memfit.sizes import format_size

PANEL = str(Path(__file__).resolve().with_name("estimate_accuracy.py"))
# The worst residuals of the panel and some good ones: (factory, batch, dtype policy).
CASES = [("small_cnn", 16, "float32"), ("mlp", 2048, "mixed_float16"),
         ("embedding_bag", 2048, "float32"), ("mlp", 32, "float32"),
         ("transformer_block", 256, "mixed_float16"), ("lstm", 512, "float32"),
         ("subclassed", 256, "float32"), ("mobilenet_v2", 16, "float32")]


def settled(step_peaks: list[int]) -> int:
    """The first step (1-based) from which the peak no longer grows by more than 1 %."""
    last = step_peaks[-1]
    for i, p in enumerate(step_peaks):
        if p >= 0.99 * last:
            return i + 1
    return len(step_peaks)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8, help="training steps per child (8)")
    p.add_argument("--cases", type=int, default=len(CASES), help="cases of the list to run")
    args = p.parse_args()
    rows = ["| policy | steps | run-to-run spread, mean (max) | peak settled by step, median "
            "(max) |", "| --- | ---: | ---: | ---: |"]
    for policy in ("default", "fixed"):
        spreads, steps = [], []
        for name, batch, dtype in CASES[:args.cases]:
            runs = [measure_training(f"{PANEL}:{name}", batch, dtype_policy=dtype,
                                     steps=args.steps, allocator=policy) for _ in range(2)]
            bad = [r for r in runs if r.status != "ok"]
            if bad:
                raise SystemExit(f"{name} b{batch} {dtype} under {policy}: {bad[0].status}: "
                                 f"{bad[0].message}")
            a, b = (r.measured for r in runs)
            spreads.append(abs(a - b) / ((a + b) / 2))
            steps += [settled(r.report["step_peaks"]) for r in runs]
            print(f"{policy} {name} b{batch} {dtype}: {format_size(a)}, {format_size(b)}, "
                  f"settled by step {steps[-2]} and {steps[-1]}", flush=True)
        rows.append(f"| {policy} | {args.steps} | {statistics.mean(spreads):.1%} "
                    f"({max(spreads):.1%}) | {statistics.median(steps):g} ({max(steps)}) |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
