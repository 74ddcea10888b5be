"""Would a recorded step beat the played one? Two measurement-based predictors, judged on
the family panel's cache (``estimate_families.json``; nothing is run).

* **linear**: memory measured at the two smaller panel batch sizes, extrapolated linearly
  to the largest (what recording a real step at two small batches and replaying it at the
  target would give, if every allocation were ``a + b × batch`` and nothing else moved);
* **anchored**: memory measured at the smallest batch, plus the play's growth from there
  (the estimate's features under the shipped constants, without the margin).

Both are compared with the play itself (the same constants, no margin) on the same cases.

    .venv/bin/python benchmarks/estimate_recorded.py --policy fixed
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from estimate_family_models import FAMILIES  # noqa: E402


def main() -> None:
    from memfit.estimate.fitted import FITTED, predict_from_features

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="fixed", choices=("fixed", "default"))
    args = p.parse_args()
    cache = json.loads(HERE.with_name("estimate_families.json").read_text())
    measured, predicted = cache["measured"], cache["predicted"]
    bare = {**FITTED[args.policy]["onednn-float32"], "margin": 0.0}
    errs: dict[str, list[float]] = {"linear": [], "anchored": [], "played": []}
    for models in FAMILIES.values():
        for name, batches, _ in models:
            keys = [f"{name}|{b}|float32|{args.policy}" for b in batches]
            if not all(k in measured and k in predicted for k in keys):
                continue
            m = [measured[k]["measured"] for k in keys]
            play = [predict_from_features(predicted[k]["features"], bare) for k in keys]
            (b1, b2, b3) = batches
            errs["linear"].append((m[1] + (m[1] - m[0]) / (b2 - b1) * (b3 - b2)) / m[2] - 1)
            for i in (1, 2):
                errs["anchored"].append((m[0] + play[i] - play[0]) / m[i] - 1)
                errs["played"].append(play[i] / m[i] - 1)
    print(f"| predictor ({args.policy}, float32, oneDNN) | cases | mean relative error | "
          "under-estimated | worst |\n| --- | ---: | ---: | ---: | ---: |")
    for name, e in errs.items():
        worst = max(e, key=abs)
        print(f"| {name} | {len(e)} | {sum(map(abs, e)) / len(e) * 100:.1f} % | "
              f"{sum(x < 0 for x in e)} | {worst * 100:+.1f} % |")


if __name__ == "__main__":
    main()
