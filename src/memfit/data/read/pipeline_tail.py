"""The common tail of memfit's ``tf.data`` pipelines (the block reader, the TF reader and
the arrays reader): known cardinality, prefetch, no auto-sharding when sharded by hand,
the plan attached, and memfit's own error for a damaged shard met anywhere the dataset is
read (:mod:`memfit.data.read.translate_errors`); :func:`warn_skipped`, what the readers say
when they skip damage (``on_corrupt="skip"``).

Example:
    >>> import tensorflow as tf
    >>> from memfit.data.read.plan import DatasetPlan
    >>> plan = DatasetPlan(path="d", split="train", batch_size=2, samples=4,
    ...                    steps_per_epoch=2, memory_budget=2**20, estimated_bytes=0,
    ...                    window_records=1, window_samples=2, cycle_length=1,
    ...                    read_threads=1, parallel_windows=1, prefetch_batches=1, seed=0,
    ...                    epoch=0, epochs=1, shuffle=False)
    >>> ds = finish(tf.data.Dataset.range(4).batch(2), plan, None, sharded=False)
    >>> [b.tolist() for b in ds.as_numpy_iterator()], ds.memfit_plan.steps_per_epoch
    ([[0, 1], [2, 3]], 2)
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import TYPE_CHECKING, Any

from memfit.data.read import translate_errors
from memfit.data.read.plan import ReaderPlan

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["finish", "warn_skipped"]

log = logging.getLogger("memfit")


def finish(ds: tf.data.Dataset, plan: ReaderPlan, counter: Any, *, sharded: bool,
           check_cardinality: bool = True) -> tf.data.Dataset:
    """The common tail of memfit's pipelines. A damaged shard met while the result (or a
    dataset made from it) is read raises :class:`~memfit.errors.CorruptShardError`
    (:func:`memfit.data.read.translate_errors.install`).

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
        translate_errors.promise(plan.steps_per_epoch * passes, plan.path)
    ds = ds.prefetch(plan.prefetch_batches)
    if sharded:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.OFF
        ds = ds.with_options(options)
    translate_errors.install()
    translate_errors.short_iteration(ds)
    ds.memfit_plan = plan
    if counter is not None:
        ds.memfit_epoch_counter = counter
    return ds


def warn_skipped(message: str) -> None:
    """Prints memfit's warning about damaged records skipped (the readers print each once),
    and from then on leaves out Keras's "Your input ran out of data; interrupting
    training" warning. An epoch with records skipped has fewer batches than planned, so
    its cardinality is unknown. Keras says so at the end of the first epoch, and then
    trains on all the same.

    Example:
        >>> warn_skipped("memfit: WARNING: skipped 1 unreadable records of shard a.tfrecord")
    """
    warnings.filterwarnings("ignore", message="Your input ran out of data", category=UserWarning)
    print(message, file=sys.stderr, flush=True)
    log.debug("%s", message)
