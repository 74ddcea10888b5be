"""The common tail of memfit's ``tf.data`` pipelines (the block reader, the TF reader and
the arrays reader), and memfit's own error for a damaged shard through ``tf.data``.

- :func:`finish`: known cardinality, prefetch, no auto-sharding when sharded by hand, the
  plan attached.
- :func:`corrupt_shard_error`: memfit's :class:`~memfit.errors.CorruptShardError` for the
  TensorFlow error a damaged shard becomes inside ``tf.data``; iterating a dataset
  :func:`finish` returns raises it instead of the TensorFlow error.

Example:
    >>> e = corrupt_shard_error(RuntimeError("OOM when allocating tensor"))
    >>> e is None
    True
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memfit.data.plan import Plan
from memfit.errors import CorruptShardError

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["finish", "corrupt_shard_error"]


def finish(ds: tf.data.Dataset, plan: Plan, counter: Any, *, sharded: bool,
           check_cardinality: bool = True) -> tf.data.Dataset:
    """The common tail of memfit's pipelines.

    Args:
        ds: the batches of all the epochs of one pass.
        plan: the plan (``steps_per_epoch``, ``epoch``, ``epochs``, ``prefetch_batches``),
            attached as ``memfit_plan``.
        counter: the epoch counter of :func:`epochs_dataset` (attached as
            ``memfit_epoch_counter``), or ``None``.
        sharded: the caller shards by hand: tf.distribute must not shard again.
        check_cardinality: assert ``steps_per_epoch`` batches per epoch (a known length
            lets Keras show progress and size its epochs without a warning).
    """
    import tensorflow as tf

    if check_cardinality:
        passes = 1 if plan.epochs is None else plan.epochs - plan.epoch
        ds = ds.apply(tf.data.experimental.assert_cardinality(plan.steps_per_epoch * passes))
    ds = ds.prefetch(plan.prefetch_batches)
    if sharded:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.OFF
        ds = ds.with_options(options)
    _raise_memfit_errors(ds)
    ds.memfit_plan = plan
    if counter is not None:
        ds.memfit_epoch_counter = counter
    return ds


# memfit's messages about a damaged shard, as TensorFlow passes them on: a numpy_function's
# exception text ("ShardReadError: memfit: shard FILE ...") or the bracketed items of a
# tf.debugging.Assert ("[memfit: shard] [FILE] [is corrupt or truncated: record] [N] ...").
_MESSAGE = re.compile(r"(?:ShardReadError|CorruptShardError): (memfit: shard [^\n]*)")
_ASSERTED = re.compile(r"\[memfit: shard\] \[(?P<file>[^\]]*)\] \[is corrupt or truncated: "
                       r"record\] \[(?P<record>\d+)\] \[of\] \[(?P<records>\d+)\]")
_FILE = re.compile(r"memfit: shard (\S+) ")
_RECORD = re.compile(r": record (\d+) of")


def corrupt_shard_error(error: BaseException) -> CorruptShardError | None:
    """memfit's own short error for a TensorFlow error that carries memfit's message about
    a damaged shard (``None`` for any other error).

    Inside ``tf.data``, a Python exception becomes a TensorFlow ``InvalidArgumentError``
    with the traceback in its text, and an assertion a bracketed list: this finds the
    shard file and record again.

    Example:
        >>> e = corrupt_shard_error(ValueError("ShardReadError: memfit: shard /d/a.tfrecord "
        ...                                    "is corrupt or truncated: record 3 of 9 ..."))
        >>> e.file, e.record
        ('/d/a.tfrecord', 3)
    """
    text = str(getattr(error, "message", None) or error)
    found = _ASSERTED.search(text)
    if found is not None:
        file, record = found["file"].strip("'\""), int(found["record"])
        message = (f"memfit: shard {file} is corrupt or truncated: record {record} of "
                   f"{found['records']} cannot be read (bad CRC32C or cut short). Run "
                   f"`memfit verify {Path(file).parent}`; pass on_corrupt='skip' to read past "
                   f"damaged shards.")
        return CorruptShardError(message, file, record)
    found = _MESSAGE.search(text)
    if found is None:
        return None
    message = found[1].strip()
    file = _FILE.search(message)
    record = _RECORD.search(message)
    return CorruptShardError(message, file[1] if file else "?",
                             int(record[1]) if record else None)


_CHECKED: dict[type, type] = {}


def _checked(cls: type, methods: tuple[str, ...]) -> type:
    """A subclass of ``cls`` whose ``methods`` raise :class:`CorruptShardError` where the
    TensorFlow error they raise carries memfit's message about a damaged shard."""
    sub = _CHECKED.get(cls)
    if sub is not None:
        return sub

    def checking(name: str) -> Callable[..., Any]:
        base = getattr(cls, name)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return base(self, *args, **kwargs)
            except Exception as e:
                error = corrupt_shard_error(e) if type(e).__module__.startswith(
                    "tensorflow") else None
                if error is None:
                    raise
                raise error from None           # the TF error stays in __context__
        method.__name__ = name
        method.__doc__ = base.__doc__
        return method

    body: dict[str, Any] = {name: checking(name) for name in methods}
    if "__iter__" in methods:
        iterate = body["__iter__"]

        def __iter__(self: Any) -> Any:
            it = iterate(self)
            try:
                it.__class__ = _checked(type(it), ("__next__", "get_next"))
            except TypeError:                   # not a plain Python class: leave it be
                pass
            return it
        body["__iter__"] = __iter__
    sub = type(cls.__name__, (cls,), {**body, "__module__": cls.__module__,
                                      "__qualname__": cls.__qualname__})
    _CHECKED[cls] = sub
    return sub


def _raise_memfit_errors(ds: tf.data.Dataset) -> None:
    """Iterating ``ds`` in Python (``for batch in ds``, ``next(iter(ds))``) raises
    :class:`CorruptShardError` for a damaged shard instead of a long TensorFlow error.

    Inside a ``tf.function`` (``model.fit``) TensorFlow's error is raised as it is; its
    text then starts with memfit's message."""
    try:
        ds.__class__ = _checked(type(ds), ("__iter__",))
    except TypeError:
        pass
