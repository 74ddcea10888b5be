"""``memfit.estimate()``: the training memory of a Keras model, before running it.

The estimate is the sum of parts a user can act on:

* **weights**: every variable of the model, in its own dtype (float32 under
  ``mixed_float16``: the policy changes what is computed, not what is stored);
* **optimizer slots**: the optimizer's variables, counted on the optimizer built for
  this model (Adam: 2 × the trainable weights; see :mod:`memfit.estimate.optimizers`);
* **step peak**: the tensors alive at the worst moment of one training step, from
  playing the traced step (:mod:`memfit.estimate.graph`), split into **activations**
  (forward tensors kept for the backward pass, in the compute dtype) and **gradients**
  (backward-pass tensors: weight gradients and their temporaries);
* **input batch**: one batch of inputs and targets; **pipeline**: ``dataset_budget``;
* **allocator retention**: what glibc's heap arenas and oneDNN's pool keep beyond the
  live tensors, under one **allocator policy** (:mod:`memfit.memory.allocator`):
  ``"default"`` (glibc as it comes: a plain training process) or ``"fixed"`` (glibc's mmap
  threshold fixed at 128 KiB: less memory, kept more predictably);
* **runtime**: what TensorFlow and Keras allocate for a model beyond its tensors — the
  traced graph, the instantiated function and its kernels — per op of the step;
* **safety margin**: a share of the rest, so that at most 5 % of the fitting cases are
  under-estimated; the last three are fitted per policy and kernels (:data:`FITTED`);
* **baseline**: the framework itself (``import tensorflow``), from ``memfit calibrate``.

``model_bytes`` (all but the baseline) predicts what ``measure_training`` measures;
``total`` adds the baseline. On models it was not fitted on it errs both ways, so the
estimate carries a **range** (:mod:`memfit.estimate.band`), ``total_low`` … ``total_high``:
a budget "fits" only when ``total_high`` does, "does not fit" when not even ``total_low``
does, else "uncertain" (:attr:`Estimate.verdict`); ``max_batch_size`` is the largest batch
whose ``total_high`` fits, which never falls as the batch grows (:meth:`Estimator.high`).

Example:
    >>> import keras
    >>> model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10)])
    >>> e = Estimator(model, optimizer="adam").at(128)
    >>> e.weights                                  # (784 x 10 + 10) float32
    31400
    >>> e.optimizer_slots - 2 * e.weights          # Adam: 2 slots a weight, + 2 scalars
    12
    >>> e.model_bytes > e.weights + e.optimizer_slots + e.input_batch
    True
    >>> print(e)                                   # the table                # doctest: +SKIP

``memfit.estimate(model, 128, optimizer="adam")`` gives the same :class:`Estimate`, and
measures this machine's framework baseline first when nothing is cached.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memfit.estimate.advice import advice
from memfit.estimate.band import BANDS, DOES_NOT_FIT, FITS, UNCERTAIN, banded, verdict
from memfit.estimate.baseline import check_device, ensure_calibration, framework_baseline
from memfit.estimate.graph import StepGraph, trace
from memfit.estimate.layers import LayerRow, layer_rows, param_bytes, param_count
from memfit.estimate.model import EstimateError, check_batch_size, check_policy, input_errors
from memfit.estimate.optimizers import check_optimizer, name_of
from memfit.estimate.training import Setup, batch_bytes, kernels_of, onednn_enabled, prepare
from memfit.memory.allocator import FIXED_MMAP_THRESHOLD
from memfit.memory.allocator import check_policy as check_allocator
from memfit.quiet import filtered_stderr, quieted
from memfit.sizes import format_size, parse_size

__all__ = ["Estimate", "Estimator", "estimate", "FITTED", "FIT_TERMS",
           "predict_from_features", "resident_tensors"]

#: The fitted terms of ``model_bytes`` beyond the exact parts (weights, optimizer slots,
#: input batch, pipeline): ``heap`` × the peak of heap-served step buffers (glibc's
#: arenas keep them, one arena per thread), ``mmap`` × the peak of mapped ones, ``pool``
#: × the pages of oneDNN's pool the steps wrote (:mod:`memfit.estimate.pool`; 0 with
#: TensorFlow's own allocator), ``one`` bytes (executor, thread pools, Keras trainer
#: state) and ``ops`` bytes per op of the traced step (graph, function, kernels); the
#: policy and kernels decide which buffers are heap-served, mapped or pooled.
FIT_TERMS: tuple[str, ...] = ("heap", "mmap", "pool", "one", "ops")
#: Per allocator policy and kernels (:data:`~memfit.estimate.training.KERNELS`):
#: the coefficients of :data:`FIT_TERMS` and ``margin`` (a share added to the whole, so
#: that at most 5 % of the cases are under-estimated), fitted on every family of the
#: family panel (``benchmarks/estimate_families.py``, the line "Chosen on every family":
#: ``benchmarks/estimate_fit.py``'s search for the smallest mean relative error with the
#: under-estimates held at 5 %). How constants chosen so do on a family they never saw is
#: the same run's k-fold-by-family table (docs/estimate.md, "Out of family").
FITTED: dict[str, dict[str, dict[str, float]]] = {
    "fixed": {   # 4 steps (0.3 % run to run); 102 cases each
        "onednn-float32": {"heap": 1.182212, "mmap": 1.0, "pool": 1.0, "one": 7_493_462,
                           "ops": 34_776, "margin": 0.1155},
        "onednn-16bit": {"heap": 1.038495, "mmap": 1.020421, "pool": 1.0, "one": 7_410_000,
                         "ops": 29_930, "margin": 0.2099},
        # Fitted on the first 60-case panel (benchmarks/estimate_accuracy.py), measured on
        # a CPU oneDNN was not used on; judged on the family panel with oneDNN off.
        "tensorflow": {"heap": 1.277361, "mmap": 1.0, "pool": 1.0, "one": 6_951_929,
                       "ops": 31_009, "margin": 0.029},
    },
    "default": {   # glibc as it comes (5 % run to run); 102 cases each, measured once
        "onednn-float32": {"heap": 1.254865, "mmap": 1.0, "pool": 1.0, "one": 12_121_538,
                           "ops": 30_000, "margin": 0.1932},
        "onednn-16bit": {"heap": 1.025811, "mmap": 1.0, "pool": 1.0, "one": 17_810_821,
                         "ops": 28_894, "margin": 0.1729},
        # The first panel, as above; not measured on the family panel under this policy.
        "tensorflow": {"heap": 1.340642, "mmap": 1.0, "pool": 1.0, "one": 21_945_814,
                       "ops": 26_108, "margin": 0.2236},
    },
}
MAX_BATCH = 1 << 24


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
    """``model_bytes`` from :meth:`Estimator.features` and one policy's :data:`FITTED`.

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
        margin: the fitted safety margin (a share of the rest, see :data:`FITTED`).
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

    @property
    def step_peak(self) -> int:
        """Tensors alive at the step's peak: activations + gradients."""
        return self.activations + self.gradients

    @property
    def model_bytes(self) -> int:
        """Everything but the framework baseline: what ``--measure`` measures."""
        return (self.weights + self.optimizer_slots + self.step_peak + self.allocator
                + self.input_batch + self.pipeline + self.runtime + self.margin)

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
        return [("weights", self.weights), ("optimizer slots", self.optimizer_slots),
                ("gradients (at peak)", self.gradients),
                ("activations (at peak)", self.activations),
                ("allocator retention (glibc, oneDNN)", self.allocator),
                ("input batch", self.input_batch), ("input pipeline", self.pipeline),
                ("runtime (graph, kernels)", self.runtime),
                ("safety margin", self.margin),
                (f"framework baseline ({self.baseline_source})", self.baseline)]

    def to_json(self) -> dict:
        """A plain dict for ``--json`` (sizes in bytes)."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "layers"}
        out["layers"] = [row.to_json() for row in self.layers]
        out["advice"] = list(self.advice)
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
        lines = [f"memfit estimate: {self.model_name}, batch {self.batch_size}, "
                 f"{self.dtype_policy}, {self.optimizer}, {self.device}",
                 f"allocator policy: {_POLICY_TEXT[self.allocator_policy]}",
                 f"kernels: {_KERNELS_TEXT[self.kernels]}", ""]
        for i, row in enumerate(rows):
            cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
            cells += [c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=True)]
            lines.append("  ".join(cells))
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines.append("")
        lines.append(f"params: {self.params_trainable:,} trainable, "
                     f"{self.params_non_trainable:,} non-trainable")
        width = max(len(n) for n, _ in self.components())
        for name, value in self.components():
            lines.append(f"  {name:<{width}}  {format_size(value):>10}")
        lines.append(f"  {'total':<{width}}  {format_size(self.total):>10}")
        lines.append(f"  {'range':<{width}}  {format_size(self.total_low):>10} - "
                     f"{format_size(self.total_high)} (measured out of family, "
                     f"{self.allocator_policy} policy: docs/estimate.md)")
        lines.append(f"  (the step peaks at {self.peak_op})")
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


class Estimator:
    """A model prepared and traced once, to estimate at any batch size.

    Example:
        >>> est = Estimator("mymodels:make_cnn", dtype_policy="mixed_float16")  # doctest: +SKIP
        >>> [est.at(b).total for b in (32, 64)]                                  # doctest: +SKIP
        >>> est.max_batch_size("8GiB")                                           # doctest: +SKIP

    Args:
        model: a ``keras.Model``, a ``.keras`` path, or ``module:function``.
        optimizer: an optimizer name (see :mod:`memfit.estimate.optimizers`), a Keras
            optimizer, or ``None`` (the model's compiled optimizer, else Adam).
        dtype_policy: a Keras dtype policy name, or ``None`` for the model's own.
        input_shape: input shape(s) without the batch dimension, for a model that does
            not know them (``(224, 224, 3)``).
        dataset_budget: bytes (or ``"256MiB"``) of input pipeline buffers to count, e.g.
            the ``memory_budget`` of a ``memfit.dataset``.
        device: ``"cpu"`` or ``"gpu:N"``: whose baseline to add.
        allocator: the allocator policy of the training process to predict:
            ``"default"`` (a plain process: glibc's dynamic threshold, which keeps more,
            and less predictably) or ``"fixed"`` (glibc's mmap threshold fixed at 128 KiB:
            a process started with ``MALLOC_MMAP_THRESHOLD_=131072`` or that called
            ``memfit.memory.allocator.fix_mmap_threshold()`` first).
        onednn: whether the training process runs oneDNN's kernels (``None``: as this
            process does, see :func:`~memfit.estimate.training.onednn_enabled`).
    """

    def __init__(self, model: Any, *, optimizer: Any = None, dtype_policy: str | None = None,
                 input_shape: Any = None, dataset_budget: int | str | None = None,
                 device: str = "cpu", allocator: str = "default",
                 onednn: bool | None = None):
        with input_errors():
            self.allocator = check_allocator(allocator)
        self._held: dict[tuple[int, int], int] = {}
        check_policy(dtype_policy)
        if isinstance(optimizer, str):
            check_optimizer(optimizer)
        self.device = check_device(device)
        self.pipeline = 0 if dataset_budget is None else parse_size(dataset_budget,
                                                                     name="dataset_budget")
        with quieted(), filtered_stderr():      # TensorFlow's start-up lines
            self.setup: Setup = prepare(model, dtype_policy=dtype_policy,
                                        optimizer=optimizer, input_shape=input_shape)
        self.kernels = kernels_of(self.setup.policy,
                                  onednn_enabled() if onednn is None else bool(onednn))
        self.constants = FITTED[self.allocator][self.kernels]
        self.band = BANDS[self.allocator][self.kernels]
        try:
            self.step: StepGraph = trace(self.setup, cpu=self.device == "cpu",
                                         onednn=self.kernels != "tensorflow")
        except EstimateError:
            raise
        except Exception as e:     # noqa: BLE001
            raise EstimateError(f"Cannot trace a training step of the model "
                                f"({type(e).__name__}: {e}).") from None
        m = self.setup.model
        self.weights = param_bytes(m.weights)
        opt = self.setup.optimizer
        variables = list(opt.variables)
        inner = getattr(opt, "inner_optimizer", None)
        if inner is not None:
            variables += list(inner.variables)
        self.slots = param_bytes(variables)
        self.per_sample_input = batch_bytes(self.setup.inputs) + batch_bytes(self.setup.targets)
        # oneDNN's pool serves the step's large buffers (on the CPU); it holds the
        # variables and slots first, in the order they were made.
        self.pooled = self.kernels != "tensorflow" and self.device == "cpu"
        self.kept = [param_bytes([v]) for v in [*m.weights, *variables]]
        self.layers = tuple(layer_rows(m, self.step))
        self.baseline, self.baseline_source = framework_baseline(self.device)

    def _peak(self, batch_size: int, played_at: int | None = None) -> Any:
        threshold = FIXED_MMAP_THRESHOLD if self.allocator == "fixed" else None
        if not self.pooled:
            return self.step.peak(batch_size, mmap_threshold=threshold, played_at=played_at)
        return self.step.peak(batch_size, mmap_threshold=threshold, played_at=played_at,
                              pool=True, kept=self.kept,
                              step_inputs=[self.per_sample_input])

    def features(self, batch_size: int, played_at: int | None = None) -> dict[str, float]:
        """The raw terms of the estimate at ``batch_size`` (bytes), before the fitted
        constants: see :func:`predict_from_features` and :data:`FIT_TERMS`.

        Example:
            >>> f = Estimator("mymodels:make_cnn").features(64)            # doctest: +SKIP
            >>> predict_from_features(f, FITTED["fixed"]["onednn-float32"])  # doctest: +SKIP

        Args:
            batch_size: samples per step.
            played_at: the play (op order, which buffers are mapped) taken at this batch
                size, every buffer sized at ``batch_size`` (``None``: ``batch_size``).
        """
        peak = self._peak(batch_size, played_at)
        return {"exact": self.exact(batch_size), "peak": peak.bytes, "heap": peak.heap_bytes,
                "mmap": peak.mmap_bytes, "pool": peak.pool_bytes, "one": 1,
                "ops": self.step.graph_ops}

    def exact(self, batch_size: int) -> int:
        """The bytes counted exactly at ``batch_size``: weights, optimizer slots, the
        input batch and the pipeline budget (the band does not widen them)."""
        return self.weights + self.slots + self.per_sample_input * batch_size + self.pipeline

    def _parts(self, batch_size: int) -> dict:
        peak = self._peak(batch_size)
        c = self.constants
        resident = resident_tensors({"heap": peak.heap_bytes, "mmap": peak.mmap_bytes,
                                     "pool": peak.pool_bytes}, c)
        parts = {"gradients": peak.backward_bytes,
                 "activations": peak.bytes - peak.backward_bytes,
                 "allocator": max(0, int(resident) - peak.bytes),
                 "peak_op": peak.op,
                 "input_batch": self.per_sample_input * batch_size,
                 "runtime": int(c["one"] + c["ops"] * self.step.graph_ops)}
        rest = (self.weights + self.slots + peak.bytes + parts["allocator"]
                + parts["input_batch"] + self.pipeline + parts["runtime"])
        parts["margin"] = int(rest * c["margin"])
        return parts

    def total(self, batch_size: int) -> int:
        """``Estimate.total`` at ``batch_size``, without building the table."""
        p = self._parts(batch_size)
        return (self.weights + self.slots + p["gradients"] + p["activations"]
                + p["allocator"] + p["input_batch"] + self.pipeline + p["runtime"]
                + p["margin"] + self.baseline)

    def held_model_bytes(self, batch_size: int) -> int:
        """``model_bytes`` held non-decreasing in the batch size: the largest prediction
        at ``batch_size`` of the plays at the powers of two up to it (each play's op
        order and glibc's split kept, every buffer sized at ``batch_size``). Under one
        play every buffer grows with the batch; a larger batch adds plays: so the value
        never falls as the batch grows, where the play of each batch size alone can
        (its op order and which buffers glibc maps change with the batch).

        Example:
            >>> est = Estimator("mymodels:make_mlp")                         # doctest: +SKIP
            >>> est.held_model_bytes(48) <= est.held_model_bytes(49)          # doctest: +SKIP
            True

        Args:
            batch_size: samples per step.
        """
        best, g = 0, 1
        while g <= batch_size:
            key = (g, batch_size)
            if key not in self._held:
                self._held[key] = predict_from_features(self.features(batch_size, g),
                                                        self.constants)
            best, g = max(best, self._held[key]), g * 2
        return best

    def low(self, batch_size: int) -> int:
        """The low end of ``total`` at ``batch_size``: the point prediction, its part not
        :meth:`exact` times the band's ``low`` (:data:`~.band.BANDS`), + the baseline."""
        return banded(self.total(batch_size) - self.baseline, self.exact(batch_size),
                      self.band["low"]) + self.baseline

    def high(self, batch_size: int) -> int:
        """The high end of ``total`` at ``batch_size``: :meth:`held_model_bytes`, its part
        that is not :meth:`exact` times the band's ``high``, + the baseline; never falls
        as the batch grows (both parts grow with it)."""
        return banded(self.held_model_bytes(batch_size), self.exact(batch_size),
                      self.band["high"]) + self.baseline

    def max_batch_size(self, budget: int | str) -> int:
        """The largest batch size whose high end (:meth:`high`) fits ``budget`` (0 when
        not even 1 does). The high end never falls as the batch grows, so every smaller
        batch fits too and the next one does not."""
        budget = parse_size(budget, name="budget")
        if self.high(1) > budget:
            return 0
        lo, hi = 1, 2
        while hi < MAX_BATCH and self.high(hi) <= budget:
            lo, hi = hi, hi * 2
        if hi >= MAX_BATCH and self.high(MAX_BATCH) <= budget:
            return MAX_BATCH
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.high(mid) <= budget:
                lo = mid
            else:
                hi = mid
        return lo

    def at(self, batch_size: int, *, budget: int | str | None = None) -> Estimate:
        """The :class:`Estimate` at ``batch_size`` (and the largest batch for ``budget``)."""
        check_batch_size(batch_size)
        budget_bytes = None if budget is None else parse_size(budget, name="budget")
        p = self._parts(batch_size)
        m = self.setup.model
        trainable = param_count(m.trainable_weights)
        frozen = param_count(m.non_trainable_weights)
        e = Estimate(model_name=m.name, batch_size=batch_size, dtype_policy=self.setup.policy,
                     optimizer=name_of(self.setup.optimizer), device=self.device,
                     layers=self.layers, weights=self.weights, optimizer_slots=self.slots,
                     gradients=p["gradients"], activations=p["activations"],
                     allocator=p["allocator"], input_batch=p["input_batch"], pipeline=self.pipeline,
                     runtime=p["runtime"], margin=p["margin"],
                     allocator_policy=self.allocator, kernels=self.kernels,
                     baseline=self.baseline,
                     baseline_source=self.baseline_source, peak_op=p["peak_op"],
                     params_trainable=trainable, params_non_trainable=frozen,
                     model_bytes_low=self.low(batch_size) - self.baseline,
                     model_bytes_high=self.high(batch_size) - self.baseline)
        if budget_bytes is None:
            return e
        best = self.max_batch_size(budget_bytes)
        return dataclasses.replace(e, budget=budget_bytes, max_batch_size=best,
                                   advice=tuple(advice(self, e, budget_bytes, best)))


_KERNELS_TEXT = {
    "onednn-float32": "oneDNN's (TensorFlow's default on this CPU; TF_ENABLE_ONEDNN_OPTS=0 "
                      "turns them off, in memfit and in the training)",
    "onednn-16bit": "oneDNN's, 16-bit (TensorFlow's default on this CPU; "
                    "TF_ENABLE_ONEDNN_OPTS=0 turns them off, in memfit and in the training)",
    "tensorflow": "TensorFlow's own (oneDNN off in this process: TF_ENABLE_ONEDNN_OPTS=0, or "
                  "a CPU it does not use)",
}
_POLICY_TEXT = {
    "fixed": "fixed (glibc mmap threshold 128 KiB: start the training with "
             "MALLOC_MMAP_THRESHOLD_=131072 or call "
             "memfit.memory.allocator.fix_mmap_threshold() first)",
    "default": "default (glibc's dynamic mmap threshold: a plain Python process; "
               "--allocator fixed predicts less, and more tightly, for a process that "
               "fixes it)",
}


def estimate(model: Any, batch_size: int, *, optimizer: Any = None,
             dtype_policy: str | None = None, input_shape: Any = None,
             dataset_budget: int | str | None = None, budget: int | str | None = None,
             device: str = "cpu", allocator: str = "default",
             onednn: bool | None = None) -> Estimate:
    """Estimates the memory that training ``model`` at ``batch_size`` needs.

    Nothing is trained: the model is built (weights, optimizer state) and one training
    step is traced; the step's tensors are played through their lifetimes. The model you
    pass is compiled for the trace (with ``optimizer`` and a mean-squared-error loss);
    pass a ``.keras`` path or ``module:function`` to leave your object alone.

    Example:
        >>> import keras, memfit
        >>> model = keras.Sequential([keras.Input((784,)),
        ...                           keras.layers.Dense(512, activation="relu"),
        ...                           keras.layers.Dense(10)])
        >>> e = memfit.estimate(model, 256, optimizer="adam", budget="1GiB")   # doctest: +SKIP
        >>> e.weights, e.optimizer_slots                                        # doctest: +SKIP
        (1627688, 3255384)
        >>> e.fits, e.max_batch_size                                            # doctest: +SKIP

    Args:
        model: a ``keras.Model`` (Sequential, functional or subclassed), a ``.keras``
            path, or ``module:function`` returning a model (keras.applications
            functions get ``weights=None``).
        batch_size: samples per training step (a positive integer).
        optimizer: an optimizer name (``"sgd"``, ``"sgd+momentum"``, ``"adam"``,
            ``"adamw"``, ``"rmsprop"``, ``"adagrad"``, ``"adadelta"``, ``"nadam"``...),
            a Keras optimizer, or ``None`` (the model's compiled optimizer, else Adam).
        dtype_policy: ``"float32"``, ``"mixed_float16"``, ``"mixed_bfloat16"``...;
            ``None`` keeps the model's.
        input_shape: shape of one sample without the batch dimension, for a model that
            does not know it (subclassed, or Sequential without ``Input``).
        dataset_budget: input pipeline buffers to count (a ``memfit.dataset`` budget).
        budget: memory available; the estimate then says whether it fits, the largest
            batch size that does, and what to change.
        device: ``"cpu"`` or ``"gpu:N"``: which calibrated baseline to add (the first
            estimate on a machine measures it in a child process, once, caches it and
            says so: :func:`~memfit.estimate.baseline.ensure_calibration`).
        allocator: the allocator policy of the process predicted: ``"default"`` (glibc
            as it comes) or ``"fixed"`` (mmap threshold fixed at 128 KiB, see
            :mod:`memfit.memory.allocator`).
        onednn: whether the training process runs oneDNN's kernels (``None``: as this
            process does; ``TF_ENABLE_ONEDNN_OPTS=0`` turns them off in both).

    Returns:
        An :class:`Estimate`; ``print`` it for the table, ``.to_json()`` for tools.

    Raises:
        EstimateError: for a model that cannot be loaded or built, an unknown optimizer
            or policy, or a batch size that is not a positive integer (each quoting it).
    """
    check_batch_size(batch_size)
    est = Estimator(model, optimizer=optimizer, dtype_policy=dtype_policy,
                    input_shape=input_shape, dataset_budget=dataset_budget, device=device,
                    allocator=allocator, onednn=onednn)
    if est.baseline_source == "default":        # nothing cached: measured, once per machine
        est.baseline, est.baseline_source = ensure_calibration(est.device)
    return est.at(batch_size, budget=budget)
