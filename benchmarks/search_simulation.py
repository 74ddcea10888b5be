"""find-batch-size's search, simulated where the estimate's slope is wrong and the peaks
are noisy (issue 27): children stand in as a function of the batch size, so that 200
searches a row run in a second.

Each simulated model is flat, as issue 27's wide MLPs are: 900–1400 MiB of weights, slots
and framework, 0.1–0.3 MiB a sample, a budget that fits 200–1500 samples. A child's peak
is that line plus uniform noise of ±``noise`` MiB; past the budget it is killed. The search
starts at batch size 1 (the estimate's answer for these models) with the estimate's bytes a
sample ``scale`` times the real one, 12 children at most, precision 3 %. Prints a markdown
table: per row, the median and largest number of children, and how many of the 200
searches ended with the answer within 3 % of the largest batch that fits (none may answer
a batch that does not fit: counted too).

    PYTHONPATH=src .venv/bin/python benchmarks/search_simulation.py
"""

from __future__ import annotations

import random
import statistics

from memfit.estimate.measure import ChildResult
from memfit.estimate.search import _Search

MIB = 2**20
ROWS = [(1.0, 5), (1.3, 5), (3, 5), (10, 20), (30, 5), (30, 50), (30, 100), (0.3, 5)]


def one(rng: random.Random, scale: float, noise: float) -> tuple[_Search, int]:
    base = rng.uniform(900, 1400) * MIB
    per = rng.uniform(0.1, 0.3) * MIB
    budget = int(base + per * rng.uniform(200, 1500))
    truth = int((budget - base) / per)
    while base + per * (truth + 1) <= budget:
        truth += 1

    def measure(b: int) -> ChildResult:
        real = base + per * b
        if real > budget:
            return ChildResult("over-budget", peak=budget + 1)
        p = int(real + rng.uniform(-noise, noise) * MIB)
        return ChildResult("ok", measured=p - int(base), peak=min(p, budget))

    search = _Search(measure, 12, None)
    search.secant(1, budget, per * scale, 0.03, 1.25)
    search.bisect(0.03)
    return search, truth


def main() -> None:
    print("| estimate's bytes a sample ÷ real | peak noise | children, median (max) "
          "| within 3 % of 200 | answers that do not fit |")
    print("|---|---|---|---|---|")
    for scale, noise in ROWS:
        rng = random.Random(5)
        counts, within, wrong = [], 0, 0
        for _ in range(200):
            s, truth = one(rng, scale, noise)
            counts.append(len(s.trials))
            wrong += not 0 < s.lo <= truth
            within += s.hi is not None and s.lo > 0 and (
                (s.hi - s.lo) / s.lo <= 0.03 or s.hi - s.lo == 1)
        print(f"| {scale}× | ±{noise} MiB | {statistics.median(counts):.0f} ({max(counts)}) "
              f"| {within} | {wrong} |")


if __name__ == "__main__":
    main()
