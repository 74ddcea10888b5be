"""A Keras model in a checkpoint's files, and the fingerprint that must match to load it.

:func:`save_model` writes what :class:`~memfit.supervise.checkpoint.CheckpointStore`
asks its ``fill`` for: the weights and the optimizer state (``model.weights.h5``, Keras's
``save_weights``) and, in ``arrays.npz``, what that file leaves out: the seed generators'
states (``variable_N``: ``Dropout``, ``RandomFlip``...) and, for a checkpoint inside an
epoch, the metric states (``metric_N``, see :mod:`memfit.supervise.metrics`).
:func:`load_model` puts them back, after checking that the checkpoint's
:func:`fingerprint` (weight shapes and dtypes, the optimizer and its variables) is the
model's: a checkpoint of another model is refused, never loaded half.

Example:
    >>> saved = {"weights": [[[4, 2], "float32"]], "names": ["dense/kernel"],
    ...          "optimizer": "Adam", "optimizer_variables": 5}
    >>> mismatch(saved, {**saved, "optimizer": "SGD"})
    "the checkpoint's optimizer is Adam, this model's SGD"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from memfit.supervise.checkpoint import ARRAYS_NAME, WEIGHTS_NAME, Checkpoint, CheckpointError

__all__ = ["fingerprint", "mismatch", "extra_variables", "save_model", "load_model",
           "load_arrays"]


def fingerprint(model: Any) -> dict:
    """What must match between a checkpoint and the model it is loaded into."""
    import keras

    return {"backend": keras.backend.backend(),
            "weights": [[list(v.shape), str(v.dtype)] for v in model.weights],
            "names": [v.path for v in model.weights],
            "optimizer": type(model.optimizer).__name__ if model.optimizer else None,
            "optimizer_variables": len(model.optimizer.variables) if model.optimizer else 0}


def mismatch(saved: dict, now: dict) -> str | None:
    """The first difference between two fingerprints, in words, or ``None``."""
    if len(saved["weights"]) != len(now["weights"]):
        return (f"the checkpoint has {len(saved['weights'])} weight tensors, this model "
                f"{len(now['weights'])}")
    for i, (a, b) in enumerate(zip(saved["weights"], now["weights"], strict=True)):
        if a != b:
            return (f"weight {i} ({now['names'][i]!r}) is {tuple(a[0])} {a[1]} in the "
                    f"checkpoint and {tuple(b[0])} {b[1]} in this model")
    if saved["optimizer"] != now["optimizer"]:
        return (f"the checkpoint's optimizer is {saved['optimizer']}, this model's "
                f"{now['optimizer']}")
    if saved["optimizer_variables"] != now["optimizer_variables"]:
        return (f"the checkpoint's optimizer has {saved['optimizer_variables']} variables, "
                f"this model's {now['optimizer_variables']}")
    return None


def extra_variables(model: Any) -> list:
    """Model variables that ``save_weights`` leaves out (seed generator states)."""
    saved = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in saved]


def save_model(directory: Path, model: Any, metrics: list[np.ndarray] | None = None,
               extra: dict[str, np.ndarray] | None = None) -> None:
    """Writes the model's files into a checkpoint's directory.

    Args:
        directory: the checkpoint being written.
        model: the model.
        metrics: the metric states to save (a checkpoint inside an epoch), or ``None``.
        extra: more arrays for ``arrays.npz`` (the callbacks' ``callback.*`` ones).
    """
    model.save_weights(directory / WEIGHTS_NAME)
    arrays = {f"variable_{i}": np.asarray(v.numpy())
              for i, v in enumerate(extra_variables(model))}
    arrays.update({f"metric_{i}": value for i, value in enumerate(metrics or ())})
    arrays.update(extra or {})
    with open(directory / ARRAYS_NAME, "wb") as f:
        np.savez(f, **arrays)


def load_model(ckpt: Checkpoint, model: Any, workdir: Path) -> list[np.ndarray] | None:
    """Loads a checkpoint's weights, optimizer state and seed generators into ``model``.

    Args:
        ckpt: the checkpoint.
        model: the compiled model (its optimizer is built here if it is not yet).
        workdir: the run's workdir, for the message of a refusal.

    Returns:
        The metric states it holds (a checkpoint inside an epoch), or ``None``.

    Raises:
        CheckpointError: the checkpoint is another model's; nothing was loaded.
    """
    optimizer = model.optimizer
    if optimizer is not None and not optimizer.built:
        # Its slots (Adam's moments...) are made at the first step; the checkpoint's
        # values need them now.
        optimizer.build(model.trainable_variables)
    saved = ckpt.contents.fingerprint
    problem = mismatch(dict(saved), fingerprint(model)) if saved else None
    if problem:
        raise CheckpointError(
            f"The workdir {str(workdir)!r} holds checkpoints of another model: {problem}. "
            f"Nothing was overwritten. Use a new --workdir for this model, or remove "
            f"{str(ckpt.path.parent)!r} to start over.")
    model.load_weights(ckpt.weights)
    with np.load(ckpt.arrays) as arrays:
        for i, variable in enumerate(extra_variables(model)):
            key = f"variable_{i}"
            if key in arrays.files and tuple(arrays[key].shape) == tuple(variable.shape):
                variable.assign(arrays[key])
        count = sum(1 for k in arrays.files if k.startswith("metric_"))
        return [arrays[f"metric_{i}"] for i in range(count)] or None


def load_arrays(ckpt: Checkpoint, prefix: str) -> dict[str, np.ndarray]:
    """The arrays of a checkpoint's ``arrays.npz`` whose names start with ``prefix``."""
    with np.load(ckpt.arrays) as arrays:
        return {k: arrays[k] for k in arrays.files if k.startswith(prefix)}
