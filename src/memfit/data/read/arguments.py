"""The arguments every reader's ``memfit.dataset`` takes, checked the same way for
TFRecord shards and ``.npy`` arrays (with :mod:`memfit.checks`: errors quote the value).

Example:
    >>> check_features(("x", "y"), {"x": 1, "y": 2, "id": 3}, "data/train")
    ('x', 'y')
    >>> check_shard((1, 4))
    (1, 4)
    >>> check_seed(-1)
    Traceback (most recent call last):
    ...
    ValueError: seed must be an integer >= 0, such as 3. Received: seed=-1
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memfit import checks

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["check_arguments", "check_features", "check_seed", "check_shard"]


def check_arguments(*, batch_size: Any, on_corrupt: Any, epoch: Any,
                    epochs: Any) -> tuple[int, int, int | None]:
    """The argument checks every reader's ``dataset()`` starts with.

    Returns:
        ``(batch_size, epoch, epochs)`` as plain ``int`` (``epochs`` may be ``None``).
    """
    batch_size = checks.count("batch_size", batch_size, example=32)
    checks.choice("on_corrupt", on_corrupt, ("raise", "skip"))
    epoch = checks.count("epoch", epoch, minimum=0)
    epochs = checks.count("epochs", epochs, minimum=epoch + 1, optional=True,
                          hint=f"It ends the epoch range that starts at epoch={epoch}.")
    return batch_size, epoch, epochs


def check_features(features: Any, names: Any, where: Any) -> tuple[str, ...] | None:
    """``features`` as a tuple (``None`` stays ``None``), each one of ``names``, once."""
    if features is None:
        return None
    features = (features,) if isinstance(features, str) else tuple(features)
    if not features:
        raise ValueError(f"features names no feature: give one or more of {sorted(names)}, or "
                         f"features=None for all of them. Received: features={features!r}")
    unknown = [f for f in features if f not in names]
    if unknown:
        raise ValueError(f"No feature {unknown[0]!r} in {where}; it has "
                         f"{sorted(names)}. Received: features={features}")
    if len(set(features)) != len(features):
        raise ValueError(f"features names a feature twice. Received: features={features}")
    return features


def check_seed(seed: Any) -> int:
    """The order's seed: an integer >= 0."""
    return checks.count("seed", seed, minimum=0)


def check_shard(shard: Any, input_context: tf.distribute.InputContext | None = None
                ) -> tuple[int, int] | None:
    """The ``(index, count)`` share of one worker of several (``None``: all of it);
    ``input_context`` (from ``strategy.distribute_datasets_from_function``) sets it."""
    if input_context is not None:
        shard = (input_context.input_pipeline_id, input_context.num_input_pipelines)
    if shard is None:
        return None
    try:
        index, count = shard
        count = checks.count("count", count)
        index = checks.count("index", index, minimum=0)
    except (TypeError, ValueError):
        index = count = 0
    if index < count:
        return index, count
    raise ValueError(f"shard must be (index, count) with 0 <= index < count. "
                     f"Received: shard={shard!r}")
