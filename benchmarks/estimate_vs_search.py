"""Does the estimate's largest batch ever exceed the one real steps find? (issue 18)

For each model of a selection from the family panel (``estimate_family_models.py``) and
an allocator policy, the budget is this machine's framework baseline plus the model
memory measured at the panel's middle batch size (``estimate_families.json``), so the
true answer is near that batch. ``memfit.estimate.find_batch_size`` searches it with
real steps in children (4 steps, as the panel measures; to ``--precision``); the
estimate's ``max_batch_size`` for the same budget and policy is then computed here,
with the estimator as it is now. Searches are cached (``--cache``), so a changed
estimator is judged again without running a child.

A case **invites an out-of-memory** when the estimate's batch is at or above a batch
size that was measured not to fit; it is **unsettled** when it lies between the largest
batch that fitted and the smallest that did not (the search's precision).

    .venv/bin/python benchmarks/estimate_vs_search.py --policy fixed
    .venv/bin/python benchmarks/estimate_vs_search.py --report-only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
MODELS = HERE.with_name("estimate_family_models.py")
PANEL = HERE.with_name("estimate_families.json")
DEFAULT_CACHE = HERE.with_name("estimate_vs_search.json")
#: One model per family, each the family's worst under-estimate under the old constants.
SELECTION = ("vgg_tiny", "resnet50v2_small", "separable_net", "unet_96", "bigru_text",
             "cross_attention", "audio_conv1d", "mlp_8192", "bag_of_words", "two_input",
             "sub_convnet")

sys.path.insert(0, str(HERE.parent))
from estimate_family_models import FAMILIES  # noqa: E402


def panel_case(name: str) -> tuple[str, int, tuple | None]:
    """``(family, middle batch, input shape)`` of a panel model."""
    for family, models in FAMILIES.items():
        for model, batches, shape in models:
            if model == name:
                return family, batches[1], shape
    raise SystemExit(f"{name} is not in the family panel")


def search(name: str, allocator: str, budget: int, start: int, precision: float) -> dict:
    """Runs find_batch_size; returns every trial (batch, fits, peak)."""
    from memfit.estimate.search import find_batch_size

    _, _, shape = panel_case(name)
    t = time.time()
    r = find_batch_size(f"{MODELS}:{name}", budget, input_shape=shape, steps=4,
                        allocator=allocator, start=start, precision=precision,
                        max_trials=10)
    return {"budget": budget, "found": r.batch_size, "smallest_failing": r.smallest_failing,
            "trials": [[t.batch_size, t.fits, t.peak] for t in r.trials],
            "seconds": round(time.time() - t)}


def judge(name: str, allocator: str, s: dict) -> dict:
    """The estimate's max_batch_size for the search's budget, against the search."""
    import keras

    from memfit.estimate import Estimator

    keras.backend.clear_session()
    _, _, shape = panel_case(name)
    est = Estimator(f"{MODELS}:{name}", input_shape=shape, allocator=allocator)
    best = est.max_batch_size(s["budget"])
    fitted = max((b for b, ok, _ in s["trials"] if ok), default=0)
    failed = min((b for b, ok, _ in s["trials"] if not ok), default=None)
    verdict = ("invites an out-of-memory" if failed is not None and best >= failed
               else "safe" if best <= fitted else "unsettled")
    return {"estimate": best, "fitted": fitted, "failed": failed, "verdict": verdict}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--policy", default="fixed,default")
    p.add_argument("--models", default=",".join(SELECTION))
    p.add_argument("--precision", type=float, default=0.05)
    p.add_argument("--report-only", action="store_true", help="run no search")
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from memfit.estimate.baseline import ensure_calibration

    baseline, _ = ensure_calibration("cpu")
    cache = json.loads(args.cache.read_text()) if args.cache.exists() else {}
    measured = json.loads(PANEL.read_text())["measured"]
    rows = []
    for allocator in args.policy.split(","):
        for name in args.models.split(","):
            family, batch, _ = panel_case(name)
            key = f"{name}|{allocator}"
            m = measured.get(f"{name}|{batch}|float32|{allocator}", {})
            if key not in cache and not args.report_only and m.get("measured"):
                cache[key] = search(name, allocator, baseline + m["measured"], batch,
                                    args.precision)
                tmp = args.cache.with_suffix(".tmp")
                tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
                os.replace(tmp, args.cache)
                print(f"searched {key}: {cache[key]['found']} "
                      f"({cache[key]['seconds']} s)", file=sys.stderr, flush=True)
            if key in cache:
                rows.append({"model": name, "family": family, "allocator": allocator,
                             **cache[key], **judge(name, allocator, cache[key])})
    print("| model | family | policy | budget MiB | estimate's max batch | largest that "
          "fitted | smallest that failed | verdict |\n| --- | --- | --- | ---: | ---: | ---: "
          "| ---: | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['family']} | {r['allocator']} | "
              f"{r['budget'] / 2**20:,.0f} | {r['estimate']} | {r['fitted']} | "
              f"{r['failed'] if r['failed'] is not None else '—'} | {r['verdict']} |")
    bad = sum(r["verdict"] == "invites an out-of-memory" for r in rows)
    unsettled = sum(r["verdict"] == "unsettled" for r in rows)
    ratios = sorted(r["estimate"] / r["fitted"] for r in rows if r["fitted"])
    median = statistics.median(ratios) if ratios else float("nan")
    print(f"\n**{len(rows)} searches: the estimate's batch invited an out-of-memory in {bad}; "
          f"{unsettled} unsettled (between the largest batch that fitted and the smallest "
          f"that failed).** The estimate's batch ÷ the largest that fitted: median "
          f"{median:.2f}. Baseline {baseline / 2**20:.0f} MiB.")


if __name__ == "__main__":
    main()
