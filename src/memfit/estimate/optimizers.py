"""Optimizer state: how many copies of the trainable weights each optimizer keeps.

Keras optimizers keep *slots*: per trainable variable, tensors of the same shape and
dtype as the variable (float32 even under ``mixed_float16``, whose variables are
float32). The table below is what memfit assumes before building anything; the
estimator then builds the real optimizer on the model and counts its variables, so a
custom optimizer is counted right too.

| optimizer | slots per weight | what they are |
| --- | --- | --- |
| ``sgd`` | 0 | |
| ``sgd+momentum`` (momentum 0.9) | 1 | momentum |
| ``adam``, ``adamw``, ``nadam``, ``adamax``, ``lamb`` | 2 | first and second moments |
| ``adam+amsgrad`` | 3 | + the running max of the second moment |
| ``rmsprop`` | 1 | mean square |
| ``rmsprop+momentum`` | 2 | + momentum |
| ``adagrad``, ``lion`` | 1 | accumulator / momentum |
| ``adadelta``, ``ftrl`` | 2 | two accumulators |
| ``adafactor`` | < 1 | factored second moments (row and column sums) |

Example:
    >>> slots_per_weight("adam")
    2
    >>> slots_per_weight("sgd+momentum")
    1
"""

from __future__ import annotations

from typing import Any

from memfit.estimate.model import EstimateError

__all__ = ["OPTIMIZERS", "slots_per_weight", "make_optimizer", "check_optimizer"]

# name -> (keras class name, constructor kwargs, full-size slots per trainable weight)
OPTIMIZERS: dict[str, tuple[str, dict, float]] = {
    "sgd": ("SGD", {}, 0),
    "sgd+momentum": ("SGD", {"momentum": 0.9}, 1),
    "adam": ("Adam", {}, 2),
    "adam+amsgrad": ("Adam", {"amsgrad": True}, 3),
    "adamw": ("AdamW", {}, 2),
    "nadam": ("Nadam", {}, 2),
    "adamax": ("Adamax", {}, 2),
    "lamb": ("Lamb", {}, 2),
    "rmsprop": ("RMSprop", {}, 1),
    "rmsprop+momentum": ("RMSprop", {"momentum": 0.9}, 2),
    "adagrad": ("Adagrad", {}, 1),
    "adadelta": ("Adadelta", {}, 2),
    "ftrl": ("Ftrl", {}, 2),
    "lion": ("Lion", {}, 1),
    "adafactor": ("Adafactor", {}, 0.05),
}


def check_optimizer(name: Any) -> str:
    """Normalizes an optimizer name (``"Adam"`` → ``"adam"``); raises for unknown ones.

    Raises:
        EstimateError: quoting the value and listing the known names.
    """
    key = name.strip().lower().replace(" ", "") if isinstance(name, str) else None
    if key not in OPTIMIZERS:
        raise EstimateError(f"Unknown optimizer: use one of {', '.join(OPTIMIZERS)}, or pass "
                            f"a keras.optimizers.Optimizer. Received: optimizer={name!r}")
    return key


def slots_per_weight(optimizer: Any) -> float:
    """Full-size slot tensors per trainable weight for a name or a Keras optimizer.

    For an optimizer object of a known class the table is used with its settings
    (momentum, amsgrad, centered); for other classes, 2 (Adam-like) is assumed until
    the optimizer is built and counted.

    Example:
        >>> slots_per_weight("rmsprop+momentum")
        2
    """
    if isinstance(optimizer, str):
        return OPTIMIZERS[check_optimizer(optimizer)][2]
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    cls = type(inner).__name__
    if cls == "SGD":
        return 1 if getattr(inner, "momentum", 0) else 0
    if cls == "Adam":
        return 3 if getattr(inner, "amsgrad", False) else 2
    if cls == "RMSprop":
        return 1 + bool(getattr(inner, "momentum", 0)) + bool(getattr(inner, "centered", False))
    for _, (klass, kwargs, slots) in OPTIMIZERS.items():
        if klass == cls and not kwargs:
            return slots
    return 2


def make_optimizer(optimizer: Any) -> Any:
    """A fresh Keras optimizer for a name from :data:`OPTIMIZERS`, or ``optimizer`` itself.

    Example:
        >>> make_optimizer("sgd+momentum").momentum
        0.9
    """
    import keras

    if isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer
    klass, kwargs, _ = OPTIMIZERS[check_optimizer(optimizer)]
    return getattr(keras.optimizers, klass)(**kwargs)


def name_of(optimizer: Any) -> str:
    """A table name for an optimizer object (``"adam"``, ``"sgd+momentum"``...)."""
    if isinstance(optimizer, str):
        return check_optimizer(optimizer)
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    cls = type(inner).__name__
    if cls == "SGD" and getattr(inner, "momentum", 0):
        return "sgd+momentum"
    if cls == "RMSprop" and getattr(inner, "momentum", 0):
        return "rmsprop+momentum"
    if cls == "Adam" and getattr(inner, "amsgrad", False):
        return "adam+amsgrad"
    return cls.lower()
