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
a batch that does not fit: counted too), stopping where the peaks put the next batch over
the budget (the default) and, in brackets, proving the edge with a child (``prove=True``).

``--replay`` replays the family panel's 22 recorded searches instead
(``estimate_vs_search.json``, ``estimate_vs_search_estimates.json``): each case's peak is a
line through its recorded fitted peaks (or, where they span less than 15 % of the batch,
the slope of the panel's medians at the batch sizes around the edge), placed so that the
budget is crossed halfway between the largest batch that fitted and the smallest that
failed. Each child adds run-to-run noise: normal, with the spread of the case's three
panel runs at the batch size nearest the edge, and one time in 20 a jump up drawn from
the panel's deviations over 3 %. A child fails when its noisy peak passes the budget, so
the same batch may fit once and fail the next time, as real children do. The search
starts from the estimate's safe end with its bytes a sample for that case (as the
estimator now gives them: ``--estimates`` computes them again, ~15 min). An answer is
within 3 % when it is at least the edge ÷ 1.03 (or one sample below it). Nothing here
was chosen on the held-out models (``estimate_vs_search_holdout.json``).

    PYTHONPATH=src .venv/bin/python benchmarks/search_simulation.py
    PYTHONPATH=src .venv/bin/python benchmarks/search_simulation.py --replay
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path

from memfit.estimate.measure import ChildResult
from memfit.estimate.search import _Search

MIB = 2**20
HERE = Path(__file__).resolve()
SEARCHES = HERE.with_name("estimate_vs_search.json")
ESTIMATES = HERE.with_name("estimate_vs_search_estimates.json")
PANEL = HERE.with_name("estimate_families.json")
ROWS = [(1.0, 5), (1.3, 5), (3, 5), (10, 20), (30, 5), (30, 50), (30, 100), (0.3, 5)]


def one(rng: random.Random, scale: float, noise: float,
        infer: bool = True) -> tuple[_Search, int]:
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
    search.infer = infer
    search.secant(1, budget, per * scale, 0.03, 1.25)
    search.bisect(0.03)
    return search, truth


def panel_cases() -> list[dict]:
    """Each recorded panel search as a replayable case (see the module's docstring)."""
    sys.path.insert(0, str(HERE.parent))
    from estimate_vs_search import panel_case

    searches = json.loads(SEARCHES.read_text())
    estimates = json.loads(ESTIMATES.read_text())
    measured = json.loads(PANEL.read_text())["measured"]
    cases = []
    for key, est in estimates.items():
        name, policy = key.split("|")
        s = searches[key]
        fit = sorted((b, q) for b, ok, q in s["trials"] if ok)
        lo, hi = fit[-1][0], s["smallest_failing"]
        family, _, _ = panel_case(name)
        batches = next(bs for m, bs, _ in _family_models(family) if m == name)
        runs = {b: measured[f"{name}|{b}|float32|{policy}"].get("runs")
                or [measured[f"{name}|{b}|float32|{policy}"]["measured"]] for b in batches}
        med = {b: statistics.median(r) for b, r in runs.items()}
        if fit[-1][0] - fit[0][0] >= 0.15 * fit[-1][0]:
            xs, ys = [b for b, _ in fit], [q for _, q in fit]
            mx, my = statistics.mean(xs), statistics.mean(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
                (x - mx) ** 2 for x in xs)
        else:
            a, b = batches[:2] if lo <= batches[1] else batches[1:]
            slope = (med[b] - med[a]) / (b - a)
        slope = max(slope, 0.02 * MIB)
        near = min(batches, key=lambda b: abs(b - lo))
        sigma = max(0.003, statistics.pstdev(r / med[near] - 1 for r in runs[near]))
        edge = (lo + hi) / 2
        cases.append({"key": key, "budget": s["budget"], "slope": slope, "edge": edge,
                      "base": s["budget"] - slope * edge, "sigma": sigma, "memory": med[near],
                      "start": est["max"], "est_slope": est["bps"]})
    return cases


def _family_models(family: str) -> list:
    from estimate_family_models import FAMILIES

    return FAMILIES[family]


def _jumps() -> list[float]:
    """The panel's run-to-run deviations over 3 % (relative to each case's median)."""
    out = []
    for m in json.loads(PANEL.read_text())["measured"].values():
        r = m.get("runs") or []
        if len(r) >= 3:
            med = statistics.median(r)
            out += [abs(x / med - 1) for x in r if abs(x / med - 1) > 0.03]
    return out


def replay(case: dict, rng: random.Random, jumps: list[float], infer: bool) -> _Search:
    """One search of a replayed panel case."""
    def measure(b: int) -> ChildResult:
        noise = rng.gauss(0, case["sigma"]) * case["memory"]
        if rng.random() < 0.05:
            noise += rng.choice(jumps) * case["memory"]
        q = case["base"] + case["slope"] * b + noise
        if q > case["budget"]:
            return ChildResult("over-budget", peak=case["budget"] + MIB // 4)
        return ChildResult("ok", measured=int(q - case["base"]), peak=int(q))

    search = _Search(measure, 12, None)
    search.infer = infer
    search.secant(max(1, case["start"]), case["budget"], case["est_slope"], 0.03, 1.25)
    search.bisect(0.03)
    return search


def main_replay(n: int = 200) -> None:
    jumps = _jumps()
    print("| case | noise ÷ what a sample adds at the edge | children, prove: mean, median "
          "| within 3 % | children, stop on the peaks: mean, median | within 3 % |")
    print("|---|---:|---|---:|---|---:|")
    total: dict = {True: [], False: []}
    cases = panel_cases()
    for case in cases:
        cells = []
        for infer in (False, True):
            rng = random.Random(case["key"])
            counts, within = [], 0
            for _ in range(n):
                s = replay(case, rng, jumps, infer)
                counts.append(len(s.trials))
                edge = int(case["edge"])
                within += s.lo >= min(edge / 1.03, edge - 1)
            total[infer].append((counts, within))
            cells.append(f"{statistics.mean(counts):.1f}, {statistics.median(counts):.0f} "
                         f"| {within / n:.0%}")
        noise = case["sigma"] * case["memory"] / case["slope"] / case["edge"]
        print(f"| {case['key']} | {noise:.1%} of the edge | {' | '.join(cells)} |")
    for policy in ("fixed", "default"):
        for infer in (False, True):
            rows = [r for r, c in zip(total[infer], cases, strict=True)
                    if c["key"].endswith(policy)]
            counts = [x for c, _ in rows for x in c]
            medians = [statistics.median(c) for c, _ in rows]
            print(f"\n{policy}, {'stopping on the peaks' if infer else 'proving the edge'}: "
                  f"children mean {statistics.mean(counts):.2f}, median "
                  f"{statistics.median(counts):.0f}"
                  f"; the median of the {len(rows)} cases' medians {statistics.median(medians)}"
                  f"; within 3 % {sum(w for _, w in rows) / len(counts):.0%}.")


def main() -> None:
    print("| estimate's bytes a sample ÷ real | peak noise | children, median (max): "
          "stopping on the peaks [proving the edge] | within 3 % of 200 | answers that do "
          "not fit |")
    print("|---|---|---|---|---|")
    for scale, noise in ROWS:
        cells = []
        for infer in (True, False):
            rng = random.Random(5)
            counts, within, wrong = [], 0, 0
            for _ in range(200):
                s, truth = one(rng, scale, noise, infer)
                counts.append(len(s.trials))
                wrong += not 0 < s.lo <= truth
                within += 0 < s.lo <= truth and (
                    (truth - s.lo) / s.lo <= 0.03 or truth - s.lo <= 1)
            cells.append((f"{statistics.median(counts):.0f} ({max(counts)})", within, wrong))
        (c, w, x), (pc, pw, px) = cells
        print(f"| {scale}× | ±{noise} MiB | {c} [{pc}] | {w} [{pw}] | {x} [{px}] |")


def estimates() -> None:
    """Writes each panel search's estimate (its safe end and bytes a sample) as the
    estimator now gives them for that search's model budget."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, str(HERE.parent))
    import estimate_vs_search as evs
    import keras

    from memfit.estimate.estimator import estimator_for
    from memfit.estimate.model import ModelSpec

    searches = json.loads(SEARCHES.read_text())
    measured = json.loads(PANEL.read_text())["measured"]
    out = {}
    for policy in ("fixed", "default"):
        for name in evs.SELECTION:
            keras.backend.clear_session()
            s = searches[f"{name}|{policy}"]
            _, _, shape = evs.panel_case(name)
            est = estimator_for(ModelSpec(evs.source(name), shape), optimizer=None,
                                dtype_policy=None, input_shape=shape, device="cpu",
                                allocator=policy)
            e = est.at(1, budget=evs.model_budget(s, measured, name, policy) + est.baseline)
            b = max(1, e.max_batch_size or 1)
            out[f"{name}|{policy}"] = {"max": e.max_batch_size,
                                       "bps": (est.total(2 * b) - est.total(b)) / b}
    tmp = ESTIMATES.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1, sort_keys=True))
    os.replace(tmp, ESTIMATES)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replay", action="store_true", help="replay the panel's searches")
    ap.add_argument("--estimates", action="store_true",
                    help="compute the panel's estimates the replay starts from (~10 min)")
    args = ap.parse_args()
    if args.estimates:
        estimates()
    main_replay() if args.replay else main()
