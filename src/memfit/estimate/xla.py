"""The estimate on Keras's JAX backend: XLA's own buffer assignment of the training step.

On JAX, Keras compiles the whole training step (forward, backward, optimizer update) into
one XLA program, ``jax.jit(model.train_step, donate_argnums=0)``. Compiling it for a batch
shape gives XLA's memory analysis of that program, without running it:

* **arguments**: the training state (weights, optimizer slots, metric variables) and the
  batch, the buffers the program reads;
* **outputs**: the new state and the logs; the state's outputs reuse the donated state's
  buffers (**aliased**), so only the rest is new;
* **temporaries**: every buffer XLA assigned inside the step, activations kept for the
  backward pass, gradients and library workspaces (cuBLAS, cuDNN) included;
* XLA's own **peak**: the largest total its heap simulation of the buffers' live ranges
  reached.

On a GPU this is the memory the device's allocator hands out for the step
(``device.memory_stats()["peak_bytes_in_use"]``), which is what ``memfit share`` caps with
``XLA_PYTHON_CLIENT_MEM_FRACTION``. On the CPU the process also holds JAX's runtime and the
compiler's memory (host RSS), which no buffer assignment shows: that part is fitted on
the family panel, per HLO instruction of the compiled step and a constant
(:data:`XLA_CPU_FIT`; docs/estimate.md, "On JAX", has its figures out of family).

:class:`XlaEstimator` gives the same contract as the TensorFlow estimator
(:class:`memfit.estimate.estimator.Estimator`): ``total``, ``low``/``high`` (a range),
``max_batch_size(budget)`` and ``at(batch, budget=...)`` returning an
:class:`~memfit.estimate.memory_estimate.Estimate` with its verdict.

Example:
    >>> import os; os.environ.get("KERAS_BACKEND") == "jax"          # doctest: +SKIP
    True
    >>> est = XlaEstimator("mymodels:make_mlp", optimizer="adam")     # doctest: +SKIP
    >>> est.step(256).temporaries                                     # doctest: +SKIP
    18882628
    >>> print(est.at(256, budget="2GiB"))                              # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from memfit.errors import cause
from memfit.estimate.advice import INSIDE_RANGE, UNSURE_OF_ONE
from memfit.estimate.band import largest_batch
from memfit.estimate.baseline import check_device, framework_baseline
from memfit.estimate.layers import param_bytes, param_count
from memfit.estimate.memory_estimate import Estimate
from memfit.estimate.model import EstimateError, check_batch_size, check_policy, check_source
from memfit.estimate.optimizers import check_optimizer, name_of
from memfit.estimate.training import Setup, batch_bytes, prepare
from memfit.frameworks import KERAS_EXTRA, require
from memfit.memory.probe import jax_device_memory
from memfit.quiet import filtered_stderr, quieted
from memfit.sizes import format_size, parse_budget, parse_size

__all__ = ["XlaStep", "XlaEstimator", "XLA_BANDS", "XLA_CPU_FIT", "compile_train_step",
           "compile_step", "training_state", "device_peak", "build_optimizer"]

#: The range around the point, per platform: the point's part that is not exact times
#: ``low``/``high``. On the CPU, the extremes of measured ÷ predicted on that part over the
#: family panel (``benchmarks/estimate_jax_families.py``, chosen on all 11 families; the
#: k-fold figures are in docs/estimate.md, "On JAX"). On a GPU not fitted: set before the
#: first GPU run, which found it too narrow for 2-D convolutions (docs/gpu.md).
XLA_BANDS: dict[str, dict[str, float]] = {
    "gpu": {"low": 0.9, "high": 1.15},
    "cpu": {"low": 0.599, "high": 1.633},
}

#: The host's memory on the CPU beyond the exact bytes: XLA's temporaries and new outputs
#: times ``temp``, plus the compiler's memory, ``hlo`` bytes per HLO instruction of the
#: compiled step (what compiling it takes and glibc keeps), plus a constant ``one`` (the
#: runtime a first compiled program starts). Fitted on the family panel on JAX's CPU
#: backend (68 cases, non-negative least squares on relative error): in panel, not a
#: result; out of family (k-fold) it is 16.9 % off on average (docs/estimate.md).
XLA_CPU_FIT: dict[str, float] = {"temp": 1.2129, "hlo": 35496.0, "one": 92861795.0}


@dataclasses.dataclass(frozen=True)
class XlaStep:
    """XLA's memory analysis of one compiled training step (bytes).

    Attributes:
        batch_size: the batch it was compiled for.
        arguments: buffers the step reads: the training state and the batch.
        outputs: buffers it writes: the new state and the logs.
        aliased: outputs that reuse a donated argument's buffer (the state).
        temporaries: buffers XLA assigned inside the step.
        code: generated code held on the device (0 where it lives on the host).
        xla_peak: XLA's own peak of its heap simulation (``None`` where not reported).
        platform: ``"gpu"`` or ``"cpu"`` (the device it was compiled for).
        instructions: HLO instructions of the optimised program (the compiler's work).
    """

    batch_size: int
    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    code: int
    xla_peak: int | None
    platform: str
    instructions: int = 0

    @property
    def new_outputs(self) -> int:
        """Outputs that need buffers of their own (not the donated state's)."""
        return max(0, self.outputs - self.aliased)

    @property
    def total(self) -> int:
        """Everything assigned at once, the upper bound of the step: arguments, new
        outputs, temporaries and code (XLA's peak can be lower: not every temporary is
        alive with every argument)."""
        return self.arguments + self.new_outputs + self.temporaries + self.code

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "new_outputs": self.new_outputs,
                "total": self.total}


def device_peak() -> int | None:
    """The device allocator's peak bytes in use in this process (the highest of JAX's
    devices, read by the one probe: :func:`memfit.memory.probe.jax_device_memory`),
    ``None`` where none keeps statistics (the CPU)."""
    info = jax_device_memory()
    return max(v["peak"] for v in info.values()) if info else None


def build_optimizer(model: Any) -> None:
    """Builds the optimizer's variables (its slots) where Keras has not yet (it builds them
    on the first step otherwise): the compiled step takes them as state."""
    opt = model.optimizer
    if getattr(opt, "built", False):
        return
    try:
        opt.build(model.trainable_variables)
    except Exception as e:     # noqa: BLE001
        raise EstimateError(f"Cannot build the optimizer's variables "
                            f"({cause(e)}).") from None


def _abstract(value: Any) -> Any:
    import jax

    return jax.ShapeDtypeStruct(value.shape, value.dtype)


def training_state(model: Any) -> tuple:
    """The training state Keras's JAX trainer passes to ``train_step``: trainable,
    non-trainable, optimizer and metric variables, as arrays (public attributes only)."""
    return ([v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            [v.value for v in model.optimizer.variables],
            [v.value for v in model.metrics_variables])


def compile_train_step(setup: Setup, batch_size: int) -> XlaStep:
    """XLA's memory analysis of ``setup.model``'s training step at ``batch_size``:
    :func:`compile_step`'s first half.

    Example:
        >>> setup = prepare("mymodels:make_mlp", optimizer="adam")    # doctest: +SKIP
        >>> compile_train_step(setup, 64).total > 0                    # doctest: +SKIP
        True
    """
    return compile_step(setup, batch_size)[0]


def compile_step(setup: Setup, batch_size: int) -> tuple[XlaStep, Any]:
    """Compiles ``setup.model``'s training step for ``batch_size``: XLA's memory analysis
    of it, and the compiled program (it takes ``(state, (x, y, None))`` as Keras's JAX
    trainer passes them, the state donated); nothing runs, no batch is allocated.

    Example:
        >>> setup = prepare("mymodels:make_mlp", optimizer="adam")    # doctest: +SKIP
        >>> step, program = compile_step(setup, 64)                    # doctest: +SKIP

    Args:
        setup: the model compiled for training (:func:`~memfit.estimate.training.prepare`);
            its optimizer's variables are built here where they are not yet.
        batch_size: samples per step.
    """
    import jax

    model = setup.model
    build_optimizer(model)
    state = jax.tree_util.tree_map(_abstract, training_state(model))

    def spec(shape: tuple[int, ...], dtype: str) -> Any:
        return jax.ShapeDtypeStruct((batch_size, *shape), dtype)

    data = (*setup.batch([spec(s, d) for s, d in setup.inputs],
                         [spec(s, d) for s, d in setup.targets]), None)
    try:
        compiled = jax.jit(model.train_step, donate_argnums=0).lower(state, data).compile()
    except Exception as e:     # noqa: BLE001
        raise EstimateError(f"Cannot compile a training step of the model with XLA "
                            f"({cause(e)}).") from None
    ma = compiled.memory_analysis()
    if ma is None:
        raise EstimateError("XLA gave no memory analysis for the training step on this "
                            "platform: the JAX estimate needs it (a CPU or GPU backend).")
    peak = getattr(ma, "peak_memory_in_bytes", None)
    platform = jax.devices()[0].platform
    on_gpu = platform in ("gpu", "cuda", "rocm")
    return XlaStep(batch_size=batch_size, arguments=int(ma.argument_size_in_bytes),
                   outputs=int(ma.output_size_in_bytes), aliased=int(ma.alias_size_in_bytes),
                   temporaries=int(ma.temp_size_in_bytes),
                   code=int(ma.generated_code_size_in_bytes) if on_gpu else 0,
                   xla_peak=int(peak) if peak else None,
                   platform="gpu" if on_gpu else "cpu",
                   instructions=sum(" = " in line
                                    for line in compiled.as_text().splitlines())), compiled


class XlaEstimator:
    """A Keras model on the JAX backend, prepared once, to estimate at any batch size.

    The same contract as :class:`~memfit.estimate.estimator.Estimator`: :meth:`total`,
    :meth:`low`, :meth:`high`, :meth:`max_batch_size` and :meth:`at`.

    Example:
        >>> est = XlaEstimator("mymodels:make_cnn", device="gpu:0")    # doctest: +SKIP
        >>> est.max_batch_size("16GiB")                                 # doctest: +SKIP

    Args:
        model: a ``keras.Model``, a ``.keras`` path, or ``module:function``.
        optimizer: an optimizer name, a Keras optimizer, or ``None`` (the model's, else
            Adam).
        dtype_policy: a Keras dtype policy name, or ``None`` for the model's own.
        input_shape: input shape(s) without the batch dimension, where the model does not
            know them.
        dataset_budget: input pipeline bytes to count (host memory: on a GPU they are
            not on the device and are left out).
        device: ``"cpu"`` or ``"gpu:N"``: whose baseline to add; the step is compiled for
            the platform JAX runs on in this process.
    """

    def __init__(self, model: Any, *, optimizer: Any = None, dtype_policy: str | None = None,
                 input_shape: Any = None, dataset_budget: int | str | None = None,
                 device: str = "cpu"):
        require("jax", "the estimate on Keras's JAX backend", KERAS_EXTRA)
        if isinstance(model, str | os.PathLike):
            check_source(model)         # a model not found is said before JAX loads
        check_policy(dtype_policy)
        if isinstance(optimizer, str):
            check_optimizer(optimizer)
        self.device = check_device(device)
        self.pipeline = 0 if dataset_budget is None else parse_size(dataset_budget,
                                                                     name="dataset_budget")
        with quieted(), filtered_stderr():      # JAX's "Unable to initialize backend" lines
            self.setup: Setup = prepare(model, dtype_policy=dtype_policy,
                                        optimizer=optimizer, input_shape=input_shape)
            build_optimizer(self.setup.model)
        m = self.setup.model
        self.weights = param_bytes(m.weights)
        self.slots = param_bytes(list(m.optimizer.variables))
        self.per_sample_input = batch_bytes(self.setup.inputs) + batch_bytes(self.setup.targets)
        self._steps: dict[int, XlaStep] = {}
        self._programs: dict[int, Any] = {}
        self._compile_peaks: dict[int, int] = {}
        self.baseline, self.baseline_source = framework_baseline(self.device)
        import jax

        runs_on = jax.devices()[0].platform
        if self.device.startswith("gpu") and runs_on != "gpu":
            # the step compiles for the platform JAX runs on: a stranger's --device gpu:0
            # on a CPU machine printed the CPU's figures under gpu:0, and find-batch-size
            # a CPU batch size as the GPU's
            raise EstimateError(
                f"device={self.device!r}, but JAX runs on the {runs_on} here (it sees no "
                f"GPU): the estimate on JAX compiles the training step for the device JAX "
                f"runs on, so it would be the {runs_on}'s. Run it on the machine with the "
                f"GPU, or give device='cpu'.")
        self.platform = self.step(1).platform
        self.band = XLA_BANDS[self.platform]
        if self.platform == "gpu":
            self.pipeline = 0        # host memory; the device holds none of it

    #: Searches for the largest batch aim along a line (each size tried is a compile).
    interpolate = True

    def step(self, batch_size: int) -> XlaStep:
        """XLA's analysis of the step at ``batch_size`` (compiled once per size)."""
        if batch_size not in self._steps:
            before = device_peak()
            with quieted(), filtered_stderr():
                self._steps[batch_size], program = compile_step(self.setup, batch_size)
            self._programs[batch_size] = program
            after = device_peak()
            if after is not None and after > (before or 0):
                self._compile_peaks[batch_size] = after
        return self._steps[batch_size]

    def compile_peak(self, batch_size: int) -> int | None:
        """On a GPU: the device allocator's peak in this process as the step for
        ``batch_size`` was compiled, where compiling it raised the peak (the state is
        allocated already; what compiling adds is the autotuner's scratch, which the
        step's buffer assignment does not count); ``None`` elsewhere, or where an
        earlier moment of this process peaked higher."""
        self.step(batch_size)
        return self._compile_peaks.get(batch_size)

    def program(self, batch_size: int) -> Any:
        """The compiled training step at ``batch_size`` whose memory :meth:`step`
        analysed: ``program(state, (x, y, None))`` returns ``(logs, state)``; the state
        (:func:`training_state`) is donated. Running it is running exactly what was
        estimated (``benchmarks/gpu_check.py`` measures the device's peak so)."""
        self.step(batch_size)
        return self._programs[batch_size]

    def exact(self, batch_size: int) -> int:
        """Bytes known exactly: the state (weights, slots), the batch and the pipeline."""
        return self.weights + self.slots + self.per_sample_input * batch_size + self.pipeline

    def model_bytes(self, batch_size: int) -> int:
        """The point. On a GPU: XLA's total for the step (:attr:`XlaStep.total`), the
        state counted from the model where XLA's arguments hold less (never below
        :meth:`exact`), at least the device's peak while compiling it
        (:meth:`compile_peak`). On the CPU (host memory): the exact bytes, XLA's
        temporaries and new outputs, and the compiler and runtime, with the constants of
        :data:`XLA_CPU_FIT`. Both + the pipeline."""
        s = self.step(batch_size)
        if s.platform == "cpu":
            c = XLA_CPU_FIT
            return self.exact(batch_size) + int(c["temp"] * (s.temporaries + s.new_outputs)
                                                + c["hlo"] * s.instructions + c["one"])
        return max(s.total, self.exact(batch_size) - self.pipeline,
                   self.compile_peak(batch_size) or 0) + self.pipeline

    def total(self, batch_size: int) -> int:
        return self.model_bytes(batch_size) + self.baseline

    def _banded(self, batch_size: int, factor: float) -> int:
        exact = self.exact(batch_size)
        rest = max(0, self.model_bytes(batch_size) - exact)
        return exact + int(rest * factor) + self.baseline

    def low(self, batch_size: int) -> int:
        return self._banded(batch_size, self.band["low"])

    def high(self, batch_size: int) -> int:
        return self._banded(batch_size, self.band["high"])

    def max_batch_size(self, budget: int | str) -> int:
        """The largest batch size whose high end fits ``budget`` (0: not even 1 does), by
        interpolation (:func:`~memfit.estimate.band.largest_batch` with
        :attr:`interpolate`): one compile of the step per batch size tried, about 4 where
        the step grows along a line with the batch, where doubling and bisection took
        about twice log2 of the answer (48 compiles for a tiny model's 12 million)."""
        return largest_batch(self.high, parse_budget(budget),
                             interpolate=self.interpolate)

    def at(self, batch_size: int, *, budget: int | str | None = None) -> Estimate:
        """The :class:`Estimate` at ``batch_size`` (and the largest batch for ``budget``)."""
        check_batch_size(batch_size)
        budget_bytes = None if budget is None else parse_budget(budget)
        s = self.step(batch_size)
        m = self.setup.model
        input_batch = self.per_sample_input * batch_size
        state_and_batch = self.weights + self.slots + input_batch
        # What XLA's arguments hold beyond the state and the batch (metric variables,
        # the seed generator's state) and its new outputs (the logs).
        runtime = max(0, s.arguments - state_and_batch) + s.new_outputs + s.code
        e = Estimate(model_name=m.name, batch_size=batch_size, dtype_policy=self.setup.policy,
                     optimizer=name_of(self.setup.optimizer), device=self.device, layers=(),
                     weights=self.weights, optimizer_slots=self.slots, gradients=0,
                     activations=s.temporaries, allocator=0, input_batch=input_batch,
                     pipeline=self.pipeline, runtime=runtime,
                     margin=max(0, self.model_bytes(batch_size) - self.pipeline
                                - state_and_batch - s.temporaries - runtime),
                     allocator_policy="default", kernels=f"xla-{self.platform}",
                     baseline=self.baseline, baseline_source=self.baseline_source,
                     peak_op="XLA's buffer assignment (one compiled program)",
                     params_trainable=param_count(m.trainable_weights),
                     params_non_trainable=param_count(m.non_trainable_weights),
                     model_bytes_low=self.low(batch_size) - self.baseline,
                     model_bytes_high=self.high(batch_size) - self.baseline,
                     assumptions=self.setup.assumed)
        if budget_bytes is None:
            return e
        best = self.max_batch_size(budget_bytes)
        advice: tuple[str, ...] = ()
        if best == 0:
            advice = _nothing_sure(e, self.high(1), budget_bytes)
        elif best < batch_size:
            advice = (f"batch {batch_size} may not fit {format_size(budget_bytes)}: train at "
                      f"batch {best} or below, or find the largest with memfit "
                      f"find-batch-size",)
        return dataclasses.replace(e, budget=budget_bytes, max_batch_size=best,
                                   advice=advice)


def _nothing_sure(e: Estimate, high_of_one: int, budget: int) -> tuple[str, ...]:
    """The advice when not even batch size 1's high end fits ``budget``: what the parts
    that no batch size changes need (on a small model, the framework and XLA's compiler
    and runtime are nearly all of it: a stranger's 251-parameter CNN was told to use mixed
    precision), and whether real steps could still find a batch that fits."""
    if e.baseline >= budget:
        return (f"the framework alone (import jax, keras: {format_size(e.baseline)} on this "
                f"machine) needs more than the budget ({format_size(budget)}): no batch "
                f"size, precision or optimizer fits it; raise the budget",)
    fixed = e.baseline + e.margin + e.runtime + e.weights + e.optimizer_slots + e.pipeline
    out = [f"{UNSURE_OF_ONE} (it needs up to {format_size(high_of_one)}); the framework, "
           f"XLA's compiler and runtime, weights and optimizer state alone need about "
           f"{format_size(fixed)}, of which the model's weights and optimizer state are "
           f"{format_size(e.weights + e.optimizer_slots)}"]
    if e.total_low <= budget:
        out.append(f"{INSIDE_RANGE} ({format_size(e.total_low)} - "
                   f"{format_size(e.total_high)}): memfit find-batch-size measures real steps")
    if e.weights + e.optimizer_slots > fixed // 4:
        out.append("use mixed precision, a lighter optimizer, or a smaller model")
    return tuple(out)
