"""The datasets a ``tf.data`` pipeline is built from, read without running it: what the
doctor sizes (its buffers and in-memory tensors) and what a session checks (a
``shuffle`` whose order a restart does not resume).

Example:
    >>> import tensorflow as tf                                     # doctest: +SKIP
    >>> ds = tf.data.Dataset.range(10).shuffle(5).batch(2)          # doctest: +SKIP
    >>> [type(n).__name__ for n in nodes(ds)]                       # doctest: +SKIP
    ['_RangeDataset', '_ShuffleDataset', '_BatchDataset']
    >>> reshuffles(ds)                                              # doctest: +SKIP
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["is_dataset", "inputs", "nodes", "reshuffles", "MAX_NODES"]

MAX_NODES = 1000        # a pipeline is walked this far at most


def is_dataset(value: Any) -> bool:
    """Whether ``value`` is a ``tf.data.Dataset`` (without importing TensorFlow)."""
    return any(c.__name__ == "DatasetV2" and c.__module__.startswith("tensorflow")
               for c in type(value).__mro__)


def inputs(ds: Any) -> Iterator[Any]:
    """The datasets ``ds`` reads from (its attributes that are datasets)."""
    for name, value in vars(ds).items():
        if name in ("_structure", "_graph_attr", "_options_attr", "_variant_tensor_attr"):
            continue
        if is_dataset(value):
            yield value
        elif isinstance(value, list | tuple):
            import tensorflow as tf

            for item in tf.nest.flatten(value):
                if is_dataset(item):
                    yield item


def nodes(ds: Any, *, stop: Any = None) -> list[Any]:
    """The pipeline's datasets, source first (inputs before the transformations on them).

    Args:
        ds: a ``tf.data.Dataset``.
        stop: a predicate: a dataset for which it is true is listed, its inputs are not.
    """
    order, seen, stack = [], set(), [(ds, False)]
    while stack and len(seen) < MAX_NODES:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if stop is None or not stop(node):
            stack.extend((child, False) for child in inputs(node))
    return order


def reshuffles(ds: Any) -> bool:
    """Whether ``ds`` holds a ``shuffle`` that reshuffles each iteration (the default):
    its order then depends on how many epochs this process has read, which a checkpoint
    does not hold. memfit's own datasets (``memfit_plan``) order by ``(seed, epoch)``
    and are not looked into.

    Args:
        ds: a ``tf.data.Dataset``.
    """
    def memfits(node: Any) -> bool:
        return hasattr(node, "memfit_plan")

    for node in nodes(ds, stop=memfits):
        if memfits(node) or "Shuffle" not in type(node).__name__:
            continue
        again = getattr(node, "_reshuffle_each_iteration", True)
        try:
            if bool(again):
                return True
        except (TypeError, ValueError):     # a symbolic tensor: it may, so it does
            return True
    return False
