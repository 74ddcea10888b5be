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

**The structure a batch is handed over in**: ``features`` given as a nesting of names.

``memfit.dataset(..., features=("x", "y"))`` yields ``(x, y)`` tuples, as Keras's
``model.fit`` takes them. A model built on a dict of named inputs takes
``({"table": ..., "image": ...}, y)``, and an autoencoder ``(x, x)``: so ``features`` may
also be any nesting of tuples, lists and dicts whose leaves are feature names, and each
batch then has that structure with every name replaced by its feature's batch. The
readers read each feature once (:func:`split_features` gives them the names without
repeats) and :func:`restructured` puts their batches in place: a ``tf.data`` map of
the batches' references (no copy), or the same on a Keras feed.

Example:
    >>> split_features(({"table": "table", "image": "image"}, "price"))
    (('table', 'image', 'price'), ({'table': 'table', 'image': 'image'}, 'price'))
    >>> split_features(("x", "y")), split_features(None)
    ((('x', 'y'), None), (None, None))
    >>> split_features(("x", "x"))
    (('x',), ('x', 'x'))
    >>> place(({"a": "x"}, "y", "x"), ("x", "y"), (1, 2))
    ({'a': 1}, 2, 1)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memfit import checks

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["check_arguments", "check_features", "check_seed", "check_shard", "split_features",
           "place", "restructured"]


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

def _names(features: Any) -> list[str]:
    """The leaves of ``features`` in order (a dict's in its own order)."""
    if isinstance(features, str):
        return [features]
    if isinstance(features, Mapping):
        return [n for v in features.values() for n in _names(v)]
    if isinstance(features, Sequence):
        return [n for v in features for n in _names(v)]
    raise ValueError(f"features holds {features!r}, which is not a feature name: give names "
                     f"(strings), a sequence of names such as ('x', 'y'), or a nesting of "
                     f"tuples, lists and dicts of names such as "
                     f"({{'image': 'image', 'table': 'table'}}, 'label').")


def split_features(features: Any) -> tuple[Any, Any]:
    """``(names, structure)``: the features the readers read, and the structure to hand
    them over in (``None`` where the readers' own tuples or dicts are it).

    ``None``, one name, or a flat sequence of distinct names go to the readers as they
    are; a nesting (a dict anywhere, a sequence inside a sequence) or a name given twice
    goes as its distinct names, in order of first appearance.

    Args:
        features: what :func:`memfit.dataset` was given.
    """
    if features is None or isinstance(features, str):
        return features, None
    flat = all(isinstance(f, str) for f in features) and not isinstance(features, Mapping)
    names = _names(features)
    if flat and len(set(names)) == len(names):
        return features, None
    if not names:
        return features, None               # the readers say that no feature is named
    return tuple(dict.fromkeys(names)), features


def place(structure: Any, names: Sequence[str], values: Sequence[Any]) -> Any:
    """``structure`` with each name replaced by the value at its place in ``names``
    (tuples stay tuples, lists lists, dicts dicts).

    Args:
        structure: the nesting of names (:func:`split_features`).
        names: the names the values were read as.
        values: one batch per name.
    """
    if isinstance(structure, str):
        return values[names.index(structure)]
    if isinstance(structure, Mapping):
        return {k: place(v, names, values) for k, v in structure.items()}
    return type(structure)(place(v, names, values) for v in structure)


def _lists_as_tuples(structure: Any) -> Any:
    if isinstance(structure, str):
        return structure
    if isinstance(structure, Mapping):
        return {k: _lists_as_tuples(v) for k, v in structure.items()}
    return tuple(_lists_as_tuples(v) for v in structure)


def restructured(ds: Any, names: Sequence[str], structure: Any) -> Any:
    """The batches of ``ds`` (read as ``names``: one batch alone, or a tuple) in
    ``structure``; ``ds`` itself where ``structure`` is ``None``. A ``tf.data.Dataset``
    is mapped (its ``memfit_`` attributes kept; a list in ``structure`` is a tuple there,
    since ``tf.data`` stacks a list's tensors into one); a Keras feed
    (:class:`~memfit.data.read.feeds.keras_feed.KerasFeed`) hands its batches over so.

    Args:
        ds: what a reader returned.
        names: the names it read (:func:`split_features`).
        structure: the structure to hand each batch over in.
    """
    if structure is None:
        return ds
    names = tuple(names)
    if hasattr(ds, "hand_over_in"):                   # a Keras feed
        ds.hand_over_in(structure)
        return ds
    from memfit.data.read import translate_errors

    # tf.data would stack the tensors of a list into one: its lists go as tuples.
    structure = _lists_as_tuples(structure)
    out = ds.map(lambda *values: place(structure, names, values))     # in order: one call
    for attribute in ("memfit_plan", "memfit_epoch_counter"):
        if hasattr(ds, attribute):
            setattr(out, attribute, getattr(ds, attribute))
    translate_errors.short_iteration(out)
    return out
