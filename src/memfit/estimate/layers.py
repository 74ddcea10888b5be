"""The per-layer table: parameters, output size and what each layer keeps for backward.

Rows come from the model's leaf layers (nested models are opened); sizes come from the
traced training step (:mod:`memfit.estimate.graph`), so they are the tensors TensorFlow
really makes under the dtype policy: a ``mixed_float16`` layer's output is float16, its
weights float32.

* ``output_bytes``: bytes per sample of the layer's output (its last forward tensor).
* ``kept_bytes``: bytes per sample of the forward tensors produced in the layer that the
  backward pass reads (a Dense keeps its input's successor, a ReLU its output, a
  Dropout its mask...), i.e. what must stay in memory from the forward to the backward
  pass.

Example:
    >>> rows = layer_rows(setup.model, step)                     # doctest: +SKIP
    >>> rows[0].name, rows[0].params_trainable                   # doctest: +SKIP
    ('dense', 803840)
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from memfit.estimate.graph import StepGraph

__all__ = ["LayerRow", "layer_rows", "param_bytes", "param_count"]


@dataclasses.dataclass(frozen=True)
class LayerRow:
    """One row of the per-layer table (sizes in bytes; ``_bytes`` fields per sample)."""

    name: str
    type: str
    params_trainable: int
    params_non_trainable: int
    weight_bytes: int
    output_bytes: int
    kept_bytes: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _numel(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def param_count(variables: Any) -> int:
    """Elements of a list of Keras variables (the parameter count of their layer or model).

    Example:
        >>> import numpy as np
        >>> param_count([np.zeros((8, 4)), np.zeros(4)])
        36
    """
    return sum(_numel(v.shape) for v in variables)


def param_bytes(variables: Any) -> int:
    """Bytes of a list of Keras variables (each counted once)."""
    seen, total = set(), 0
    for v in variables:
        if id(v) in seen:
            continue
        seen.add(id(v))
        total += _numel(v.shape) * _itemsize(v.dtype)
    return total


def _itemsize(dtype: Any) -> int:
    import numpy as np

    name = getattr(dtype, "name", str(dtype))
    if name == "bfloat16":
        return 2
    return np.dtype(name).itemsize


def leaf_layers(model: Any) -> list[Any]:
    """The model's layers in order, nested models opened (other layers are one row each,
    sub-layers included: a MultiHeadAttention is one row)."""
    import keras

    out, seen = [], set()

    def walk(m: Any) -> None:
        for layer in getattr(m, "layers", []):
            if id(layer) in seen or type(layer).__name__ == "InputLayer":
                continue
            seen.add(id(layer))
            if isinstance(layer, keras.Model):
                walk(layer)
            else:
                out.append(layer)

    walk(model)
    return out


def layer_rows(model: Any, step: StepGraph) -> list[LayerRow]:
    """The per-layer table of a traced model (see the module docstring)."""
    layers = leaf_layers(model)
    names = {layer.name for layer in layers}
    output: dict[str, int] = {}
    kept: dict[str, int] = collections.defaultdict(int)
    kept_by_tensor = step.kept_for_backward()
    for op in step.ops:
        if op.name.startswith("gradient_tape/"):
            continue
        layer = step.layer_of(op.name, names)
        if layer is None:
            continue
        per = sum(p for _, _, p in op.outputs)
        if per and op.type not in ("Shape", "ReadVariableOp"):
            output[layer] = per
        kept[layer] += kept_by_tensor.get(op.name, 0)
    rows = []
    for layer in layers:
        rows.append(LayerRow(name=layer.name, type=type(layer).__name__,
                             params_trainable=param_count(layer.trainable_weights),
                             params_non_trainable=param_count(layer.non_trainable_weights),
                             weight_bytes=param_bytes(layer.weights),
                             output_bytes=output.get(layer.name, 0),
                             kept_bytes=kept.get(layer.name, 0)))
    return rows
