"""Does the estimate's largest batch ever exceed the one real steps find? (issue 18)

For each model of a selection from the family panel (``estimate_family_models.py``) and
an allocator policy, the budget is this machine's framework baseline plus the model
memory measured at the panel's middle batch size (``estimate_families.json``), so the
true answer is near that batch. ``memfit.estimate.find_batch_size`` searches it with
real steps in children (4 steps, as the panel measures; to ``--precision``); the
estimate's ``max_batch_size`` for the same budget and policy is then computed here,
with the estimator as it is now. Searches are cached (``--cache``), so a changed
estimator is judged again without running a child.

``--holdout`` judges the models of ``estimate_holdout_models.py`` instead: models outside
the family panel that no choice of the estimator was made on. Their budget is this
machine's baseline plus the model memory measured at their ``B0`` (one 4-step child).

The estimate is judged on the **model's** budget: each search records the framework
baseline its budget was built from, and the estimate is asked for that budget minus that
baseline plus the baseline it uses now. (A baseline measured later can differ: since
JAX is installed beside TensorFlow, ``import tensorflow`` imports it, and the TensorFlow
baseline on this machine grew from about 224 to 267 MiB. Searches cached before a
baseline was recorded get it back as their budget minus the panel's measurement.)

A case **invites an out-of-memory** when the estimate's batch is at or above a batch
size that was measured not to fit; it is **unsettled** when it lies between the largest
batch that fitted and the smallest that did not (the search's precision).

    .venv/bin/python benchmarks/estimate_vs_search.py --policy fixed
    .venv/bin/python benchmarks/estimate_vs_search.py --report-only
    .venv/bin/python benchmarks/estimate_vs_search.py --holdout --precision 0.03
    .venv/bin/python benchmarks/estimate_vs_search.py --holdout --policy fixed \\
        --precision 0.03 --again here --tag inferred-edge    # reference searches again

``--again TAG`` searches each cached case's budget once more at ``--precision`` (the same
budget in bytes, on whatever machine runs it), children as new interpreters, every edge
proved by a child that ran (``prove=True``), and keeps it under ``name|policy|again|TAG``.
It starts from the ``--from-estimate`` answer of ``--tag`` where there is one (a machine
whose kernels make a sample cheaper can put the answer 18× above the old B0: growing by
1.25 from there takes more than the 12 children a search may run), else from B0. The
report then judges the ``--from-estimate`` searches (of ``--tag``) against it too: a
search made on another machine (other kernels, another per-sample cost) is no reference
for answers found on this one.
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
HOLDOUT_MODELS = HERE.with_name("estimate_holdout_models.py")
HOLDOUT_CACHE = HERE.with_name("estimate_vs_search_holdout.json")
#: One model per family, each the family's worst under-estimate under the old constants.
SELECTION = ("vgg_tiny", "resnet50v2_small", "separable_net", "unet_96", "bigru_text",
             "cross_attention", "audio_conv1d", "mlp_8192", "bag_of_words", "two_input",
             "sub_convnet")

sys.path.insert(0, str(HERE.parent))
from estimate_family_models import FAMILIES  # noqa: E402
from estimate_holdout_models import HOLDOUT  # noqa: E402


def panel_case(name: str) -> tuple[str, int, tuple | None]:
    """``(family, middle batch, input shape)`` of a panel or held-out model."""
    for family, models in FAMILIES.items():
        for model, batches, shape in models:
            if model == name:
                return family, batches[1], shape
    if name in HOLDOUT:
        return "held out", *HOLDOUT[name]
    raise SystemExit(f"{name} is in neither the family panel nor the held-out set")


def source(name: str) -> str:
    """The ``module:function`` a child imports ``name`` from."""
    return f"{HOLDOUT_MODELS if name in HOLDOUT else MODELS}:{name}"


def search(name: str, allocator: str, budget: int, baseline: int, start: int | None,
           precision: float, *, prove: bool = False, warm: bool = True) -> dict:
    """Runs find_batch_size; returns every trial (batch, fits, peak)."""
    from memfit.estimate.search import find_batch_size

    _, _, shape = panel_case(name)
    t = time.time()
    r = find_batch_size(source(name), budget, input_shape=shape, steps=4,
                        allocator=allocator, start=start, precision=precision,
                        max_trials=12, prove=prove, warm=warm)
    return {"budget": budget, "baseline": baseline, "found": r.batch_size,
            "smallest_failing": r.smallest_failing, "inferred_failing": r.inferred_failing,
            "trials": [[t.batch_size, t.fits, t.peak] for t in r.trials],
            "seconds": round(time.time() - t)}


def model_budget(s: dict, measured: dict, name: str, allocator: str) -> int:
    """The search's budget less the framework baseline it was built from."""
    if "baseline" in s:
        return s["budget"] - s["baseline"]
    _, batch, _ = panel_case(name)
    m = measured[f"{name}|{batch}|float32|{allocator}"]
    return (m.get("runs") or [m["measured"]])[0]     # the run the budget was built from


def judge(name: str, allocator: str, s: dict, model_bytes: int) -> dict:
    """The estimate's max_batch_size for the search's model budget (plus the baseline
    the estimate uses now), against the search."""
    import keras

    from memfit.estimate import Estimator

    keras.backend.clear_session()
    _, _, shape = panel_case(name)
    est = Estimator(source(name), input_shape=shape, allocator=allocator)
    best = est.max_batch_size(model_bytes + est.baseline)
    fitted = max((b for b, ok, _ in s["trials"] if ok), default=0)
    failed = min((b for b, ok, _ in s["trials"] if not ok), default=None)
    verdict = ("invites an out-of-memory" if failed is not None and best >= failed
               else "safe" if best <= fitted else "unsettled")
    return {"estimate": best, "fitted": fitted, "failed": failed, "verdict": verdict,
            "model_budget": model_bytes}


def measure_b0(name: str, allocator: str) -> int:
    """A held-out model's memory at its B0 (one child, 4 steps), bytes beyond the
    baseline."""
    from memfit.estimate.measure import measure_training

    b0, shape = HOLDOUT[name]
    r = measure_training(source(name), b0, input_shape=shape, steps=4, allocator=allocator)
    if r.status != "ok" or not r.measured:
        raise SystemExit(f"{name} at batch {b0} ({allocator}): {r.status} {r.message[-300:]}")
    return r.measured


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", type=Path)
    p.add_argument("--policy", default="fixed,default")
    p.add_argument("--models")
    p.add_argument("--holdout", action="store_true",
                   help="the held-out models (estimate_holdout_models.py), not the panel's")
    p.add_argument("--precision", type=float, default=0.05)
    p.add_argument("--report-only", action="store_true", help="run no search")
    p.add_argument("--from-estimate", action="store_true",
                   help="also run find-batch-size as a user does (started from the "
                        "estimate, 3 %% precision) on each case's budget, and count its "
                        "children")
    p.add_argument("--tag", default="",
                   help="cache the --from-estimate searches under this tag, so a changed "
                        "search runs again beside the ones recorded before (the report "
                        "shows the tagged ones)")
    p.add_argument("--again", default="",
                   help="search every cached case's budget again (a reference made on "
                        "this machine), kept under this tag")
    p.add_argument("--search-only", action="store_true",
                   help="run the searches, judge nothing (keeps a held-out set unseen "
                        "while the estimator is changed)")
    args = p.parse_args()
    args.cache = args.cache or (HOLDOUT_CACHE if args.holdout else DEFAULT_CACHE)
    args.models = args.models or ",".join(HOLDOUT if args.holdout else SELECTION)
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
            if key not in cache and not args.report_only and name in HOLDOUT:
                m = {"measured": measure_b0(name, allocator)}
            if key not in cache and not args.report_only and m.get("measured"):
                cache[key] = search(name, allocator, baseline + m["measured"], baseline,
                                    batch, args.precision)
                tmp = args.cache.with_suffix(".tmp")
                tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
                os.replace(tmp, args.cache)
                print(f"searched {key}: {cache[key]['found']} "
                      f"({cache[key]['seconds']} s)", file=sys.stderr, flush=True)
            fkey = f"{key}|from-estimate" + (f"|{args.tag}" if args.tag else "")
            if (args.from_estimate and key in cache and fkey not in cache
                    and not args.report_only):
                cache[fkey] = search(name, allocator, cache[key]["budget"],
                                     cache[key].get("baseline", baseline), None, 0.03)
                tmp = args.cache.with_suffix(".tmp")
                tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
                os.replace(tmp, args.cache)
                print(f"searched {fkey}: {cache[fkey]['found']} in "
                      f"{len(cache[fkey]['trials'])} children", file=sys.stderr, flush=True)
            akey = f"{key}|again|{args.again}"
            if args.again and key in cache and akey not in cache and not args.report_only:
                seed = cache.get(f"{key}|from-estimate" + (f"|{args.tag}" if args.tag else ""))
                cache[akey] = search(name, allocator, cache[key]["budget"],
                                     cache[key].get("baseline", baseline),
                                     (seed or {}).get("found") or batch, args.precision,
                                     prove=True, warm=False)
                tmp = args.cache.with_suffix(".tmp")
                tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
                os.replace(tmp, args.cache)
                print(f"searched {akey}: {cache[akey]['found']} "
                      f"({cache[akey]['seconds']} s)", file=sys.stderr, flush=True)
            if key in cache and not args.search_only:
                rows.append({"model": name, "family": family, "allocator": allocator,
                             **cache[key], **judge(name, allocator, cache[key],
                                                   model_budget(cache[key], measured, name,
                                                                allocator))})
    print("| model | family | policy | model budget MiB | estimate's max batch | largest "
          "that fitted | smallest that failed | ÷ largest | verdict |\n| --- | --- | --- | "
          "---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['family']} | {r['allocator']} | "
              f"{r['model_budget'] / 2**20:,.1f} | {r['estimate']} | {r['fitted']} | "
              f"{r['failed'] if r['failed'] is not None else '—'} | "
              f"{r['estimate'] / r['fitted'] if r['fitted'] else float('nan'):.2f} | "
              f"{r['verdict']} |")
    bad = sum(r["verdict"] == "invites an out-of-memory" for r in rows)
    unsettled = sum(r["verdict"] == "unsettled" for r in rows)
    ratios = sorted(r["estimate"] / r["fitted"] for r in rows if r["fitted"])
    median = statistics.median(ratios) if ratios else float("nan")
    zeros = sum(r["estimate"] == 0 and r["fitted"] >= 8 for r in rows)
    runs = []
    for r in rows:
        f = cache.get(f"{r['model']}|{r['allocator']}|from-estimate"
                      + (f"|{args.tag}" if args.tag else ""))
        if f:
            truth = r["fitted"]
            again = cache.get(f"{r['model']}|{r['allocator']}|again|{args.again}")
            here = (max((b for b, ok, _ in again["trials"] if ok), default=0)
                    if again else None)
            runs.append((r["model"], r["allocator"], len(f["trials"]), f["found"], truth,
                         f.get("smallest_failing"), f.get("inferred_failing"), here))
    if runs:
        print("\n| model | policy | find-batch-size children (from the estimate, 3 %) | "
              "its answer | smallest that failed / put over by the peaks | largest that "
              "fitted (the search above) | answer ÷ that |\n| --- | --- | ---: | ---: | --- "
              "| ---: | ---: |")
        for m, a, n, found, truth, failed, inferred, _ in runs:
            edge = f"{inferred} (peaks)" if inferred is not None else str(failed)
            print(f"| {m} | {a} | {n} | {found} | {edge} | {truth} | "
                  f"{found / truth if truth else float('nan'):.2f} |")
        print(f"\nChildren to an answer within 3 %: median "
              f"{statistics.median(r[2] for r in runs)}, most "
              f"{max(r[2] for r in runs)} over {len(runs)} searches; answers at least the "
              f"largest that fitted above ÷ 1.03 (or one sample below): "
              f"{sum(r[3] >= min(r[4] / 1.03, r[4] - 1) for r in runs)} of {len(runs)}, "
              f"above it: {sum(r[3] > r[4] for r in runs)}.")
        again = [r for r in runs if r[7] is not None]
        if again:
            print(f"\n| model | policy | its answer | largest that fitted, searched again "
                  f"here (`--again {args.again}`) | answer ÷ that |\n| --- | --- | ---: | "
                  f"---: | ---: |")
            for m, a, _, found, _, _, _, here in again:
                print(f"| {m} | {a} | {found} | {here} | "
                      f"{found / here if here else float('nan'):.3f} |")
            print(f"\nAgainst the searches made again on this machine: answers within 3 % "
                  f"(at least ÷ 1.03, or one sample below): "
                  f"{sum(r[3] >= min(r[7] / 1.03, r[7] - 1) for r in again)} of {len(again)}; "
                  f"above: {sum(r[3] > r[7] for r in again)}.")
    print(f"\n**{len(rows)} searches: the estimate's batch invited an out-of-memory in {bad}; "
          f"{unsettled} unsettled (between the largest batch that fitted and the smallest "
          f"that failed).** The estimate's batch ÷ the largest that fitted: median "
          f"{median:.2f}, worst {min(ratios, default=float('nan')):.2f}; 0 where batch 8 "
          f"fits: {zeros}. Baseline now {baseline / 2**20:.1f} MiB.")


if __name__ == "__main__":
    main()
