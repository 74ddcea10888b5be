"""Estimate a Keras model's training memory before running it; find the batch size that fits.

    memfit.estimate_memory(model, 64)   the estimate (weights, optimizer slots, step peak...)
    Estimator(model).max_batch_size(b)  the largest batch size whose high end fits a budget
    measure_training(model, 64)         real training steps in a child process, measured
    find_batch_size(model, budget)      OOM-safe search with real steps in child processes
    calibrate("cpu")                    the framework baseline of this machine, cached

The function is :func:`memfit.estimate_memory` (also ``memfit.estimate.estimate``);
calling this package as ``memfit.estimate(...)`` still works for this release, with a
DeprecationWarning. TensorFlow is imported when
a model is built, not by importing this package.
"""

from typing import Any

from memfit.callable_package import make_callable
from memfit.estimate.baseline import Calibration, calibrate, framework_baseline, load_calibration
from memfit.estimate.measure import ChildResult, measure_training
from memfit.estimate.model import EstimateError, ModelSpec
from memfit.estimate.optimizers import OPTIMIZERS, slots_per_weight

__all__ = ["Calibration", "ChildResult", "Estimate", "EstimateError", "Estimator",
           "ModelSpec", "OPTIMIZERS", "SearchResult", "calibrate", "estimate",
           "find_batch_size", "framework_baseline", "load_calibration", "measure_training",
           "slots_per_weight"]


def __getattr__(name: str) -> Any:
    if name == "Estimate":
        from memfit.estimate.memory_estimate import Estimate

        return Estimate
    if name in ("Estimator", "estimate"):
        from memfit.estimate import estimator

        return getattr(estimator, name)
    if name in ("find_batch_size", "SearchResult"):
        from memfit.estimate import search

        return getattr(search, name)
    raise AttributeError(f"module 'memfit.estimate' has no attribute {name!r}")

# memfit.estimate(...) runs the function for one more release, with a DeprecationWarning
make_callable(__name__, "memfit.estimate.estimator:estimate", "estimate_memory")
