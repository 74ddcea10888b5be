"""The estimate's range, and a verdict on a budget that never invites an out-of-memory.

The estimator's point prediction (``model_bytes``) errs both ways on architectures its
constants were not fitted on (docs/estimate.md, "Out of family": measured k-fold by
family). So an estimate carries a **range** per allocator policy and kernels: ``low``
and ``high`` scale the part of the point prediction that is predicted -- not the
weights, optimizer slots and input batch, which are counted exactly (:func:`banded`) --
by the extremes of ``measured / predicted`` of that part on the family panel
(``benchmarks/estimate_families.py``), and the high end is taken from a prediction that
never falls as the batch grows (:meth:`memfit.estimate.estimator.Estimator.high`).

A budget then gets one of three answers (:func:`verdict`):

* ``"fits"``: the high end fits;
* ``"does not fit"``: not even the low end fits;
* ``"uncertain"``: the budget lies inside the range: only real steps can tell
  (``memfit find-batch-size``).

Example:
    >>> verdict(low=80, high=130, budget=150), verdict(low=80, high=130, budget=100)
    ('fits', 'uncertain')
    >>> verdict(low=80, high=130, budget=70)
    'does not fit'
    >>> BANDS["fixed"]["onednn-float32"]["low"] < 1 <= BANDS["fixed"]["onednn-float32"]["high"]
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["BANDS", "FITS", "DOES_NOT_FIT", "UNCERTAIN", "verdict", "banded",
           "largest_batch", "MAX_BATCH"]

#: The largest batch size an estimate answers.
MAX_BATCH = 1 << 24

FITS = "fits"
DOES_NOT_FIT = "does not fit"
UNCERTAIN = "uncertain"

#: Per allocator policy and kernels (:data:`~memfit.estimate.training.KERNELS`):
#: the range of ``measured / predicted`` the estimate carries on its predicted part (not
#: the weights, slots and input batch: :func:`banded`), ``low`` on the point prediction and
#: ``high`` on the prediction held non-decreasing in the batch size. Chosen as the smallest
#: and largest such ratio over every case of the family panel, with the point inside
#: (``benchmarks/estimate_families.py``, the line "Chosen on every family"); how a band
#: chosen so does on a family it was not chosen on is the k-fold-by-family table of the
#: same run (docs/estimate.md, "Out of family").
BANDS: dict[str, dict[str, dict[str, float]]] = {
    # Rounded outward from the extremes on 102 cases each, with the margin-free constants
    # of FITTED, the point played depth first and the high end breadth first (the lines
    # "Chosen on every family", 2026-12-06: 0.7899 - 1.1489, 0.7262 - 1.1810;
    # TensorFlow's kernels, their constants as shipped: 0.6959 - 1.2774 before the
    # depth-first play).
    "fixed": {"onednn-float32": {"low": 0.78, "high": 1.15},
              "onednn-16bit": {"low": 0.72, "high": 1.19},
              "tensorflow": {"low": 0.69, "high": 1.28}},
    # 0.8016 - 1.2793 and 0.7124 - 1.2756. TensorFlow's kernels: 0.5960 - 1.3816 on the
    # panel's 102 float32 cases measured 2026-12-06 on an AMD EPYC where TensorFlow runs
    # without oneDNN (its constants as shipped; the band before, 0.42 - 1.31, was not
    # measured on the panel, and one case passed its high end by 3.9 %).
    "default": {"onednn-float32": {"low": 0.80, "high": 1.28},
                "onednn-16bit": {"low": 0.71, "high": 1.28},
                "tensorflow": {"low": 0.59, "high": 1.39}},
}


def banded(predicted: int, exact: int, factor: float) -> int:
    """``predicted`` with ``factor`` applied to its part that is not ``exact`` (weights,
    optimizer slots, the input batch and the pipeline budget are counted, not predicted:
    the band does not widen them), rounded away from the prediction (a low end down, a
    high end up), so the range never narrows by rounding.

    Example:
        >>> banded(100, 40, 1.5), banded(100, 40, 0.5)
        (130, 70)
        >>> banded(100, 0, 1.005), banded(100, 0, 0.995)
        (101, 99)

    Args:
        predicted: bytes, the point prediction (or the one held non-decreasing).
        exact: the bytes of it that are counted exactly.
        factor: the band's ``low`` or ``high``.
    """
    value = exact + factor * (predicted - exact)
    return math.ceil(value) if factor >= 1 else math.floor(value)


def verdict(*, low: int, high: int, budget: int) -> str:
    """``"fits"`` when ``high`` fits ``budget``, ``"does not fit"`` when ``low`` does not,
    else ``"uncertain"``.

    Example:
        >>> verdict(low=1, high=2, budget=2)
        'fits'

    Args:
        low: the low end of the estimate's total, in bytes.
        high: its high end.
        budget: the memory available, in bytes.
    """
    if high <= budget:
        return FITS
    if low > budget:
        return DOES_NOT_FIT
    return UNCERTAIN


def largest_batch(high: Callable[[int], int], budget: int, *,
                  interpolate: bool = False) -> int:
    """The largest batch size ``b`` with ``high(b) <= budget`` (0 when not even 1 fits, at
    most :data:`MAX_BATCH`), by doubling and bisection: exact where ``high`` never falls
    as the batch grows (the TensorFlow estimator holds it so; XLA's temporaries grow with
    the batch).

    Example:
        >>> largest_batch(lambda b: 100 + 10 * b, 1000)
        90
        >>> largest_batch(lambda b: 100 + 10 * b, 50)
        0
        >>> largest_batch(lambda b: 100 + 10 * b, 1000, interpolate=True)
        90

    Args:
        high: the high end of the estimate at a batch size, bytes.
        budget: bytes.
        interpolate: where each ``high`` costs (the XLA estimator compiles the step once
            per batch size): aim along the line through the sizes tried instead of
            doubling and halving (:func:`_interpolated`). The same answer where ``high``
            never falls; on a line, 4 calls of ``high`` instead of about twice log2 of
            the answer.
    """
    first = high(1)
    if first > budget:
        return 0
    if interpolate:
        return _interpolated(high, budget, first)
    lo, hi = 1, 2
    while hi < MAX_BATCH and high(hi) <= budget:
        lo, hi = hi, hi * 2
    if hi >= MAX_BATCH and high(MAX_BATCH) <= budget:
        return MAX_BATCH
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if high(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def _interpolated(high: Callable[[int], int], budget: int, first: int) -> int:
    """:func:`largest_batch` (``high(1)`` fits) by safeguarded interpolation: the next size
    tried is where the line through two sizes tried meets the budget, and the size after
    it too, which closes the bracket when the line was right (``first`` is ``high(1)``).
    Where guesses gain too little (the line bends), the next step doubles (after two
    aimed guesses that found no size too large) or halves the bracket (after one that
    did not halve it), so it never takes more than a few times the calls of doubling and
    bisection. Like them it keeps ``high(lo) <= budget < high(hi)``, so the answer is an edge of
    ``high``: the one doubling and bisection find where ``high`` never falls."""
    seen = {1: first}

    def fits(b: int) -> bool:
        if b not in seen:
            seen[b] = high(b)
        return seen[b] <= budget

    lo, hi, anchor = 1, 0, 0            # hi 0: no size known not to fit; anchor: fits, < lo
    short = 0                           # aimed guesses in a row that found no size too large
    slow = False                        # the bracket did not halve: bisect
    while not hi or hi - lo > 1:
        if not hi and lo >= MAX_BATCH:
            return MAX_BATCH
        width = hi - lo if hi else 0
        if hi:                          # seen[hi] > budget >= seen[lo]: the slope is > 0
            aimed = not slow
            slope = (seen[hi] - seen[lo]) / (hi - lo)
            guess = lo + math.floor((budget - seen[lo]) / slope) if aimed else (lo + hi) // 2
            guess = min(max(guess, lo + 1), hi - 1)
        else:
            slope = (seen[lo] - seen[anchor]) / (lo - anchor) if anchor else 0.0
            aimed = slope > 0
            guess = lo + math.floor((budget - seen[lo]) / slope) if aimed else 2 * lo
            guess = min(max(guess, lo + 1, 2 * lo if short >= 2 else 0), MAX_BATCH)
        previous = lo
        if not fits(guess):
            hi = guess
        else:
            lo = guess
            if aimed and guess < MAX_BATCH and (not hi or guess + 1 < hi):
                if fits(guess + 1):
                    lo = guess + 1
                else:
                    hi = guess + 1
        if lo != previous:
            anchor = previous
        short = 0 if hi else short + aimed
        slow = width > 0 and 2 * (hi - lo) > width
    return lo
