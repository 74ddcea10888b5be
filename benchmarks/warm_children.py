"""Does a measuring child forked from a warm parent measure what a new interpreter does,
and what does it save? (issue 28's "restart without paying the import", for the
children of ``memfit find-batch-size``)

For each model, in rounds, one measuring child (``memfit.estimate.measure_training``, 4
steps) as a new interpreter and one forked from a warm parent
(``memfit.estimate.measure.warm_children``), in turn; the order within a round
alternates. Prints, per model, the median and spread of the memory a child measures (its
peak over its own framework baseline), its peak, its baseline and its wall time, both
ways, and the ratios.

The models are the held-out set's (``estimate_holdout_models.py``: no choice of this
change was made on them) at their B0, and the tests' tiny MLP.

    .venv/bin/python benchmarks/warm_children.py                 # ~15 min on 2 cores
    .venv/bin/python benchmarks/warm_children.py --rounds 5 --models conv1d_lstm
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from estimate_holdout_models import HOLDOUT  # noqa: E402

TINY = str(HERE.parent / "tests" / "estimate" / "models.py") + ":tiny"
DEFAULT = "tiny,conv1d_lstm,dcgan_generator,multi_output,wide_mlp_issue"


def case(name: str) -> tuple[str, int, tuple | None]:
    if name == "tiny":
        return TINY, 32, None
    b0, shape = HOLDOUT[name]
    return f"{HERE / 'estimate_holdout_models.py'}:{name}", b0, shape


def spread(values: list[float], scale: float, fmt: str) -> str:
    return (f"{statistics.median(values) / scale:{fmt}} "
            f"({min(values) / scale:{fmt}}–{max(values) / scale:{fmt}})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=DEFAULT)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--allocator", default="default", choices=("default", "fixed"))
    p.add_argument("--batch", type=int, help="every model at this batch (default: its B0)")
    p.add_argument("--json", type=Path, help="also write every child's figures here")
    args = p.parse_args()
    from memfit.estimate.measure import measure_training, warm_children

    runs: dict[str, dict[str, list]] = {}
    with warm_children():
        t = time.time()
        measure_training(TINY, 8, steps=1)          # starts the warm parent: not counted
        opened = time.time() - t
        for name in args.models.split(","):
            model, batch, shape = case(name)
            batch = args.batch or batch
            runs[name] = {"cold": [], "warm": []}
            for i in range(args.rounds):
                for how in (("cold", "warm") if i % 2 == 0 else ("warm", "cold")):
                    if how == "cold":
                        with warm_children(False):
                            r = measure_training(model, batch, input_shape=shape, steps=4,
                                             allocator=args.allocator)
                    else:
                        r = measure_training(model, batch, input_shape=shape, steps=4,
                                             allocator=args.allocator)
                    if r.status != "ok" or r.started != how:
                        raise SystemExit(f"{name} {how}: {r.status} ({r.started}) "
                                         f"{r.message[-300:]}")
                    runs[name][how].append({"measured": r.measured, "peak": r.peak,
                                            "baseline": r.baseline, "seconds": r.seconds})
                    print(f"{name} {how}: {r.measured / 2**20:.1f} MiB over the baseline, "
                          f"{r.seconds:.1f} s", file=sys.stderr, flush=True)
    print(f"The warm parent's start with its first child: {opened:.1f} s (paid once a "
          f"search).\n")
    print("| model | batch | measured MiB, new interpreter | forked | forked ÷ new | peak "
          "MiB, new | forked | baseline MiB, new | forked | child s, new | forked | "
          "forked ÷ new |\n|---|---:|---|---|---:|---|---|---|---|---|---|---:|")
    for name, both in runs.items():
        batch = args.batch or case(name)[1]
        c, w = both["cold"], both["warm"]

        def col(rows: list, key: str, scale: float = 2**20, fmt: str = ".1f") -> str:
            return spread([r[key] for r in rows], scale, fmt)

        def ratio(key: str, w: list = w, c: list = c) -> float:
            return (statistics.median(r[key] for r in w)
                    / statistics.median(r[key] for r in c))

        print(f"| {name} | {batch} | {col(c, 'measured')} | {col(w, 'measured')} | "
              f"{ratio('measured'):.3f} | {col(c, 'peak')} | {col(w, 'peak')} | "
              f"{col(c, 'baseline')} | {col(w, 'baseline')} | {col(c, 'seconds', 1, '.1f')} "
              f"| {col(w, 'seconds', 1, '.1f')} | {ratio('seconds'):.2f} |")
    print(f"\nMedian (min–max) of {args.rounds} rounds; each round one child each way, "
          f"their order alternating; allocator policy {args.allocator!r}.")
    if args.json:
        args.json.write_text(json.dumps({"opened": opened, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
