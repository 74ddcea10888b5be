"""The JAX estimate, held out by family: XLA's memory analysis vs measured RSS on the CPU.

The family panel (``benchmarks/estimate_family_models.py``), Keras on the JAX backend,
float32, Adam, MSE loss, the smallest and the largest batch of each model. Each case
gets XLA's terms from :class:`memfit.estimate.xla.XlaEstimator` (arguments, new outputs,
temporaries, total, and the bytes known exactly: weights, slots, the batch) and is
measured ``--repeats`` times by :func:`memfit.estimate.measure.measure_training` (peak
anonymous RSS over the JAX baseline, 4 steps). Every case is cached in a JSON file
(``--cache``) as soon as it is measured, so a run resumes where it stopped. The smaller
batch of every model is measured first, then the larger, so a cut-off (``--minutes``)
leaves every family covered.

    KERAS_BACKEND=jax .venv/bin/python benchmarks/estimate_jax_families.py
    KERAS_BACKEND=jax .venv/bin/python benchmarks/estimate_jax_families.py --report-only

Then a CPU model with three constants, fitted by least squares on relative error,

    measured ≈ a × (temporaries + new outputs) + b × exact + c

and a band (the extremes of ``measured / predicted`` on the part that is not exact),
judged k-fold by family (constants and band chosen on the other families only), and
the constants chosen on every family (in panel, not a result).
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
DEFAULT_CACHE = HERE.with_name("estimate_jax_families.json")
MIB = 2**20

sys.path.insert(0, str(HERE.parent))
from estimate_family_models import FAMILIES  # noqa: E402


def cases_in_order() -> list[dict]:
    """Every case: the smallest batch of every model first, then the largest."""
    out = []
    for phase, pick in (("small", min), ("large", max)):
        for family, models in FAMILIES.items():
            for name, batches, shape in models:
                b = pick(batches)
                out.append({"family": family, "model": name, "batch": b, "shape": shape,
                            "phase": phase, "key": f"{name}|{b}"})
    return out


def load(path: Path) -> dict:
    if path.exists():
        data = json.loads(path.read_text())
        return {"predicted": data.get("predicted", {}), "measured": data.get("measured", {})}
    return {"predicted": {}, "measured": {}}


def save(path: Path, cache: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    os.replace(tmp, path)


def predict_model(name: str, shape, batches: list[int]) -> dict[int, dict]:
    """XLA's terms of ``name`` at each of ``batches`` (one estimator)."""
    import keras

    from memfit.estimate.xla import XlaEstimator

    keras.backend.clear_session()
    try:
        est = XlaEstimator(f"{MODELS}:{name}", optimizer="adam", dtype_policy="float32",
                           input_shape=shape, device="cpu")
        out = {}
        for b in batches:
            s = est.step(b)
            out[b] = {**s.to_json(), "exact": est.exact(b), "model_bytes": est.model_bytes(b),
                      "weights": est.weights, "slots": est.slots,
                      "input_batch": est.per_sample_input * b,
                      "variables": len(est.setup.model.weights)}
        return out
    except Exception as e:     # noqa: BLE001 -- a model the estimator fails on is a result
        return {b: {"error": f"{type(e).__name__}: {str(e)[:400]}"} for b in batches}


def program_size(name: str, shape, batch: int) -> dict:
    """The size of the compiled training step at ``batch``: HLO instructions after XLA's
    optimisation (the compiler's work: what its transient host memory follows), as the
    estimator counts them (:attr:`memfit.estimate.xla.XlaStep.instructions`)."""
    import keras

    from memfit.estimate.xla import XlaEstimator

    keras.backend.clear_session()
    est = XlaEstimator(f"{MODELS}:{name}", optimizer="adam", dtype_policy="float32",
                       input_shape=shape, device="cpu")
    return {"hlo_instructions": est.step(batch).instructions}


def add_program_sizes(cache: dict, path: Path) -> None:
    """Adds :func:`program_size` (at the smaller batch) to every model's cases."""
    for family, models in FAMILIES.items():
        for name, batches, shape in models:
            keys = [f"{name}|{b}" for b in (min(batches), max(batches))]
            if all("hlo_instructions" in cache["predicted"].get(k, {"hlo_instructions": 0})
                   for k in keys):
                continue
            t = time.time()
            try:
                size = program_size(name, shape, min(batches))
            except Exception as e:     # noqa: BLE001
                size = {"program_error": f"{type(e).__name__}: {str(e)[:300]}"}
            for k in keys:
                if k in cache["predicted"]:
                    cache["predicted"][k].update(size)
            save(path, cache)
            print(f"program size {family} {name}: {size} ({time.time() - t:.0f} s)",
                  file=sys.stderr, flush=True)


def measure_case(c: dict, repeats: int, steps: int) -> dict:
    from memfit.estimate.measure import measure_training

    runs = []
    for _ in range(repeats):
        r = measure_training(f"{MODELS}:{c['model']}", c["batch"], dtype_policy="float32",
                             optimizer="adam", input_shape=c["shape"], steps=steps)
        rep = r.report
        runs.append({"status": r.status, "measured": r.measured, "seconds": round(r.seconds, 1),
                     "message": r.message[-500:], "step_peaks": rep.get("step_peaks"),
                     "baseline_anon": rep.get("baseline_anon"),
                     "compiled_anon": rep.get("compiled_anon"),
                     "first_step_anon": rep.get("first_step_anon"),
                     "after_anon": rep.get("after_anon")})
        if r.status != "ok":
            break
    ok = [x["measured"] for x in runs if x["status"] == "ok" and x["measured"]]
    return {"family": c["family"], "runs": runs,
            "status": "ok" if ok and len(ok) == len(runs) else runs[-1]["status"],
            "median": statistics.median(ok) if ok else None,
            "spread": (max(ok) - min(ok)) / statistics.median(ok) if ok else None}


def run(cache: dict, path: Path, minutes: float, repeats: int, steps: int) -> None:
    start = time.time()
    cases = cases_in_order()
    batches_of = {}
    for c in cases:
        batches_of.setdefault(c["model"], []).append(c["batch"])
    todo = [c for c in cases if c["key"] not in cache["measured"]]
    for i, c in enumerate(todo, 1):
        if time.time() - start > minutes * 60:
            print(f"time box of {minutes:g} min reached: {len(todo) - i + 1} cases left",
                  file=sys.stderr, flush=True)
            return
        t = time.time()
        if c["key"] not in cache["predicted"]:
            for b, p in predict_model(c["model"], c["shape"], batches_of[c["model"]]).items():
                cache["predicted"][f"{c['model']}|{b}"] = p
            save(path, cache)
        p = cache["predicted"][c["key"]]
        if "error" in p:
            cache["measured"][c["key"]] = {"family": c["family"], "status": "skipped",
                                           "runs": []}
            save(path, cache)
            print(f"[{i}/{len(todo)}] {c['key']}: estimator failed: {p['error'][:120]}",
                  file=sys.stderr, flush=True)
            continue
        m = measure_case(c, repeats, steps)
        cache["measured"][c["key"]] = m
        save(path, cache)
        print(f"[{i}/{len(todo)}] {c['family']} {c['key']}: {m['status']} measured "
              f"{(m['median'] or 0) / MIB:,.1f} MiB (spread {(m['spread'] or 0) * 100:.1f} %), "
              f"XLA total {p['total'] / MIB:,.1f} MiB, temporaries "
              f"{p['temporaries'] / MIB:,.1f} MiB ({time.time() - t:.0f} s)",
              file=sys.stderr, flush=True)


# -- the CPU models ----------------------------------------------------------------------

def rows_of(cache: dict) -> list[dict]:
    out = []
    for c in cases_in_order():
        m, p = cache["measured"].get(c["key"]), cache["predicted"].get(c["key"])
        if m and p and m.get("status") == "ok" and "error" not in p:
            out.append({**c, "measured": m["median"], "spread": m["spread"],
                        "temp": p["temporaries"] + p["new_outputs"], "exact": p["exact"],
                        "hlo": p.get("hlo_instructions"), "xla_total": p["total"],
                        "xla": p["model_bytes"]})
    return out


#: Each CPU model: its fitted terms, and whether ``exact`` is counted once (fixed, not
#: fitted). ``one`` is the constant (bytes), ``hlo`` the compiled step's HLO instructions.
MODELS_OF_CPU = {
    "A": {"terms": ("temp", "exact", "one"), "fixed_exact": False,
          "formula": "a × (temporaries + new outputs) + b × exact + c"},
    "B": {"terms": ("temp", "hlo", "one"), "fixed_exact": True,
          "formula": "exact + a × (temporaries + new outputs) + k × HLO instructions + c"},
}


def feature(r: dict, t: str) -> float:
    return 1.0 if t == "one" else float(r[t])


def fit(rows: list[dict], model: str) -> dict:
    """Non-negative least squares on relative error of the model's terms."""
    import numpy as np
    from scipy.optimize import nnls

    spec = MODELS_OF_CPU[model]
    fixed = [r["exact"] if spec["fixed_exact"] else 0 for r in rows]
    a = np.array([[feature(r, t) / r["measured"] for t in spec["terms"]] for r in rows])
    b = np.array([(r["measured"] - f) / r["measured"] for r, f in zip(rows, fixed, strict=True)])
    coef, _ = nnls(a, b)
    c = dict(zip(spec["terms"], (float(x) for x in coef), strict=True))
    return {"model": model, **c, **({"exact": 1.0} if spec["fixed_exact"] else {})}


def point(r: dict, c: dict) -> float:
    return sum(v * feature(r, t) for t, v in c.items() if t != "model")


def exact_of(r: dict, c: dict) -> float:
    return c["exact"] * r["exact"]


def scale(r: dict, c: dict) -> float:
    """``measured / predicted`` on the part that is not exact."""
    return (r["measured"] - exact_of(r, c)) / (point(r, c) - exact_of(r, c))


def banded(r: dict, c: dict, f: float) -> float:
    return exact_of(r, c) + f * (point(r, c) - exact_of(r, c))


def band(rows: list[dict], c: dict) -> tuple[float, float]:
    return (min(1.0, *(scale(r, c) for r in rows)), max(1.0, *(scale(r, c) for r in rows)))


def judge(test: list[dict], c: dict, lo: float, hi: float) -> dict:
    errs = [point(r, c) / r["measured"] - 1 for r in test]
    return {"cases": len(test), "errors": errs,
            "mean": sum(map(abs, errs)) / max(len(errs), 1),
            "under": sum(e < 0 for e in errs),
            "above_high": sum(r["measured"] > banded(r, c, hi) for r in test),
            "below_low": sum(r["measured"] < banded(r, c, lo) for r in test),
            "worst_above": max((r["measured"] / banded(r, c, hi) - 1 for r in test),
                               default=0.0)}


def kfold(rows: list[dict], model: str) -> dict[str, dict]:
    out = {}
    for family in [f for f in FAMILIES if any(r["family"] == f for r in rows)]:
        train = [r for r in rows if r["family"] != family]
        c = fit(train, model)
        lo, hi = band(train, c)
        out[family] = {"constants": c, "low": lo, "high": hi,
                       **judge([r for r in rows if r["family"] == family], c, lo, hi)}
    return out


def _c(c: dict) -> str:
    if c["model"] == "A":
        return f"a={c['temp']:.3f}, b={c['exact']:.3f}, c={c['one'] / MIB:.1f} MiB"
    return (f"a={c['temp']:.3f}, k={c['hlo'] / 1024:.1f} KiB/instr, "
            f"c={c['one'] / MIB:.1f} MiB")


def kfold_lines(rows: list[dict], model: str) -> list[str]:
    folds = kfold(rows, model)
    lines = [f"## Model {model}, out of family (k-fold by family: constants and band chosen "
             f"on the others)", "", f"measured ≈ {MODELS_OF_CPU[model]['formula']}", "",
             "| held-out family | cases | constants (other families) | mean relative error "
             "| under-estimated | band (× non-exact part) | above the high end | below the "
             "low end | worst above high |",
             "| --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for family, f in folds.items():
        lines.append(f"| {family} | {f['cases']} | {_c(f['constants'])} | "
                     f"{f['mean'] * 100:.1f} % | {f['under']} | {f['low']:.3f} – "
                     f"{f['high']:.3f} | {f['above_high']} | {f['below_low']} | "
                     f"{max(f['worst_above'], 0) * 100:+.1f} % |")
    errs = [e for f in folds.values() for e in f["errors"]]
    n = len(errs)
    above = sum(f["above_high"] for f in folds.values())
    below = sum(f["below_low"] for f in folds.values())
    lines += ["", f"**Model {model} out of family, {n} cases: mean relative error "
                  f"{sum(map(abs, errs)) / n * 100:.1f} %, under-estimated "
                  f"{sum(e < 0 for e in errs)} ({sum(e < 0 for e in errs) / n * 100:.0f} %), "
                  f"from {min(errs) * 100:+.1f} % to {max(errs) * 100:+.1f} %; {above} cases "
                  f"above the high end, {below} below the low end.**", ""]
    c = fit(rows, model)
    lo, hi = band(rows, c)
    j = judge(rows, c, lo, hi)
    lines += [f"Model {model} chosen on every family (in panel, not a result): {_c(c)}; "
              f"band {lo:.3f} – {hi:.3f}; in-panel mean relative error "
              f"{j['mean'] * 100:.1f} %, under-estimated {j['under']} of {len(rows)}.", ""]
    return lines


def report(cache: dict) -> str:
    rows = rows_of(cache)
    total = len(cases_in_order())
    failed = sorted({k.split("|")[0]: v["error"] for k, v in cache["predicted"].items()
                     if "error" in v}.items())
    not_ok = {k: v for k, v in cache["measured"].items()
              if v.get("status") not in ("ok", "skipped")}
    lines = ["# The JAX estimate on the family panel (CPU, float32, Adam)", "",
             f"{len(rows)} of the panel's {total} cases (34 models × smallest and largest "
             f"batch) measured and estimated; {len(failed)} models failed in the "
             f"estimator, {len(not_ok)} cases failed to measure.", ""]
    for name, err in failed:
        lines.append(f"- estimator failed on `{name}`: {err.splitlines()[-1][:200]}")
    for key, v in not_ok.items():
        lines.append(f"- measuring `{key}`: {v.get('status')}: "
                     f"{(v['runs'][-1]['message'] if v.get('runs') else '')[-200:]}")
    lines += ["", "## Every case (MiB)", "",
              "| family | model | batch | arguments | new outputs | temporaries | XLA total "
              "| exact | HLO instr. | measured (median of 2) | spread | measured − XLA "
              "total | measured ÷ XLA |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
              "| ---: | ---: |"]
    for r in sorted(rows, key=lambda r: (list(FAMILIES).index(r["family"]), r["model"],
                                         r["batch"])):
        p = cache["predicted"][r["key"]]
        lines.append(f"| {r['family']} | {r['model']} | {r['batch']} | "
                     f"{p['arguments'] / MIB:,.1f} | {p['new_outputs'] / MIB:,.2f} | "
                     f"{p['temporaries'] / MIB:,.1f} | {p['total'] / MIB:,.1f} | "
                     f"{p['exact'] / MIB:,.1f} | {r['hlo'] or '-'} | "
                     f"{r['measured'] / MIB:,.1f} | {r['spread'] * 100:.1f} % | "
                     f"{(r['measured'] - r['xla']) / MIB:,.1f} | "
                     f"{r['measured'] / r['xla']:.2f} |")
    if not rows:
        return "\n".join(lines)
    xla_err = [r["xla"] / r["measured"] - 1 for r in rows]
    lines += ["", f"XLA's point as shipped (`model_bytes`, no CPU constants): mean relative "
                  f"error {sum(map(abs, xla_err)) / len(rows) * 100:.1f} %, under-estimated "
                  f"{sum(e < 0 for e in xla_err)} of {len(rows)}; measurement spread "
                  f"(max−min)/median: median "
                  f"{statistics.median(r['spread'] for r in rows) * 100:.1f} %, max "
                  f"{max(r['spread'] for r in rows) * 100:.1f} %.", ""]
    lines += kfold_lines(rows, "A")
    if all(r["hlo"] for r in rows):
        lines += kfold_lines(rows, "B")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--minutes", type=float, default=45.0,
                   help="stop measuring after this many minutes (default 45)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--program-sizes", action="store_true",
                   help="add each model's compiled program size to the cache (no measuring)")
    p.add_argument("--out", type=Path, help="also write the markdown here")
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if os.environ.get("KERAS_BACKEND") != "jax":
        sys.exit("set KERAS_BACKEND=jax")
    cache = load(args.cache)
    if args.program_sizes:
        add_program_sizes(cache, args.cache)
    elif not args.report_only:
        run(cache, args.cache, args.minutes, args.repeats, args.steps)
    text = report(cache)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
