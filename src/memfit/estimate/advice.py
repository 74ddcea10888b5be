"""The estimate's advice: what to change when a batch is not sure to fit a budget.

In the order a user would try them: the largest batch that fits, what the budget lacks,
mixed precision, a lighter optimizer, a smaller input pipeline, the layers that keep the
most for the backward pass and the one that holds most of the weights. When the framework
alone is over the budget, nothing about the model can help, and that is all it says.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from memfit.estimate.layers import LayerRow
from memfit.estimate.memory_estimate import Estimate
from memfit.sizes import format_size

__all__ = ["advice", "Reestimates"]


class Reestimates(Protocol):
    """What advice asks of the estimator that made the estimate
    (:class:`~memfit.estimate.estimator.Estimator` is one)."""

    pipeline: int
    layers: Sequence[LayerRow]

    def high(self, batch_size: int) -> int:
        """The high end of the estimate at ``batch_size``."""
        ...


def advice(est: Reestimates, e: Estimate, budget: int, best: int) -> list[str]:
    """What to change when batch ``e.batch_size`` is not sure to fit ``budget``.

    Example:
        >>> est = Estimator("mymodels:make_cnn")                          # doctest: +SKIP
        >>> advice(est, est.at(512), 2**30, est.max_batch_size(2**30))    # doctest: +SKIP
        ['use batch size 212 or smaller (batch 512 needs up to 2.3 GiB, ...)', ...]

    Args:
        est: the estimator that made ``e`` (an
            :class:`~memfit.estimate.estimator.Estimator`).
        e: the :class:`~memfit.estimate.memory_estimate.Estimate` at the batch asked about.
        budget: bytes.
        best: the largest batch whose high end fits ``budget`` (0: none).
    """
    if e.total_high <= budget:
        return []
    if e.baseline >= budget:
        # Nothing about the model can help: say so, and nothing else.
        return [f"the framework alone (import tensorflow, keras: "
                f"{format_size(e.baseline)} on this machine) needs more than the budget "
                f"({format_size(budget)}): no batch size, precision or optimizer fits "
                f"it; raise the budget"]
    out = []
    if best > 0:
        out.append(f"use batch size {best} or smaller (batch {e.batch_size} needs up to "
                   f"{format_size(e.total_high)}, the budget is {format_size(budget)})")
    else:
        fixed = e.weights + e.optimizer_slots + e.runtime + e.baseline + e.pipeline
        out.append(f"not even batch size 1 fits for sure (it needs up to "
                   f"{format_size(est.high(1))}); "
                   f"weights, optimizer state, runtime and baseline alone need "
                   f"{format_size(fixed)}")
    if e.total_low <= budget:
        out.append(f"the budget is inside the estimate's range "
                   f"({format_size(e.total_low)} - {format_size(e.total_high)}): "
                   f"memfit find-batch-size measures real steps")
    if e.dtype_policy == "float32" and e.activations > e.weights:
        out.append(f"mixed precision (--dtype-policy mixed_float16, or mixed_bfloat16) "
                   f"stores activations in 16 bits: about {format_size(e.activations // 2)}"
                   f" less at this batch size")
    if e.optimizer_slots > e.weights // 2:
        out.append(f"the optimizer keeps {format_size(e.optimizer_slots)} of state: SGD "
                   f"keeps none, sgd+momentum one copy of the weights")
    if est.pipeline:
        out.append(f"a smaller dataset budget frees up to {format_size(est.pipeline)}")
    heavy = sorted(est.layers, key=lambda r: r.kept_bytes, reverse=True)[:3]
    kept_total = sum(r.kept_bytes for r in est.layers) or 1
    if heavy and heavy[0].kept_bytes:
        names = ", ".join(f"{r.name} ({r.kept_bytes * 100 // kept_total} %)" for r in heavy)
        out.append(f"the layers keeping the most for the backward pass: {names}")
    big = sorted(est.layers, key=lambda r: r.weight_bytes, reverse=True)[:1]
    if big and big[0].weight_bytes > e.weights // 3:
        out.append(f"{big[0].name} holds {format_size(big[0].weight_bytes)} of the "
                   f"{format_size(e.weights)} of weights")
    return out
