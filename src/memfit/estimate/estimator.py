"""``memfit.estimate_memory()``: the training memory of a Keras model, before running it.

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
* **safety margin**: a share of the rest; 0 with oneDNN's kernels (the point prediction
  is the best estimate, and the range's high end is what keeps an answer safe), kept
  for TensorFlow's own kernels, whose constants come from the first panel; the last
  three are fitted per policy and kernels (:data:`~memfit.estimate.fitted.FITTED`);
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

``memfit.estimate_memory(model, 128, optimizer="adam")`` gives the same :class:`Estimate`, and
measures this machine's framework baseline first when nothing is cached.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from memfit.errors import cause
from memfit.estimate.advice import advice
from memfit.estimate.band import BANDS, banded, largest_batch
from memfit.estimate.baseline import check_device, ensure_calibration, framework_baseline
from memfit.estimate.fitted import FITTED, predict_from_features, resident_tensors
from memfit.estimate.graph import StepGraph, trace
from memfit.estimate.layers import layer_rows, param_bytes, param_count
from memfit.estimate.memory_estimate import Estimate, model_sum
from memfit.estimate.model import (
    EstimateError,
    check_batch_size,
    check_policy,
    check_source,
    input_errors,
)
from memfit.estimate.optimizers import check_optimizer, name_of
from memfit.estimate.schedule import BREADTH_FIRST, DEPTH_FIRST
from memfit.estimate.training import Setup, batch_bytes, kernels_of, onednn_enabled, prepare
from memfit.estimate.xla import XlaEstimator
from memfit.frameworks import TENSORFLOW_EXTRA, keras_backend, require
from memfit.memory.allocator import FIXED_MMAP_THRESHOLD
from memfit.memory.allocator import check_policy as check_allocator
from memfit.quiet import filtered_stderr, quieted
from memfit.sizes import parse_budget, parse_size

__all__ = ["Estimate", "Estimator", "estimate", "estimator_for"]



def _check_backend() -> None:
    """Refuses, in one line, a Keras that runs on another backend than TensorFlow: the
    estimator traces the model's training step as a TensorFlow graph, and JAX's
    ``train_step`` cannot be traced so (it takes the state as an argument)."""
    import keras

    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise EstimateError(
            f"This estimator traces TensorFlow graphs, and Keras runs on the {backend} "
            f"backend here (KERAS_BACKEND={backend}): use memfit.estimate_memory() or "
            f"estimator_for(), which pick XLA's estimate on JAX, or run it with "
            f"KERAS_BACKEND=tensorflow.")


class Estimator:
    """A model prepared and traced once, to estimate at any batch size.

    Example:
        >>> est = Estimator("mymodels:make_cnn", dtype_policy="mixed_float16")  # doctest: +SKIP
        >>> [est.at(b).total for b in (32, 64)]                                  # doctest: +SKIP
        >>> est.max_batch_size("8GiB")                                           # doctest: +SKIP

    Args:
        model: a ``keras.Model``, a ``.keras`` path, or ``module:function``.
        optimizer: an optimizer name (see :mod:`memfit.estimate.optimizers`), a Keras
            optimizer, or ``None`` (the optimizer a live or ``module:function`` model is
            compiled with, else Adam; a ``.keras`` file is loaded without it).
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
        require("tensorflow", "the estimate (it traces a TensorFlow graph)", TENSORFLOW_EXTRA)
        if isinstance(model, str | os.PathLike):
            check_source(model)         # a model not found is said before TensorFlow loads
        self.pipeline = 0 if dataset_budget is None else parse_size(dataset_budget,
                                                                     name="dataset_budget")
        with quieted(), filtered_stderr():      # TensorFlow's start-up lines
            _check_backend()
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
                                f"({cause(e)}).") from None
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

    def features(self, batch_size: int, played_at: int | None = None,
                 order: str = DEPTH_FIRST) -> dict[str, float]:
        """The raw terms of the estimate at ``batch_size`` (bytes), before the fitted
        constants: see :func:`~memfit.estimate.fitted.predict_from_features` and
            :data:`~memfit.estimate.fitted.FIT_TERMS`.

        Example:
            >>> f = Estimator("mymodels:make_cnn").features(64)            # doctest: +SKIP
            >>> predict_from_features(f, FITTED["fixed"]["onednn-float32"])  # doctest: +SKIP

        Args:
            batch_size: samples per step.
            played_at: the play (op order, which buffers are mapped) taken at this batch
                size, every buffer sized at ``batch_size`` (``None``: ``batch_size``).
            order: with ``played_at``, the play's order
                (:data:`~memfit.estimate.schedule.ORDERS`; the point plays TensorFlow's).
        """
        if played_at is None:
            p = self._peak(batch_size)
            found = (p.bytes, p.heap_bytes, p.mmap_bytes, p.pool_bytes)
        else:                    # a held play: its curve, the same integers (held_peak)
            threshold = FIXED_MMAP_THRESHOLD if self.allocator == "fixed" else None
            pooled = dict(pool=True, kept=self.kept,
                          step_inputs=[self.per_sample_input]) if self.pooled else {}
            found = self.step.held_peak(batch_size, played_at, threshold, order=order,
                                        **pooled)
        return {"exact": self.exact(batch_size), "peak": found[0], "heap": found[1],
                "mmap": found[2], "pool": found[3], "one": 1, "ops": self.step.graph_ops}

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
        rest = model_sum(weights=self.weights, optimizer_slots=self.slots,
                         step_peak=peak.bytes, allocator=parts["allocator"],
                         input_batch=parts["input_batch"], pipeline=self.pipeline,
                         runtime=parts["runtime"], margin=0)
        parts["margin"] = int(rest * c["margin"])
        return parts

    def total(self, batch_size: int) -> int:
        """``Estimate.total`` at ``batch_size``, without building the table."""
        p = self._parts(batch_size)
        return model_sum(weights=self.weights, optimizer_slots=self.slots,
                         step_peak=p["gradients"] + p["activations"],
                         allocator=p["allocator"], input_batch=p["input_batch"],
                         pipeline=self.pipeline, runtime=p["runtime"],
                         margin=p["margin"]) + self.baseline

    def held_model_bytes(self, batch_size: int) -> int:
        """``model_bytes`` held non-decreasing in the batch size: the largest prediction
        at ``batch_size`` of the plays at the powers of two up to it, each breadth first
        (:data:`~memfit.estimate.schedule.BREADTH_FIRST`: every ready op side by side,
        more at once than TensorFlow's own order, which the point plays; its threads do
        not always keep to that order, and the high end must hold the runs that hold
        more: docs/estimate.md, "The play"), each play's op order and glibc's split kept,
        every buffer sized at ``batch_size``. Under one play every buffer grows with the
        batch; a larger batch adds plays: so the value never falls as the batch grows,
        where the play of each batch size alone can (its op order and which buffers glibc
        maps change with the batch).

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
                self._held[key] = predict_from_features(
                    self.features(batch_size, g, BREADTH_FIRST), self.constants)
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
        return largest_batch(self.high, parse_budget(budget))

    def at(self, batch_size: int, *, budget: int | str | None = None) -> Estimate:
        """The :class:`Estimate` at ``batch_size`` (and the largest batch for ``budget``)."""
        check_batch_size(batch_size)
        budget_bytes = None if budget is None else parse_budget(budget)
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
                     model_bytes_high=self.high(batch_size) - self.baseline,
                     assumptions=self.setup.assumed)
        if budget_bytes is None:
            return e
        best = self.max_batch_size(budget_bytes)
        return dataclasses.replace(e, budget=budget_bytes, max_batch_size=best,
                                   advice=tuple(advice(self, e, budget_bytes, best)))


def estimator_for(model: Any, *, allocator: str = "default", onednn: bool | None = None,
                  **kwargs: Any) -> Estimator | XlaEstimator:
    """The estimator for the backend Keras runs on: :class:`Estimator` (a traced
    TensorFlow graph) on TensorFlow, :class:`~memfit.estimate.xla.XlaEstimator` (XLA's
    buffer assignment of the compiled step) on JAX; the same contract.

    Example:
        >>> type(estimator_for("mymodels:make_mlp")).__name__          # doctest: +SKIP
        'Estimator'

    Args:
        model: what :class:`Estimator` takes.
        allocator: glibc's policy (TensorFlow's estimator only; XLA's buffers do not
            depend on it).
        onednn: oneDNN's kernels (TensorFlow's estimator only).
        **kwargs: ``optimizer``, ``dtype_policy``, ``input_shape``, ``dataset_budget``,
            ``device``.
    """
    backend = keras_backend()
    if backend not in ("tensorflow", "jax"):
        # before Keras is imported: a missing torch was a 59-line traceback
        raise EstimateError(f"memfit estimates training memory on Keras's TensorFlow or JAX "
                            f"backend, and Keras is set to run on {backend} here: set "
                            f"KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax. Received: "
                            f"KERAS_BACKEND={backend}")
    if backend == "jax":
        with input_errors():
            check_allocator(allocator)
        if allocator != "default":
            # glibc's policy moves the TensorFlow estimate's host memory; XLA's buffer
            # assignment does not depend on it (a stranger's --allocator fixed was ignored)
            raise EstimateError(f"allocator={allocator!r} applies to the estimate on "
                                f"TensorFlow (glibc's policy for its host memory); on JAX the "
                                f"estimate is XLA's buffer assignment, which no allocator "
                                f"policy moves: leave it out. Received: allocator="
                                f"{allocator!r}")
        return XlaEstimator(model, **kwargs)
    return Estimator(model, allocator=allocator, onednn=onednn, **kwargs)


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
        >>> e = memfit.estimate_memory(model, 256, optimizer="adam",   # doctest: +SKIP
        ...                            budget="1GiB")
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
            a Keras optimizer, or ``None`` (the optimizer a live or ``module:function`` model is
            compiled with, else Adam; a ``.keras`` file is loaded without it).
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
    if budget is not None:              # bad input refused before the model is built
        parse_budget(budget)
    est = estimator_for(model, optimizer=optimizer, dtype_policy=dtype_policy,
                        input_shape=input_shape, dataset_budget=dataset_budget, device=device,
                        allocator=allocator, onednn=onednn)
    if est.baseline_source == "default":        # nothing cached: measured, once per machine
        est.baseline, est.baseline_source = ensure_calibration(est.device)
    return est.at(batch_size, budget=budget)
