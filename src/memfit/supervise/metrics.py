"""Metric states across a checkpoint taken inside an epoch, per replica under a strategy.

A checkpoint in the middle of an epoch saves the compiled metrics' states (their sums
and counts); the resumed process puts them back at the first skipped step of that
epoch, so that the epoch's logged means cover all its steps, as an uninterrupted run's
do. Under a ``tf.distribute`` strategy a metric's state is a sync-on-read variable with
one copy per replica: each copy is saved and restored, never their sum (assigning a
sum splits it evenly across the replicas, and the next step's rounding would differ
from an uninterrupted run's).

Example:
    >>> scalar_logs({"loss": np.float32(0.5), "note": "text"})
    {'loss': 0.5}
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["read_state", "write_state", "metric_variables", "read_metrics", "metrics_result",
           "restore_metrics", "restore_metrics_in_state", "scalar_logs"]


def _replicas(variable: Any) -> tuple | None:
    """The per-replica copies of a variable that has one per replica (a metric's state
    under a ``tf.distribute`` strategy is a sync-on-read variable), else ``None``."""
    parts = getattr(getattr(variable, "value", variable), "values", None)
    return tuple(parts) if isinstance(parts, tuple | list) and len(parts) > 1 else None


def read_state(variable: Any) -> np.ndarray:
    """A metric variable's state: its value, or its per-replica copies stacked on a new
    first axis."""
    parts = _replicas(variable)
    if parts is None:
        return np.asarray(variable.numpy())
    return np.stack([np.asarray(part.numpy()) for part in parts])


def write_state(variable: Any, value: np.ndarray) -> None:
    """Puts back what :func:`read_state` read."""
    parts = _replicas(variable)
    if parts is None:
        variable.assign(value)
        return
    for part, part_value in zip(parts, value, strict=True):
        part.assign(part_value)


def metric_variables(model: Any) -> list:
    """The state variables of the model's compiled metrics, in a fixed order."""
    return [v for m in model.metrics for v in m.variables]


def read_metrics(model: Any) -> list[np.ndarray]:
    """The states of the model's metrics now (what a checkpoint saves)."""
    return [read_state(v) for v in metric_variables(model)]


def metrics_result(model: Any, values: Sequence[np.ndarray]) -> dict:
    """``model.get_metrics_result()`` for the given metric states (the model's own are
    put back after); ``{}`` when they do not fit the model's metrics."""
    variables = metric_variables(model)
    if len(variables) != len(values):
        return {}
    now = [read_state(v) for v in variables]
    for variable, value in zip(variables, values, strict=True):
        write_state(variable, value)
    try:
        return model.get_metrics_result()
    finally:
        for variable, value in zip(variables, now, strict=True):
            write_state(variable, value)


def restore_metrics(model: Any, saved: Sequence[np.ndarray], batch: Any) -> None:
    """Puts back the metric states a checkpoint holds, at the first skipped step of a
    resumed, half-done epoch (after Keras reset the metrics for it).

    Keras builds its compiled metrics when it first traces a training step; a resume
    whose every step is skipped never traces one, so they are built here from the
    shapes of a real batch (as Keras itself does under a distribution strategy). The
    next trained step then adds to the saved sums and counts exactly as the
    uninterrupted run added to its own. Metrics that differ from the checkpoint's are
    left as they are, with a warning.

    Args:
        model: the model being trained.
        saved: the metric states the checkpoint holds, in :func:`metric_variables` order.
        batch: a batch of the training data (its shapes build the metrics).
    """
    if len(metric_variables(model)) != len(saved):
        try:
            model._symbolic_build(data_batch=batch)     # as fit() does under a strategy
        except Exception as e:  # noqa: BLE001 - reported, training goes on
            print(f"memfit: could not build the metrics to restore them ({e})",
                  file=sys.stderr)
    variables = metric_variables(model)
    if len(saved) != len(variables) or \
            [tuple(v.shape) for v in saved] != [read_state(v).shape for v in variables]:
        print("memfit: the metrics differ from the checkpoint's; this epoch's logged "
              "metrics cover only the steps since the resume", file=sys.stderr)
        return
    for variable, value in zip(variables, saved, strict=True):
        write_state(variable, value)


def restore_metrics_in_state(model: Any, saved: Sequence[np.ndarray], state: tuple) -> tuple:
    """The JAX trainer's step state with the checkpoint's metric states in it.

    On the JAX backend ``fit`` takes the model's variables out into a state tuple
    ``(trainable, non_trainable, optimizer, metrics)`` when an epoch's first step begins
    (the variables themselves are emptied until a callback syncs them back), and each
    step returns the next tuple. A value assigned to a metric variable there would be
    lost: the resumed epoch's metric states go into the tuple instead. The metrics are
    built before ``fit`` calls any callback on this backend. Metrics that differ from the
    checkpoint's are left as they are, with a warning (as :func:`restore_metrics` does).

    Example:
        >>> restore_metrics_in_state(None, [], ([], [], [], []))    # nothing saved
        ([], [], [], [])

    Args:
        model: the model being trained.
        saved: the metric states the checkpoint holds, in :func:`metric_variables` order.
        state: the step state the train function was called with.
    """
    if not saved:
        return state
    import keras

    *others, current = state
    current = list(current)
    if len(current) != len(saved) or \
            [tuple(v.shape) for v in saved] != [tuple(v.shape) for v in current]:
        print("memfit: the metrics differ from the checkpoint's; this epoch's logged "
              "metrics cover only the steps since the resume", file=sys.stderr)
        return state
    values = [keras.ops.convert_to_tensor(value, dtype=now.dtype)
              for value, now in zip(saved, current, strict=True)]
    return (*others, values)


def scalar_logs(logs: dict | None) -> dict[str, float]:
    """The numbers of a Keras ``logs`` dict, as floats (anything else is left out)."""
    out = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(np.asarray(value))
        except (TypeError, ValueError):
            continue
    return out
