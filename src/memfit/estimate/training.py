"""The training step that is estimated and measured: one definition for both sides.

The estimator traces this step; the measuring child (:mod:`memfit.estimate.child`) runs
it. Both get the model from :func:`memfit.estimate.model.load`, compile it with the same
optimizer and loss (mean squared error per output against float32 targets shaped like
the outputs: the loss barely matters for memory), and feed the same batch.

Example:
    >>> setup = prepare("mymodels:make_cnn", optimizer="adam")          # doctest: +SKIP
    >>> x, y = make_batch(setup, 32)                                   # doctest: +SKIP
    >>> setup.model.train_on_batch(x, y)                               # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from memfit.errors import cause
from memfit.estimate.model import (
    EstimateError,
    ensure_built,
    input_specs,
    input_structure,
    is_model_file,
    load,
    packed,
    policy_scope,
    structure_of,
    target_specs,
)
from memfit.estimate.optimizers import make_optimizer

__all__ = ["Setup", "prepare", "make_batch", "batch_bytes", "KERNELS", "kernels_of",
           "onednn_enabled", "loss_assumption"]

DEFAULT_OPTIMIZER = "adam"
#: The kernels a training step runs, for which the estimate's fitted constants and range
#: are kept apart: oneDNN's (TensorFlow's default on x86 CPUs with AVX-512 VNNI and newer:
#: large buffers come from its pool, which keeps what it grew to), for a 32-bit or a 16-bit
#: step (``mixed_float16``, ``mixed_bfloat16``...: float16 convolutions run TensorFlow's
#: kernels, float16 MatMuls multiply float32 copies), or TensorFlow's own
#: (``TF_ENABLE_ONEDNN_OPTS=0``, or a CPU oneDNN is not used on).
KERNELS: tuple[str, ...] = ("onednn-float32", "onednn-16bit", "tensorflow")


def onednn_enabled() -> bool:
    """Whether TensorFlow in this process runs oneDNN's kernels (its choice by CPU, or
    ``TF_ENABLE_ONEDNN_OPTS``); a training process started the same way on the same
    machine does too. When TensorFlow cannot say, the variable decides, and unset counts
    as on (the estimate with oneDNN's constants is the larger).

    Example:
        >>> isinstance(onednn_enabled(), bool)
        True
    """
    try:
        from tensorflow.python.util import _pywrap_util_port as port
        return bool(port.IsMklEnabled())
    except (ImportError, AttributeError):
        return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1").lower() not in ("0", "false")


def kernels_of(policy: str, onednn: bool) -> str:
    """The :data:`KERNELS` entry of a step under a Keras dtype policy.

    Example:
        >>> kernels_of("float32", True), kernels_of("mixed_bfloat16", True)
        ('onednn-float32', 'onednn-16bit')
        >>> kernels_of("mixed_float16", False)
        'tensorflow'

    Args:
        policy: a dtype policy name (``Setup.policy``).
        onednn: whether the training process runs oneDNN's kernels.
    """
    if not onednn:
        return "tensorflow"
    return "onednn-16bit" if "16" in policy else "onednn-float32"


@dataclasses.dataclass
class Setup:
    """A model compiled for training, with the shapes of its batch.

    Attributes:
        model: the compiled Keras model.
        inputs: ``(shape without batch, dtype)`` per input.
        targets: ``(shape without batch, dtype)`` per target.
        policy: the dtype policy name the model was built under.
        optimizer: the optimizer it was compiled with (a Keras object).
        assumed: what the step assumes that the model did not say, in words (the loss:
            :func:`loss_assumption`).
        input_structure: how the model takes its inputs where a flat list would not do
            (a dict of named inputs: :func:`~memfit.estimate.model.structure_of`), else
            ``None``.
        target_structure: the same for its targets (a dict of named outputs).
    """

    model: Any
    inputs: list[tuple[tuple[int, ...], str]]
    targets: list[tuple[tuple[int, ...], str]]
    policy: str
    optimizer: Any
    assumed: tuple[str, ...] = ()
    input_structure: Any = None
    target_structure: Any = None

    def batch(self, xs: list, ys: list) -> tuple[Any, Any]:
        """``(x, y)`` as the model and its loss take them, from tensors listed in the
        order of :attr:`inputs` and :attr:`targets` (a dict for named inputs or outputs,
        one tensor alone, else a list).

        Args:
            xs: one tensor per input.
            ys: one tensor per target.
        """
        return packed(self.input_structure, xs), packed(self.target_structure, ys)


_MSE = ("mse", "mean_squared_error", "MeanSquaredError")


def _loss_name(loss: Any) -> str:
    """A compiled loss in words: its name, or the names of a structure of losses."""
    import keras

    names = []
    for one in keras.tree.flatten(loss):
        name = one if isinstance(one, str) else (
            getattr(one, "name", None) or getattr(one, "__name__", None) or type(one).__name__)
        if name not in names:
            names.append(str(name))
    return ", ".join(names) or "none"


def loss_assumption(loss: str, model: Any, *, from_file: bool = False) -> str:
    """The line that says which loss the step trains with when it is not the model's
    own ("" when it is): a model not compiled, or compiled with another loss.

    Args:
        loss: the loss the step compiles with.
        model: the model as loaded, before the step compiles it.
        from_file: the model was loaded from a ``.keras`` file (which is loaded without
            its compile settings), not built by a function or given live.
    """
    own = getattr(model, "loss", None) if getattr(model, "compiled", False) else None
    why = (("the model has no compiled loss as loaded" + (
        ": a .keras file is loaded without its compile settings" if from_file else ""))
        if own is None else f"in place of the model's compiled loss, {_loss_name(own)}")
    if own is not None and all(n.strip() in _MSE for n in _loss_name(own).split(",")):
        return ""
    return (f"loss {loss} on zero targets shaped like the outputs ({why}: the estimate "
            f"trains every model with {loss}, and has no option for another loss; a "
            f"loss's own memory is about one output-sized tensor per output)")


def prepare(source: Any, *, dtype_policy: str | None = None, optimizer: Any = None,
            input_shape: Any = None, loss: str = "mse") -> Setup:
    """Loads, builds and compiles the model for the training step.

    Args:
        source: what :func:`memfit.estimate.model.load` takes.
        dtype_policy: a Keras dtype policy name, or ``None`` for the model's own.
        optimizer: a name from :data:`memfit.estimate.optimizers.OPTIMIZERS`, a Keras
            optimizer, or ``None``: the optimizer a live or ``module:function`` model is
            compiled with, else Adam (a ``.keras`` file is loaded without it).
        input_shape: input shapes for a model that does not know them.
        loss: the Keras loss to compile with.

    Raises:
        EstimateError: see :func:`memfit.estimate.model.load`.
    """
    model = load(source, dtype_policy, input_shape=input_shape)
    assumed = loss_assumption(loss, model, from_file=is_model_file(source))
    with policy_scope(dtype_policy):
        specs = input_specs(model, input_shape)
        outputs = ensure_built(model, specs)
        if optimizer is None:
            compiled = getattr(model, "optimizer", None)
            optimizer = (getattr(compiled, "inner_optimizer", compiled)
                         if compiled is not None else DEFAULT_OPTIMIZER)
            if not isinstance(optimizer, str):
                optimizer = optimizer.__class__.from_config(optimizer.get_config())
        opt = make_optimizer(optimizer)
        try:
            model.compile(optimizer=opt, loss=loss)
        except Exception as e:      # noqa: BLE001
            raise EstimateError(f"Cannot compile the model for training "
                                f"({cause(e)}).") from None
    policy = getattr(getattr(model, "dtype_policy", None), "name", "float32")
    return Setup(model=model, inputs=specs, targets=target_specs(outputs), policy=policy,
                 optimizer=model.optimizer, assumed=(assumed,) if assumed else (),
                 input_structure=input_structure(model),
                 target_structure=structure_of(outputs))


def make_batch(setup: Setup, batch_size: int) -> tuple[Any, Any]:
    """A batch of ``batch_size`` samples: ``(x, y)``, TensorFlow tensors on Keras's
    TensorFlow backend, NumPy arrays on any other (TensorFlow need not be installed).

    Float inputs are uniform in [0, 1); integer inputs are zeros (valid indices for an
    Embedding); targets are zeros.
    """
    from memfit.frameworks import keras_backend

    if keras_backend() == "tensorflow":
        import tensorflow as tf

        def one(shape: tuple[int, ...], dtype: str, random: bool) -> Any:
            full = (batch_size, *shape)
            if random and dtype.startswith("float"):
                return tf.random.uniform(full, dtype=dtype)
            return tf.zeros(full, dtype=dtype)
    else:
        import numpy as np

        rng = np.random.default_rng(0)

        def one(shape: tuple[int, ...], dtype: str, random: bool) -> Any:
            full = (batch_size, *shape)
            if random and dtype.startswith("float"):
                return rng.random(full, dtype="float32").astype(dtype)
            return np.zeros(full, dtype=dtype)

    return setup.batch([one(s, d, True) for s, d in setup.inputs],
                       [one(s, d, False) for s, d in setup.targets])


def batch_bytes(specs: list[tuple[tuple[int, ...], str]]) -> int:
    """Bytes of one sample of these tensors."""
    import numpy as np

    total = 0
    for shape, dtype in specs:
        n = 1
        for d in shape:
            n *= d
        total += n * np.dtype(dtype if dtype != "bfloat16" else "float16").itemsize
    return total
