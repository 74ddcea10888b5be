"""The estimate, held out by family: predicted vs measured on a wide panel of architectures.

The panel (``benchmarks/estimate_family_models.py``: 34 architectures in 11 families,
three batch sizes each) is measured in children (:func:`memfit.estimate.measure_training`,
the definition ``--measure`` uses: peak anonymous RSS over the framework baseline, 4
``train_on_batch`` steps, Adam, MSE loss) and predicted by the estimator in this process.
Each case (model × batch × dtype policy × allocator policy) is cached in a JSON file
(``--cache``) as soon as it is measured, so the long run resumes where it stopped, and
reruns can be compared case by case.

    .venv/bin/python benchmarks/estimate_families.py --quick --dtypes float32  # 1 batch
    .venv/bin/python benchmarks/estimate_families.py --policy fixed          # the full panel
    .venv/bin/python benchmarks/estimate_families.py --families recurrent,wide_mlp
    .venv/bin/python benchmarks/estimate_families.py --report-only           # cached cases only
    .venv/bin/python benchmarks/estimate_families.py --repredict             # play again

Prints, per allocator policy, one markdown table per family (every case, with the
constants the estimator ships), a summary per family (mean relative error, share
under-estimated, worst case) and the overall figures; then the **out-of-family** table,
k-fold by family: for each family, the fitted constants (:func:`estimate_fit.fit`, the
margin holding 5 % of cases under) and the band (the extremes of ``measured /
predicted``, the high end on the prediction held non-decreasing in the batch) are chosen
on every *other* family and judged on this one. Nothing about a family is chosen with
its own cases, so these are the figures to quote. Last, the constants and band chosen
on every family: what ``FITTED`` and ``BANDS`` ship (in panel, not a result).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve()
MODELS = HERE.with_name("estimate_family_models.py")
DEFAULT_CACHE = HERE.with_name("estimate_families.json")
DTYPES = ("float32", "mixed_float16")
#: A policy name ending so (``fixed/onednn-off``) measures children with
#: ``TF_ENABLE_ONEDNN_OPTS=0``: TensorFlow's own CPU kernels and allocator, without
#: oneDNN's (the estimate is the same; docs/estimate.md, "oneDNN").
ONEDNN_OFF = "/onednn-off"

sys.path.insert(0, str(HERE.parent))
import estimate_fit as fitting  # noqa: E402
from estimate_family_models import FAMILIES, IN_OLD_PANEL  # noqa: E402


def case_key(name: str, batch: int, dtype: str, allocator: str) -> str:
    """The cache key of one case."""
    return f"{name}|{batch}|{dtype}|{allocator}"


def select(families: list[str], dtypes: list[str], allocators: list[str],
           quick: bool) -> list[dict]:
    """The cases to run, in order: family, model, allocator policy, dtype, batch."""
    out = []
    for family in families:
        for name, batches, shape in FAMILIES[family]:
            for allocator in allocators:
                for dtype in dtypes:
                    for batch in (batches[1:2] if quick else batches):
                        out.append({"family": family, "model": name, "batch": batch,
                                    "dtype": dtype, "allocator": allocator, "shape": shape,
                                    "key": case_key(name, batch, dtype, allocator)})
    return out


def load(path: Path) -> dict:
    if path.exists():
        data = json.loads(path.read_text())
        return {"measured": data.get("measured", {}), "predicted": data.get("predicted", {})}
    return {"measured": {}, "predicted": {}}


def save(path: Path, cache: dict) -> None:
    """Writes the cache, merged with what another run (measuring while this one
    predicts, say) wrote to the same file meanwhile."""
    on_disk = load(path)
    for part in ("measured", "predicted"):
        cache[part] = {**on_disk[part], **cache[part]}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    os.replace(tmp, path)


def runs_of(entry: dict) -> list[int]:
    """Every measurement of a case (older caches hold one, as ``measured``)."""
    if entry.get("status") != "ok":
        return []
    return list(entry.get("runs") or ([entry["measured"]] if entry.get("measured") else []))


def measure(cases: list[dict], cache: dict, path: Path, steps: int, repeats: int = 1) -> None:
    """Measures every case until it has ``repeats`` measurements (each in a fresh child),
    saving after each; a case's ``measured`` is the median of its runs, ``runs`` all of
    them. The cases are taken round by round, so a stopped run leaves every case with as
    many measurements as the others, give or take one."""
    from memfit.estimate.measure import measure_training

    for round_ in range(1, repeats + 1):
        todo = [c for c in cases if len(runs_of(cache["measured"].get(c["key"], {}))) < round_
                and cache["measured"].get(c["key"], {}).get("status", "ok") == "ok"]
        for i, c in enumerate(todo, 1):
            t = time.time()
            # "fixed/onednn-off": the same allocator policy, children without oneDNN.
            os.environ.pop("TF_ENABLE_ONEDNN_OPTS", None)
            if c["allocator"].endswith(ONEDNN_OFF):
                os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
            r = measure_training(f"{MODELS}:{c['model']}", c["batch"], dtype_policy=c["dtype"],
                                 input_shape=c["shape"], steps=steps,
                                 allocator=c["allocator"].removesuffix(ONEDNN_OFF))
            before = runs_of(cache["measured"].get(c["key"], {}))
            runs = [*before, r.measured] if r.status == "ok" and r.measured else before
            cache["measured"][c["key"]] = {
                "status": "ok" if runs else r.status,
                "measured": int(statistics.median(runs)) if runs else r.measured,
                "runs": runs, "family": c["family"], "steps": steps,
                "message": r.message[-500:], "seconds": round(r.seconds, 1),
                "step_peaks": r.report.get("step_peaks")}
            save(path, cache)
            print(f"[round {round_}, {i}/{len(todo)}] measured {c['key']}: {r.status} "
                  f"{(r.measured or 0) / 2**20:.1f} MiB ({time.time() - t:.0f} s)",
                  file=sys.stderr, flush=True)


def predict(cases: list[dict], cache: dict, path: Path) -> None:
    """Predicts every case not in the cache (one trace per model, dtype and policy)."""
    import keras

    from memfit.estimate import Estimator
    from memfit.estimate.schedule import BREADTH_FIRST

    groups: dict = {}
    for c in cases:
        if c["key"] not in cache["predicted"]:
            groups.setdefault((c["model"], c["dtype"], c["allocator"], c["shape"]),
                              []).append(c)
    for (name, dtype, allocator, shape), group in groups.items():
        keras.backend.clear_session()
        t = time.time()
        try:
            est = Estimator(f"{MODELS}:{name}", dtype_policy=dtype, input_shape=shape,
                            allocator=allocator.removesuffix(ONEDNN_OFF),
                            onednn=not allocator.endswith(ONEDNN_OFF))
        except Exception as e:     # noqa: BLE001 -- a model the estimator fails on is a result
            for c in group:
                cache["predicted"][c["key"]] = {"error": f"{type(e).__name__}: {e}"[:500]}
            save(path, cache)
            continue
        for c in group:
            e = est.at(c["batch"])
            cache["predicted"][c["key"]] = {
                "model_bytes": e.model_bytes, "low": e.model_bytes_low,
                "high": e.model_bytes_high, "held": est.held_model_bytes(c["batch"]),
                "features": est.features(c["batch"]),
                "plays": [est.features(c["batch"], g, BREADTH_FIRST)
                          for g in plays_of(c["batch"])]}
        save(path, cache)
        print(f"predicted {name} {dtype} {allocator} ({time.time() - t:.0f} s)",
              file=sys.stderr, flush=True)


def plays_of(batch: int) -> list[int]:
    """The batch sizes of the plays :meth:`memfit.estimate.Estimator.held_model_bytes`
    takes the largest of (each breadth first)."""
    out, g = [], 1
    while g <= batch:
        out, g = [*out, g], g * 2
    return out


def shipped(case: dict) -> dict:
    """The constants the estimator ships for a case's policy, precision and kernels."""
    from memfit.estimate.fitted import FITTED

    policy = case["allocator"]
    kernels = ("tensorflow" if policy.endswith(ONEDNN_OFF)
               else "onednn-16bit" if case["dtype"].startswith("mixed") else "onednn-float32")
    return FITTED[policy.removesuffix(ONEDNN_OFF)][kernels]


def rows_of(cases: list[dict], cache: dict) -> list[dict]:
    """Every case with both a measurement and a prediction: its relative error, with the
    constants the estimator ships now (the cached features and plays, played again
    only with ``--repredict``)."""
    out = []
    for c in cases:
        m, p = cache["measured"].get(c["key"], {}), cache["predicted"].get(c["key"], {})
        if m.get("status") == "ok" and m.get("measured") and "features" in p:
            constants = shipped(c)
            point_ = fitting.predict_from_features(p["features"], constants)
            held_ = max(fitting.predict_from_features(f, constants)
                        for f in p.get("plays") or [p["features"]])
            out.append({**c, "measured": m["measured"], "predicted": point_,
                        "features": p["features"], "plays": p.get("plays"),
                        "spread": spread(runs_of(m)), "runs": runs_of(m),
                        "error": (point_ - m["measured"]) / m["measured"],
                        "ratio": m["measured"] / point_,
                        "ratio_held": m["measured"] / held_})
    return out


def spread(runs: list[int]) -> float | None:
    """``(max - min) / median`` of a case's measurements (``None`` with fewer than 2)."""
    return (max(runs) - min(runs)) / statistics.median(runs) if len(runs) > 1 else None


def batch_answers(cases: list[dict], constants: dict | None, high: float,
                  every_run: bool = False) -> list[dict]:
    """The estimate's largest batch for a budget of each case's measured memory, ÷ that
    case's batch size (the largest batch known to fit that budget): what
    ``Estimator.max_batch_size`` answers, judged on the panel. The high end is known at the
    model's three panel batch sizes; between and beyond them it is taken as linear in
    the batch (the play's buffers are), so this is the estimator's answer to within that
    interpolation (``estimate_vs_search.py`` asks the estimator itself). ``every_run``:
    the budget is the largest of the case's runs instead of their median, so that the
    case's batch is one that fitted in every run (judged against the noise)."""
    models: dict = {}
    for r in cases:
        models.setdefault((r["model"], r["dtype"]), []).append(r)
    out = []
    for rs in models.values():
        rs = sorted(rs, key=lambda r: r["batch"])
        if len(rs) < 2:
            continue
        pts = [(r["batch"], banded(r, held(r, constants), high)) for r in rs]
        for r in rs:
            budget = max(r["runs"] or [r["measured"]]) if every_run else r["measured"]
            out.append({"model": r["model"], "batch": r["batch"], "family": r["family"],
                        "ratio": largest_under(pts, budget) / r["batch"]})
    return out


def slopes(cases: list[dict], constants: dict | None) -> list[float]:
    """Per model (and dtype): the memory a sample adds, measured ÷ predicted, between its
    smallest and largest panel batch sizes. The batch answer is as good as this ratio:
    the fixed part (weights, slots, runtime) is nearly exact, and a budget's batch-
    dependent share is what the estimate divides by the predicted bytes a sample."""
    models: dict = {}
    for r in cases:
        models.setdefault((r["model"], r["dtype"]), []).append(r)
    out = []
    for rs in models.values():
        rs = sorted(rs, key=lambda r: r["batch"])
        lo, hi = rs[0], rs[-1]
        predicted = held(hi, constants) - held(lo, constants)
        if len(rs) > 1 and predicted > 0:
            out.append((hi["measured"] - lo["measured"]) / predicted)
    return out


def largest_under(points: list[tuple[int, float]], budget: float) -> int:
    """The largest whole batch whose high end, linear between ``points`` (and extended
    from the nearest two beyond them), is within ``budget``: 0 when not even 1 is."""
    def at(b: float) -> float:
        i = 1 if b <= points[1][0] or len(points) == 2 else len(points) - 1
        (b0, h0), (b1, h1) = points[i - 1], points[i]
        return h0 + (h1 - h0) * (b - b0) / (b1 - b0)
    if at(1) > budget:
        return 0
    lo, hi = 1, 2
    while at(hi) <= budget and hi < 1 << 24:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid) <= budget else (lo, mid)
    return lo


def band(rows: list[dict], constants: dict | None = None) -> tuple[float, float]:
    """The band these cases need: ``(low, high)``, the smallest ``measured / predicted``
    (the low end scales the point prediction) and the largest ``measured / held`` (the
    high end scales the prediction held non-decreasing in the batch): every case inside.
    With ``constants``, the predictions are made again from each case's features.
    """
    if not rows:
        return 1.0, 1.0
    # The range always holds the point prediction: low <= 1 <= high.
    return (min(1.0, *(scale_of(r, point(r, constants)) for r in rows)),
            max(1.0, *(scale_of(r, held(r, constants)) for r in rows)))


def scale_of(r: dict, predicted: int) -> float:
    """``measured / predicted`` on the part of the estimate that is not exact (weights,
    optimizer slots and the input batch are counted, not predicted): the factor a band
    applies."""
    exact = r["features"]["exact"]
    return (r["measured"] - exact) / (predicted - exact)


def banded(r: dict, predicted: int, factor: float) -> float:
    """``predicted`` with ``factor`` applied to its part that is not exact."""
    exact = r["features"]["exact"]
    return exact + factor * (predicted - exact)


def point(r: dict, constants: dict | None) -> int:
    """The case's point prediction: cached, or from its features under ``constants``."""
    if constants is None:
        return r["predicted"]
    return fitting.predict_from_features(r["features"], constants)


def held(r: dict, constants: dict | None) -> int:
    """The case's prediction held non-decreasing in the batch, under ``constants``."""
    if constants is None:
        return round(r["measured"] / r["ratio_held"])
    plays = r["plays"] or [r["features"]]
    return max(fitting.predict_from_features(f, constants) for f in plays)


def kfold(rows: list[dict], refit: bool = True) -> dict[str, dict]:
    """K-fold by family: for each family, the constants (:func:`estimate_fit.fit`) and the
    band (:func:`band`) chosen on every *other* family, and how they do on this one --
    its relative errors, its cases measured above the high end (where "fits" would have
    invited an out-of-memory) and below the low end. Nothing about a family is chosen
    with its own cases. ``refit=False`` keeps the constants the estimator ships and
    chooses only the band by family (for constants fitted elsewhere)."""
    out = {}
    for family in sorted({r["family"] for r in rows}):
        train = [r for r in rows if r["family"] != family]
        test = [r for r in rows if r["family"] == family]
        c = fitting.fit([(r["features"], r["measured"]) for r in train]) if refit else None
        lo, hi = band(train, c)
        errs = [point(r, c) / r["measured"] - 1 for r in test]
        out[family] = {"constants": c, "low": lo, "high": hi, "cases": len(test),
                       "errors": errs, "answers": batch_answers(test, c, hi),
                       "answers_every_run": batch_answers(test, c, hi, every_run=True),
                       "runs_above_high": [max(r["runs"]) / banded(r, held(r, c), hi) - 1
                                           for r in test if len(r["runs"]) > 1
                                           and max(r["runs"]) > banded(r, held(r, c), hi)],
                       "with_runs": sum(len(r["runs"]) > 1 for r in test),
                       "slopes": slopes(test, c),
                       "above_high": sum(r["measured"] > banded(r, held(r, c), hi)
                                         for r in test),
                       "below_low": sum(r["measured"] < banded(r, point(r, c), lo)
                                        for r in test),
                       "worst_above": max((r["measured"] / banded(r, held(r, c), hi) - 1
                                           for r in test), default=0.0)}
    return out


def _line(rs: list[dict], value: Callable[[dict], float]) -> tuple[float, float]:
    """``(at batch 0, per sample)`` of ``value(r)`` through a model's smallest and largest
    panel batch sizes."""
    lo, hi = rs[0], rs[-1]
    slope = (value(hi) - value(lo)) / (hi["batch"] - lo["batch"])
    return value(lo) - slope * lo["batch"], slope


def parts_lines(rows: list[dict]) -> list[str]:
    """Issue 27's wide MLPs taken apart: per model, what the high end predicts and what
    was measured (beyond the exact weights, slots and input), split into the part at
    batch 0 (runtime, gradients, the optimizer's temporaries: weight-shaped) and the part
    a sample adds, each measured ÷ predicted; constants as shipped, no band."""
    models: dict = {}
    for r in rows:
        models.setdefault((r["model"], r["dtype"]), []).append(r)
    out = ["| model | family | at batch 0: predicted MiB | measured MiB | measured ÷ "
           "predicted | a sample adds: measured ÷ predicted | spread of runs (each batch) |",
           "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    table = []
    for (name, _), rs in models.items():
        rs = sorted(rs, key=lambda r: r["batch"])
        if len(rs) < 2:
            continue
        f_p, s_p = _line(rs, lambda r: held(r, None) - r["features"]["exact"])
        f_m, s_m = _line(rs, lambda r: r["measured"] - r["features"]["exact"])
        table.append((f_m / f_p, name, rs[0]["family"], f_p, f_m, s_m / s_p,
                      [f"{(r['spread'] or 0) * 100:.0f} %" for r in rs]))
    for ratio, name, family, f_p, f_m, slope, spreads in sorted(table, reverse=True):
        out.append(f"| {name} | {family} | {f_p / 2**20:,.1f} | {f_m / 2**20:,.1f} | "
                   f"{ratio:.3f} | {slope:.3f} | {', '.join(spreads)} |")
    return out


def _mean_abs(xs: list[float]) -> float:
    return sum(abs(x) for x in xs) / max(len(xs), 1)


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def report(rows: list[dict], allocator: str, refit: bool = True) -> str:
    """The markdown: a table per family, the per-family summary, the overall figures and
    the band judged out of family."""
    lines = [f"## allocator policy `{allocator}`", ""]
    summary = ["| family | in old panel | cases | mean relative error | under-estimated | "
               "worst case |", "| --- | --- | ---: | ---: | ---: | --- |"]
    families = [f for f in FAMILIES if any(r["family"] == f for r in rows)]
    for family in families:
        fam = [r for r in rows if r["family"] == family]
        lines += [f"### {family}", "", "| model | dtype | batch | predicted MiB | "
                  "measured MiB | error |", "| --- | --- | ---: | ---: | ---: | ---: |"]
        for r in fam:
            lines.append(f"| {r['model']} | {r['dtype']} | {r['batch']} | "
                         f"{r['predicted'] / 2**20:,.1f} | {r['measured'] / 2**20:,.1f} | "
                         f"{_pct(r['error'])} |")
        lines.append("")
        worst = max(fam, key=lambda r: abs(r["error"]))
        summary.append(
            f"| {family} | {'yes' if family in IN_OLD_PANEL else 'no'} | {len(fam)} | "
            f"{_mean_abs([r['error'] for r in fam]) * 100:.1f} % | "
            f"{sum(r['error'] < 0 for r in fam)} of {len(fam)} | "
            f"{_pct(worst['error'])} ({worst['model']} {worst['dtype']} b{worst['batch']}) |")
    errors = [r["error"] for r in rows]
    lines += ["### per family", "", *summary, "",
              f"**{len(rows)} cases: mean relative error {_mean_abs(errors) * 100:.1f} %, "
              f"under-estimated {sum(e < 0 for e in errors)} of {len(rows)} "
              f"({sum(e < 0 for e in errors) / max(len(rows), 1) * 100:.0f} %), from "
              f"{_pct(min(errors, default=0))} to {_pct(max(errors, default=0))}.** "
              f"Families without a model in the old panel: "
              f"{', '.join(f for f in families if f not in IN_OLD_PANEL) or 'none'}.", ""]
    folds = kfold(rows, refit)
    if len(folds) > 1:
        lines += kfold_lines(folds, rows, refit)
    return "\n".join(lines)


def kfold_lines(folds: dict[str, dict], rows: list[dict], refit: bool = True) -> list[str]:
    """The out-of-family table: each family judged by constants and a band chosen on
    the others; then the constants and band chosen on every family (for ``FITTED`` and
    ``BANDS``), with their in-panel figures."""
    chosen = "constants and band" if refit else "band (constants as shipped)"
    lines = [f"### out of family (k-fold by family: {chosen} chosen on the others)",
             "", "| held-out family | cases | mean relative error | under-estimated | "
             "band (× predicted) | above the high end | below the low end | "
             "worst above high | max batch ÷ batch that fits: median (worst) | "
             "memory a sample adds, measured ÷ predicted |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
    for family, f in folds.items():
        ratios = sorted(a["ratio"] for a in f["answers"])
        lines.append(f"| {family} | {f['cases']} | {fitting.mean_abs(f['errors']) * 100:.1f} % | "
                     f"{sum(e < 0 for e in f['errors'])} | {f['low']:.3f} – {f['high']:.3f} | "
                     f"{f['above_high']} | {f['below_low']} | "
                     f"{_pct(max(f['worst_above'], 0.0))} | "
                     f"{statistics.median(ratios) if ratios else float('nan'):.2f} "
                     f"({ratios[0] if ratios else float('nan'):.2f}) | "
                     f"{min(f['slopes'], default=float('nan')):.2f} – "
                     f"{max(f['slopes'], default=float('nan')):.2f} |")
    errs = [e for f in folds.values() for e in f["errors"]]
    answers = sorted(a["ratio"] for f in folds.values() for a in f["answers"])
    spreads = sorted(r["spread"] for r in rows if r.get("spread") is not None)
    n = len(errs)
    above = sum(f["above_high"] for f in folds.values())
    below = sum(f["below_low"] for f in folds.values())
    lines += ["", f"**Out of family, {n} cases: mean relative error "
                  f"{fitting.mean_abs(errs) * 100:.1f} %, under-estimated "
                  f"{sum(e < 0 for e in errs)} ({fitting.under_share(errs) * 100:.1f} %), "
                  f"from {_pct(min(errs))} to {_pct(max(errs))}; {above} cases "
                  f"({above / max(n, 1) * 100:.1f} %) measured above the high end (where "
                  f"\"fits\" would have invited an out-of-memory), {below} below the low "
                  f"end.** Measurement spread ((max - min) / median of each case's runs): "
                  + (f"median {statistics.median(spreads) * 100:.1f} %, largest "
                     f"{spreads[-1] * 100:.1f} % over {len(spreads)} cases measured more "
                     f"than once." if spreads else "no case measured more than once.")
                  + (f" The estimate's largest batch for a budget of a case's measured "
                     f"memory ÷ that case's batch: median {statistics.median(answers):.2f}, "
                     f"10th percentile {answers[len(answers) // 10]:.2f}, worst "
                     f"{answers[0]:.2f}; above 1 in {sum(a > 1 for a in answers)} of "
                     f"{len(answers)}; 0 in {sum(a == 0 for a in answers)}."
                     if answers else ""), ""]
    with_runs = sum(f["with_runs"] for f in folds.values())
    if with_runs:
        over = sorted(x for f in folds.values() for x in f["runs_above_high"])
        every = sorted(a["ratio"] for f in folds.values() for a in f["answers_every_run"])
        lines += [f"**Judged run by run** ({with_runs} cases measured more than once): "
                  f"{len(over)} have a run above the high end"
                  + (f" (by {_pct(over[0])} to {_pct(over[-1])})" if over else "")
                  + f". With the budget at the largest of a case's runs (its batch fitted in "
                  f"every run), the largest batch ÷ that batch: median "
                  f"{statistics.median(every):.2f}, 0 in {sum(a == 0 for a in every)} of "
                  f"{len(every)}.", ""]
    if not refit:
        lo, hi = band(rows)
        return [*lines, f"The shipped constants, band on every family (for `BANDS`): "
                        f"{lo:.4f} – {hi:.4f}.", ""]
    c = fitting.fit([(r["features"], r["measured"]) for r in rows])
    lo, hi = band(rows, c)
    every = [point(r, c) / r["measured"] - 1 for r in rows]
    shown = {k: round(v, 6) if k in ("heap", "mmap", "pool", "margin") else round(v)
             for k, v in c.items()}
    lines += [f"Chosen on every family (in panel, not a result): constants {shown} "
              f"(`FITTED`), band {lo:.4f} – {hi:.4f} (`BANDS`); in-panel mean relative "
              f"error {fitting.mean_abs(every) * 100:.1f} %, under-estimated "
              f"{fitting.under_share(every) * 100:.1f} %.", ""]
    return lines


def main() -> None:
    from memfit.estimate.measure import DEFAULT_STEPS

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                   help=f"the JSON of every case (default: {DEFAULT_CACHE.name})")
    p.add_argument("--families", help=f"comma-separated, of: {', '.join(FAMILIES)}")
    p.add_argument("--policy", default="fixed,default",
                   help="allocator policies, comma-separated (default: fixed,default); "
                        f"a policy ending in {ONEDNN_OFF} measures without oneDNN")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--quick", action="store_true", help="one batch size (the middle one)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    p.add_argument("--repeat", type=int, default=1,
                   help="measurements per case, each in a fresh child (the median is the "
                        "case's truth, the spread is reported beside every error)")
    p.add_argument("--measure-only", action="store_true", help="measure, do not predict")
    p.add_argument("--report-only", action="store_true",
                   help="no measuring: predict and report what the cache holds")
    p.add_argument("--shipped-constants", action="store_true",
                   help="judge the constants the estimator ships (fitted elsewhere); only the "
                        "band is chosen by family")
    p.add_argument("--parts", action="store_true",
                   help="with --report-only: per model, the part at batch 0 and the part a "
                        "sample adds, measured ÷ predicted (issue 27's wide MLPs taken apart)")
    p.add_argument("--repredict", action="store_true",
                   help="drop the cached predictions of these cases and play them again")
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    families = args.families.split(",") if args.families else list(FAMILIES)
    unknown = set(families) - set(FAMILIES)
    if unknown:
        sys.exit(f"unknown families: {', '.join(sorted(unknown))}")
    dtypes = args.dtypes.split(",")
    allocators = args.policy.split(",")
    with_onednn = [a for a in allocators if not a.endswith(ONEDNN_OFF)]
    if with_onednn and not args.report_only:
        from memfit.estimate.training import onednn_enabled

        if not onednn_enabled():
            # The children would run TensorFlow's own kernels (this CPU, or the environment,
            # turns oneDNN off) and be judged against oneDNN's estimate.
            sys.exit(f"TensorFlow runs without oneDNN's kernels here (its choice on this CPU, "
                     f"or TF_ENABLE_ONEDNN_OPTS=0), so --policy {','.join(with_onednn)} would "
                     f"measure TensorFlow's kernels against oneDNN's estimate: use "
                     f"--policy {','.join(a + ONEDNN_OFF for a in with_onednn)}")
    cases = select(families, dtypes, allocators, args.quick)
    cache = load(args.cache)
    if args.repredict:
        for c in cases:
            cache["predicted"].pop(c["key"], None)
    if not args.report_only:
        measure(cases, cache, args.cache, args.steps, args.repeat)
    if args.measure_only:
        return
    predict([c for c in cases if c["key"] in cache["measured"]], cache, args.cache)
    for allocator in allocators:
        rows = rows_of([c for c in cases if c["allocator"] == allocator], cache)
        if rows and args.parts:
            print("\n".join(parts_lines(rows)))
        elif rows:
            print(report(rows, allocator, refit=not args.shipped_constants))


if __name__ == "__main__":
    main()
