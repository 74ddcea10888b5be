"""What issue 27's batch-answer goal asks of any estimate made without running the model.

``max_batch_size`` answers the largest batch whose *high end* fits a budget. On the family
panel (``estimate_families.json``: each ``fixed`` ``float32`` case measured 3 times) this
script replaces the estimate with the truth itself, each case's median measured memory,
raised by a factor ``h``, and asks how good the batch answer can then be. That is the
ceiling: no estimate that does not run the model does better than the truth with the same
margin above it. It prints, side by side on the same 102 cases:

- the shipped estimate's answers, k-fold by family (what docs/estimate.md reports), and how
  far its high end sits above the truth;
- the truth raised by ``h`` for a range of ``h``: the median answer, the answers at 0;
- the truth raised just enough to hold every run of the other families (the noise alone,
  chosen k-fold by family, as "0 above the batch that fits in every run" needs).

Run::

    .venv/bin/python benchmarks/estimate_ceiling.py

Nothing is measured; it reads the cache ``estimate_families.py --repeat 3`` wrote.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from memfit.quiet import quieted

sys.path.insert(0, str(Path(__file__).resolve().parent))
with quieted():  # the panel's module imports Keras
    import estimate_families as panel
    from estimate_family_models import FAMILIES

FACTORS = (1.0, 1.02, 1.04, 1.05, 1.07, 1.10, 1.15, 1.20, 1.30)
GOAL = 0.9


def by_model(rows: list[dict]) -> list[list[dict]]:
    """The cases of each model (and dtype), by batch: a model's high end is known at its
    panel batch sizes and linear between them (as :func:`estimate_families.batch_answers`)."""
    models: dict = {}
    for r in rows:
        models.setdefault((r["model"], r["dtype"]), []).append(r)
    return [sorted(rs, key=lambda r: r["batch"]) for rs in models.values() if len(rs) > 1]


def truth(r: dict) -> float:
    """A case's measured memory: the median of its runs."""
    return statistics.median(r["runs"]) if r["runs"] else r["measured"]


def answers(rows: list[dict], factor_of, every_run: bool = False) -> list[float]:
    """The largest batch under a high end of ``truth × factor_of(case)`` for a budget of
    each case's median (or, ``every_run``, its largest run), ÷ that case's batch."""
    out = []
    for rs in by_model(rows):
        pts = [(r["batch"], truth(r) * factor_of(r)) for r in rs]
        for r in rs:
            budget = max(r["runs"]) if every_run and r["runs"] else truth(r)
            out.append(panel.largest_under(pts, budget) / r["batch"])
    return sorted(out)


def summary(ratios: list[float]) -> str:
    """Median, 10th percentile and zeros of a list of batch answers ÷ the batch that fits."""
    return (f"{statistics.median(ratios):.2f} | {ratios[len(ratios) // 10]:.2f} | "
            f"{sum(a == 0 for a in ratios)} of {len(ratios)}")


def noise(rows: list[dict]) -> float:
    """The smallest factor over the median that holds every run of these cases."""
    return max((max(r["runs"]) / truth(r) for r in rows if r["runs"]), default=1.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", type=Path, default=panel.DEFAULT_CACHE)
    args = p.parse_args()
    cases = panel.select(list(FAMILIES), ["float32"], ["fixed"], quick=False)
    rows = [r for r in panel.rows_of(cases, panel.load(args.cache)) if len(r["runs"]) > 1]
    folds = panel.kfold(rows, refit=True)
    shipped = sorted(a["ratio"] for f in folds.values() for a in f["answers"])
    every = sorted(a["ratio"] for f in folds.values() for a in f["answers_every_run"])
    above = sorted(panel.banded(r, panel.held(r, folds[r["family"]]["constants"]),
                                folds[r["family"]]["high"]) / truth(r) for r in rows)
    spread = sorted(max(r["runs"]) / truth(r) - 1 for r in rows)
    print(f"# The batch answer's ceiling ({len(rows)} cases, `fixed` `float32`, each measured "
          f"{min(len(r['runs']) for r in rows)}+ times)\n")
    print(f"Run-to-run noise, the largest run over the median: median "
          f"{statistics.median(spread) * 100:.1f} %, 90th percentile "
          f"{spread[len(spread) * 9 // 10] * 100:.1f} %, largest {spread[-1] * 100:.1f} %.\n")
    print("| high end | answer ÷ the batch that fits: median | 10th percentile | at 0 |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| the shipped estimate, k-fold by family (its high end ÷ the truth: median "
          f"{statistics.median(above):.3f}, from {above[0]:.3f} to {above[-1]:.3f}) | "
          f"{summary(shipped)} |")
    print(f"| the same, budget at each case's largest run | {summary(every)} |")
    for h in FACTORS:
        print(f"| the truth × {h:.2f} | {summary(answers(rows, lambda r, h=h: h))} |")
    kfold_noise = {f: noise([r for r in rows if r["family"] != f]) for f in folds}
    held_every = answers(rows, lambda r: kfold_noise[r["family"]], every_run=True)
    print(f"| the truth × the other families' largest run ÷ median "
          f"({min(kfold_noise.values()):.3f}–{max(kfold_noise.values()):.3f}), budget at "
          f"each case's largest run | {summary(held_every)} |")
    reach = [h for h in FACTORS if statistics.median(answers(rows, lambda r, h=h: h)) >= GOAL]
    lo, hi = min(kfold_noise.values()) - 1, max(kfold_noise.values()) - 1
    print(f"\nA median of {GOAL} or more needs a high end at most {(max(reach) - 1) * 100:.0f} % "
          f"above the truth on every case (of the factors tried). The shipped estimate's "
          f"sits a median {(statistics.median(above) - 1) * 100:.0f} % above it; a high end "
          f"that holds every run of the other families sits {lo * 100:.0f}–{hi * 100:.0f} % "
          f"above it from the noise alone.")

if __name__ == "__main__":
    main()
