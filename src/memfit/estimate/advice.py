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

__all__ = ["advice", "after_measuring", "Reestimates", "UNSURE_OF_ONE", "INSIDE_RANGE"]

#: How the two lines of :func:`advice` that real steps answer begin
#: (:func:`after_measuring`).
UNSURE_OF_ONE = "not even batch size 1 fits for sure"
INSIDE_RANGE = "the budget is inside the estimate's range"


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
        out.append(f"{UNSURE_OF_ONE} (it needs up to "
                   f"{format_size(est.high(1))}); "
                   f"weights, optimizer state, runtime and baseline alone need "
                   f"{format_size(fixed)}")
    if e.total_low <= budget:
        out.append(f"{INSIDE_RANGE} "
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


def after_measuring(lines: Sequence[str], budget: int, peak: int | None,
                    status: str, point: int | None = None) -> list[str]:
    """The advice once real steps found that not even batch size 1 fits: what they
    measured, then the estimate's advice less the two lines they answer (batch size 1
    "not sure to fit", and "run memfit find-batch-size").

    Example:
        >>> after_measuring([f"{UNSURE_OF_ONE} (it needs up to 1.2 GiB)", "use SGD"],
        ...                 2**30, 2**30 + 2**20, "over-budget")[1:]
        ['use SGD']

    Args:
        lines: the estimate's advice (:func:`advice`).
        budget: bytes.
        peak: the peak measured at batch size 1 (where it was stopped, for
            ``"over-budget"``), or ``None`` when the trial did not say.
        status: how the trial of batch size 1 ended (``"over-budget"``: stopped at the
            budget, its true peak higher; ``"oom"``, ``"timeout"``...).
        point: the estimate's point total at batch size 1 (bytes), or ``None``.
    """
    kept = [a for a in lines if not a.startswith((UNSURE_OF_ONE, INSIDE_RANGE))]
    need = (f"; the estimate puts what it needs at about {format_size(point)}"
            if point is not None and point > budget else "")
    if status == "over-budget" and peak is not None:
        head = (f"batch size 1 went over the budget in real steps (stopped at "
                f"{format_size(peak)}, the budget is {format_size(budget)}{need}): raise the "
                f"budget, or make the model or its optimizer state smaller")
    else:
        at = f", peak {format_size(peak)}" if peak is not None else ""
        head = (f"batch size 1 did not run within the budget of {format_size(budget)} in "
                f"real steps ({status}{at}{need})")
    return [head, *kept]
