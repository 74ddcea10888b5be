"""The fitted part of the estimate: what the allocator keeps beyond the live tensors, the
runtime's bytes per op and the safety margin, as coefficients fitted per allocator policy
and kernels on the family panel (docs/estimate.md says on which cases, and how they do on
families they never saw).

Example:
    >>> resident_tensors({"heap": 10, "mmap": 30, "pool": 0},
    ...                  {"heap": 1.5, "mmap": 1.0, "pool": 1.0})
    45.0
"""

from __future__ import annotations

__all__ = ["FITTED", "FIT_TERMS", "predict_from_features", "resident_tensors"]

#: The fitted terms of ``model_bytes`` beyond the exact parts (weights, optimizer slots,
#: input batch, pipeline): ``heap`` × the peak of heap-served step buffers (glibc's
#: arenas keep them, one arena per thread), ``mmap`` × the peak of mapped ones, ``pool``
#: × the pages of oneDNN's pool the steps wrote (:mod:`memfit.estimate.pool`; 0 with
#: TensorFlow's own allocator), ``one`` bytes (executor, thread pools, Keras trainer
#: state) and ``ops`` bytes per op of the traced step (graph, function, kernels); the
#: policy and kernels decide which buffers are heap-served, mapped or pooled.
FIT_TERMS: tuple[str, ...] = ("heap", "mmap", "pool", "one", "ops")
#: Per allocator policy and kernels (:data:`~memfit.estimate.training.KERNELS`):
#: the coefficients of :data:`FIT_TERMS` and ``margin`` (a share added to the whole). With
#: oneDNN's kernels they are fitted on every family of the family panel
#: (``benchmarks/estimate_families.py``, the line "Chosen on every family":
#: ``benchmarks/estimate_fit.py``'s search for the smallest mean relative error), with no
#: margin: the point prediction is the best estimate, and the range's high end
#: (:data:`~memfit.estimate.band.BANDS`) is what keeps an answer safe. (Until issue 27 a
#: margin held 5 % of the cases under: it scaled the weights and slots too, doubled the
#: out-of-family error, 12.6 % against 6.2 %, and the band widened it again.) How
#: constants chosen so do on a family they never saw is the same run's k-fold-by-family
#: table (docs/estimate.md, "Out of family").
FITTED: dict[str, dict[str, dict[str, float]]] = {
    "fixed": {   # 4 steps; 102 cases each; float32 the median of 3 runs (2.7 % apart)
        # Fitted 2026-12-06 on the plays in TensorFlow's depth-first order (issue 27).
        "onednn-float32": {"heap": 1.30396, "mmap": 1.0, "pool": 1.088931, "one": 6_936_312,
                           "ops": 36_086, "margin": 0.0},
        "onednn-16bit": {"heap": 1.000845, "mmap": 1.0, "pool": 1.20271,
                         "one": 14_113_368, "ops": 32_352, "margin": 0.0},
        # Fitted on the first 60-case panel (benchmarks/estimate_accuracy.py), measured on
        # a CPU oneDNN was not used on; judged on the family panel with oneDNN off. Its
        # margin (5 % of that panel under) stays: it was chosen with these constants.
        "tensorflow": {"heap": 1.277361, "mmap": 1.0, "pool": 1.0, "one": 6_951_929,
                       "ops": 31_009, "margin": 0.029},
    },
    "default": {   # glibc as it comes (5 % run to run); 102 cases each, measured once
        "onednn-float32": {"heap": 1.254346, "mmap": 1.0, "pool": 1.096052, "one": 7_459_349,
                           "ops": 37_211, "margin": 0.0},
        "onednn-16bit": {"heap": 1.058975, "mmap": 1.0, "pool": 1.279487, "one": 15_659_302,
                         "ops": 32_763, "margin": 0.0},
        # The first panel, as above; not measured on the family panel under this policy.
        "tensorflow": {"heap": 1.340642, "mmap": 1.0, "pool": 1.0, "one": 21_945_814,
                       "ops": 26_108, "margin": 0.2236},
    },
}


def resident_tensors(features: dict[str, float], constants: dict[str, float]) -> float:
    """The resident memory of the step's tensors under one policy's constants.

    Example:
        >>> resident_tensors({"heap": 10, "mmap": 30, "pool": 0},
        ...                  {"heap": 1.5, "mmap": 1.0, "pool": 1.0})
        45.0

    Args:
        features: ``heap`` and ``mmap``: the peaks of heap-served and mapped buffers;
            ``pool``: the pages of oneDNN's pool written (0 without it).
        constants: their scales, ``heap``, ``mmap`` and ``pool``.
    """
    return (constants["heap"] * features["heap"] + constants["mmap"] * features["mmap"]
            + constants["pool"] * features.get("pool", 0))


def predict_from_features(features: dict[str, float], constants: dict[str, float]) -> int:
    """``model_bytes`` from :meth:`~memfit.estimate.estimator.Estimator.features` and one
    policy's :data:`FITTED`.

    Example:
        >>> f = {"exact": 100, "peak": 50, "heap": 10, "mmap": 40, "pool": 0, "one": 1,
        ...      "ops": 2}
        >>> predict_from_features(f, {"heap": 2, "mmap": 1, "pool": 1, "one": 5, "ops": 1,
        ...                           "margin": 0.0})
        167

    Args:
        features: ``exact`` (weights, slots, input batch, pipeline), ``peak`` (live step
            tensors at the peak), ``heap``, ``mmap``, ``pool``, ``one`` (1) and ``ops``.
        constants: the coefficients of the policy's :data:`FIT_TERMS` and ``margin``.
    """
    resident = resident_tensors(features, constants)
    base = (features["exact"] + max(features["peak"], resident)
            + constants["one"] * features["one"] + constants["ops"] * features["ops"])
    return int(base * (1 + constants["margin"]))
