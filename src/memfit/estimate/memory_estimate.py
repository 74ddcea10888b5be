"""The estimate of one model at one batch size (:class:`Estimate`): its parts, their sum
(:func:`model_sum`, the one place they are added up), its range and verdict against a
budget, and how it prints.

Example:
    >>> model_sum(weights=10, optimizer_slots=20, step_peak=30, allocator=4, input_batch=5,
    ...           pipeline=0, runtime=6, margin=7)
    82
"""

from __future__ import annotations

import dataclasses

from memfit.estimate.band import DOES_NOT_FIT, FITS, UNCERTAIN, verdict
from memfit.estimate.layers import LayerRow
from memfit.sizes import format_size

__all__ = ["Estimate", "model_sum"]


def model_sum(*, weights: int, optimizer_slots: int, step_peak: int, allocator: int,
              input_batch: int, pipeline: int, runtime: int, margin: int) -> int:
    """The bytes of a training process beyond the framework baseline: every part of the
    estimate added up (integers: the same in any order).

    Args:
        weights, optimizer_slots, step_peak, allocator, input_batch, pipeline, runtime,
            margin: the parts, in bytes (see :class:`Estimate`).
    """
    return (weights + optimizer_slots + step_peak + allocator + input_batch + pipeline
            + runtime + margin)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The estimated training memory of a model at one batch size (bytes).

    Attributes:
        model_name: the model's name.
        batch_size: samples per step.
        dtype_policy: the Keras dtype policy.
        optimizer: the optimizer's name (``"adam"``, ``"sgd+momentum"``...).
        device: ``"cpu"`` or ``"gpu:N"``.
        layers: the per-layer table (:class:`memfit.estimate.layers.LayerRow`).
        weights: all model variables.
        optimizer_slots: all optimizer variables.
        gradients: backward-pass tensors alive at the step's peak.
        activations: forward-pass tensors alive at the step's peak.
        input_batch: one batch of inputs and targets.
        pipeline: input pipeline buffers (the ``dataset_budget`` given, else 0).
        allocator: what glibc keeps beyond the live tensors: freed step buffers stay in
            the heap arenas of the threads that allocated them (fitted, see the module
            docstring).
        runtime: the traced graph, function and kernels, per op (fitted).
        margin: the fitted safety margin (a share of the rest, see
            :data:`memfit.estimate.fitted.FITTED`): 0 with oneDNN's kernels, whose point
            prediction is the best estimate (the range's high end is what is safe).
        allocator_policy: the allocator policy predicted: ``"default"`` (glibc as it
            comes) or ``"fixed"`` (glibc's mmap threshold fixed at 128 KiB; see
            :mod:`memfit.memory.allocator`).
        kernels: the kernels predicted (:data:`~memfit.estimate.training.KERNELS`).
        baseline: the framework baseline; ``baseline_source`` says where it came from.
        model_bytes_low / model_bytes_high: the range of ``model_bytes`` under this
            allocator policy (:mod:`memfit.estimate.band`).
        peak_op: the op of the training step at which the peak is reached.
        params_trainable / params_non_trainable: parameter counts.
        budget: the budget asked about, or ``None``.
        max_batch_size: the largest batch size whose high end (``total_high``) fits
            ``budget`` (0: none does), or ``None`` without a budget.
        advice: what to change when it does not fit (empty otherwise).
        assumptions: what the estimate assumed that the model did not say, in words
            (the loss of a model not compiled, or compiled with another loss).
    """

    model_name: str
    batch_size: int
    dtype_policy: str
    optimizer: str
    device: str
    layers: tuple[LayerRow, ...]
    weights: int
    optimizer_slots: int
    gradients: int
    activations: int
    allocator: int
    input_batch: int
    pipeline: int
    runtime: int
    margin: int
    allocator_policy: str
    kernels: str
    baseline: int
    baseline_source: str
    peak_op: str
    params_trainable: int
    params_non_trainable: int
    model_bytes_low: int
    model_bytes_high: int
    budget: int | None = None
    max_batch_size: int | None = None
    advice: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()

    @property
    def step_peak(self) -> int:
        """Tensors alive at the step's peak: activations + gradients."""
        return self.activations + self.gradients

    @property
    def model_bytes(self) -> int:
        """Everything but the framework baseline: what ``--measure`` measures."""
        return model_sum(weights=self.weights, optimizer_slots=self.optimizer_slots,
                         step_peak=self.step_peak, allocator=self.allocator,
                         input_batch=self.input_batch, pipeline=self.pipeline,
                         runtime=self.runtime, margin=self.margin)

    @property
    def total(self) -> int:
        """The memory the training process needs: ``model_bytes`` + the baseline."""
        return self.model_bytes + self.baseline

    @property
    def total_low(self) -> int:
        """The low end of ``total``: ``model_bytes_low`` + the baseline."""
        return self.model_bytes_low + self.baseline

    @property
    def total_high(self) -> int:
        """The high end of ``total``: ``model_bytes_high`` + the baseline."""
        return self.model_bytes_high + self.baseline

    @property
    def verdict(self) -> str | None:
        """``"fits"`` (the high end fits the budget), ``"does not fit"`` (not even the
        low end does), ``"uncertain"`` (in between: run ``memfit find-batch-size``), or
        ``None`` without a budget."""
        if self.budget is None:
            return None
        return verdict(low=self.total_low, high=self.total_high, budget=self.budget)

    @property
    def fits(self) -> bool | None:
        """``True`` when the high end fits the budget, ``False`` when not even the low
        end does; ``None`` when uncertain (see :attr:`verdict`) or without a budget."""
        return {FITS: True, DOES_NOT_FIT: False}.get(self.verdict)

    def components(self) -> list[tuple[str, int]]:
        """``(name, bytes)`` for each part, in the order printed."""
        if self.kernels.startswith("xla"):
            return [("weights", self.weights), ("optimizer slots", self.optimizer_slots),
                    ("XLA temporaries (activations, gradients, workspaces)",
                     self.activations),
                    ("input batch", self.input_batch), ("input pipeline", self.pipeline),
                    ("other XLA buffers (metrics, logs, code)", self.runtime),
                    ("compiler and runtime (fitted)" if self.kernels == "xla-cpu" else
                     "peak while compiling, beyond the step", self.margin),
                    (f"framework baseline ({self.baseline_source})", self.baseline)]
        return [("weights", self.weights), ("optimizer slots", self.optimizer_slots),
                ("gradients (at peak)", self.gradients),
                ("activations (at peak)", self.activations),
                # glibc and oneDNN hold host memory; on a GPU the same constants are played
                ("allocator retention (glibc, oneDNN)" if not self.device.startswith("gpu")
                 else "allocator retention (the CPU's, unmeasured on a GPU)", self.allocator),
                ("input batch", self.input_batch), ("input pipeline", self.pipeline),
                ("runtime (graph, kernels)", self.runtime),
                *([("safety margin", self.margin)] if self.margin else []),
                (f"framework baseline ({self.baseline_source})", self.baseline)]

    def to_json(self) -> dict:
        """A plain dict for ``--json`` (sizes in bytes)."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "layers"}
        out["layers"] = [row.to_json() for row in self.layers]
        out["advice"] = list(self.advice)
        out["assumptions"] = list(self.assumptions)
        out.update(step_peak=self.step_peak, model_bytes=self.model_bytes,
                   total=self.total, total_low=self.total_low,
                   total_high=self.total_high, fits=self.fits, verdict=self.verdict)
        return out

    def __str__(self) -> str:
        rows = [("layer", "type", "params", "frozen", "output/sample", "kept/sample")]
        for r in self.layers:
            rows.append((r.name, r.type, f"{r.params_trainable:,}",
                         f"{r.params_non_trainable:,}", format_size(r.output_bytes),
                         format_size(r.kept_bytes)))
        widths = [max(len(row[i]) for row in rows) for i in range(6)]
        on_gpu = self.device.startswith("gpu") and not self.kernels.startswith("xla")
        lines = [f"memfit estimate: {self.model_name}, batch {self.batch_size}, "
                 f"{self.dtype_policy}, {self.optimizer}, {self.device}",
                 *([] if self.kernels.startswith("xla") else
                   [f"allocator policy: {_POLICY_TEXT[self.allocator_policy]}"]
                   if not on_gpu else [f"allocator: TensorFlow's on {self.device} (glibc's "
                                       f"policies are the host memory's)"]),
                 # a GPU estimate described the CPU's kernels (a stranger's --device gpu:0)
                 f"kernels: {_KERNELS_TEXT[self.kernels]}" if not on_gpu else
                 "kernels: the GPU's, played with the constants fitted on this CPU: "
                 "TensorFlow's GPU estimate has never been measured on a GPU "
                 "(docs/estimate.md, On a GPU)",
                 *[f"assumed: {a}" for a in self.assumptions], ""]
        for i, row in enumerate(rows if self.layers else []):   # XLA's has no layer table
            cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
            cells += [c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=True)]
            lines.append("  ".join(cells))
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        if self.layers:
            lines.append("")
        lines.append(f"params: {self.params_trainable:,} trainable, "
                     f"{self.params_non_trainable:,} non-trainable")
        width = max(len(n) for n, _ in self.components())
        for name, value in self.components():
            lines.append(f"  {name:<{width}}  {format_size(value):>10}")
        lines.append(f"  {'total':<{width}}  {format_size(self.total):>10}")
        lines.append(f"  {'range':<{width}}  {format_size(self.total_low):>10} - "
                     f"{format_size(self.total_high)} ("
                     + ("XLA's band: docs/estimate.md, On JAX)"
                        if self.kernels.startswith("xla") else
                        f"measured out of family, {self.allocator_policy} policy: "
                        f"docs/estimate.md)"))
        lines.append(f"  (the step's memory is {self.peak_op})"
                     if self.kernels.startswith("xla") else
                     f"  (the step peaks at {self.peak_op})")
        if self.budget is not None:
            said = {FITS: "fits (even the high end)",
                    DOES_NOT_FIT: "does NOT fit (not even the low end)",
                    UNCERTAIN: "uncertain: the budget is inside the range; run memfit "
                               "find-batch-size"}[self.verdict or UNCERTAIN]
            lines.append(f"budget {format_size(self.budget)}: batch {self.batch_size} "
                         f"{said}; largest batch size whose high end fits: "
                         f"{self.max_batch_size}")
        for line in self.advice:
            lines.append(f"  - {line}")
        return "\n".join(lines)


_KERNELS_TEXT = {
    "onednn-float32": "oneDNN's (TensorFlow's default on this CPU; TF_ENABLE_ONEDNN_OPTS=0 "
                      "turns them off, in memfit and in the training)",
    "onednn-16bit": "oneDNN's, 16-bit (TensorFlow's default on this CPU; "
                    "TF_ENABLE_ONEDNN_OPTS=0 turns them off, in memfit and in the training)",
    "tensorflow": "TensorFlow's own (oneDNN off in this process: TF_ENABLE_ONEDNN_OPTS=0, or "
                  "a CPU it does not use)",
}
_KERNELS_TEXT.update({
    "xla-gpu": "XLA's, on the GPU (Keras on JAX: the step is one compiled program; its "
               "buffer assignment is what the device's allocator hands out)",
    "xla-cpu": "XLA's, on the CPU (Keras on JAX: the step's buffers from XLA's buffer "
               "assignment, the compiler's and runtime's host memory fitted on the family "
               "panel)",
})
_POLICY_TEXT = {
    "fixed": "fixed (glibc mmap threshold 128 KiB: start the training with "
             "MALLOC_MMAP_THRESHOLD_=131072 or call "
             "memfit.memory.allocator.fix_mmap_threshold() first)",
    "default": "default (glibc's dynamic mmap threshold: a plain Python process; "
               "--allocator fixed predicts less, and more tightly, for a process that "
               "fixes it)",
}
